"""Named scenarios: the cluster, workload and load that `maestro simulate --scenario NAME` and the referee run.

maestro-paper: the Maestro prototype's setting as far as it is known — homogeneous A100-80GB nodes, the five catalog
apps (three interactive, two batch), several models per node, high contention; replayed traces keep their own
contexts. mars-swe: MARS's setting — Qwen3-Coder-30B-A3B alone on an H200, SWE-style coding loops whose tools run on 8
pinned host cores, context-length regimes (short → long) that make KV bind before compute. mixed-class: each app's
class declared from what it is (a conversation a customer waits on: interactive; a software-company run, a group chat,
a batch job: batch), both classes on the same nodes. multi-model: more models than a node's weight budget holds, cold
ones loaded through the residency tiers. Parameters and their sources: serving/README.md, "Scenarios".

`Scenario.prepare` applies a scenario to replayed workflows after their trace models were mapped to cost profiles (the
referee calls it on the training workflows that fix the SLOs and on every replayed workload); it is deterministic per
workflow id, so every arm and every call sees the same workload.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from serving.core.residency import GiB, ResidencyConfig
from serving.sim.costmodel import GB, GPU_PROFILES, MODEL_PROFILES, CostModelConfig
from serving.sim.engine import ClusterConfig
from serving.sim.workload import SimWorkflow, add_context

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of the GPU's memory it may use
ACTIVATION_BYTES = 4 * GB  # activations and CUDA graphs vLLM's profiling run keeps out of the KV pool (assumed)
MARS_MODEL = "qwen3-coder-30b-a3b"
MIXED_MODEL = "qwen2.5-coder-32b"
CONTEXT_SALT = 17  # the seed of the regimes' context draws, with each workflow's id


@dataclass(frozen=True)
class Regime:
    name: str
    context_tokens: float = 0.0  # added to the first prompt of each session
    tool_result_tokens: float = 0.0  # added per tool round


@dataclass
class Scenario:
    name: str
    cluster: ClusterConfig
    apps: dict[str, float] | None
    workflows_per_node: int
    rate_per_node_s: float
    regimes: tuple[Regime, ...] = (Regime("default"),)
    model_override: str | None = None
    default_policies: tuple[str, ...] = field(default=("fcfs", "edf", "srtf", "maestro"))
    regime: Regime | None = None  # the regime `prepare` applies (the referee's `--regime`)
    referee_arms: tuple[str, ...] = ()  # the scenario's extra baselines in the referee (system names)
    is_class_by_app: bool = False  # mixed-class: each workflow's class from its app (`app_is_interactive`)
    is_model_per_app: bool = False  # multi-model: each (app, trace model) its own model (`model_per_app`)

    def prepare(self, workflows: list[SimWorkflow]) -> None:
        """Apply the scenario in place to freshly built workflows whose models are cost profiles (once per list):
        the one model, the per-app models, the classes, the regime's context growth."""
        stages = [s for w in workflows for s in w.stages]
        if self.model_override:
            for stage in stages:
                stage.model = self.model_override
        if self.is_model_per_app:
            model_per_app(workflows, self.cluster.cost)
        if self.is_class_by_app:
            for workflow in workflows:
                workflow.interactive = app_is_interactive(workflow)
        regime = self.regime
        if regime is not None and (regime.context_tokens or regime.tool_result_tokens):
            add_context(workflows, regime.context_tokens, regime.tool_result_tokens, CONTEXT_SALT)


def kv_pool_bytes(gpu: str, weights: tuple[str, ...]) -> int:
    """What vLLM leaves for KV: its share of the GPU's memory, less the weights and the activations' reserve."""
    free = GPU_MEMORY_UTILIZATION * GPU_PROFILES[gpu].hbm_bytes - ACTIVATION_BYTES
    return int(free - sum(MODEL_PROFILES[m].weight_bytes for m in weights))


def maestro_paper(num_nodes: int, gpu: str = "a100-80gb") -> Scenario:
    placement = [
        ("llama-3-8b", "qwen2-7b"),
        ("llama-3-8b", "mistral-7b"),
        ("qwen2.5-coder-32b",),
        ("qwen2-72b",),
        ("llama-3-8b", "mistral-7b"),
        ("qwen2.5-coder-32b",),
        ("llama-3-8b", "qwen2-7b"),
        ("qwen2-72b",),
    ]
    cluster = ClusterConfig(
        num_nodes=num_nodes,
        cost=CostModelConfig(gpu=gpu),
        kv_pool_bytes=30 * GiB,
        residency=ResidencyConfig(gpu_weight_budget_bytes=40 * GiB),
        placement=placement,
        num_tool_workers=8,
        abandon_after_slo_x=3.0,
    )
    return Scenario("maestro-paper", cluster, None, workflows_per_node=300, rate_per_node_s=1.5)


MARS_REGIMES = (Regime("short", 2000, 300), Regime("medium", 12000, 1000), Regime("long", 40000, 2500))
MARS_BASELINES = ("keep-always", "evict-always", "continuum", "infercept", "mars")


def mars_swe(num_nodes: int, gpu: str = "h200") -> Scenario:
    cluster = ClusterConfig(
        num_nodes=num_nodes,
        cost=CostModelConfig(gpu=gpu),
        kv_pool_bytes=kv_pool_bytes(gpu, (MARS_MODEL,)),
        residency=ResidencyConfig(gpu_weight_budget_bytes=64 * GiB),
        placement=[(MARS_MODEL,)],
        num_tool_workers=8,
        abandon_after_slo_x=3.0,
    )
    return Scenario(
        "mars-swe",
        cluster,
        {"swe_coding": 1.0},
        workflows_per_node=200,
        rate_per_node_s=0.2,
        regimes=MARS_REGIMES,
        model_override=MARS_MODEL,
        default_policies=("continuum", "continuum-dy", "infercept", "keep-always", "evict-always", "mars"),
        regime=MARS_REGIMES[-1],
        referee_arms=MARS_BASELINES,
    )


# A conversation someone waits on turn by turn is interactive: tau2's retail and telecom customers, the patient of the
# medical triage. Without a user in the loop (telecom-solo), a software-company run (ChatDev), a group chat (AutoGen)
# or a batch job: batch. An app not named here keeps its trace's own `interactive` flag.
INTERACTIVE_APPS = frozenset({"tau2_retail", "tau2_telecom", "tau2_medical_triage"})
BATCH_APPS = frozenset({"tau2_telecom_solo", "chatdev_warehouse", "autogen_notebooks"})


def app_is_interactive(workflow: SimWorkflow) -> bool:
    if workflow.app in INTERACTIVE_APPS:
        return True
    if workflow.app in BATCH_APPS:
        return False
    return bool((workflow.stages[0].source or {}).get("interactive")) if workflow.stages else workflow.interactive


def mixed_class(num_nodes: int, gpu: str = "a100-80gb") -> Scenario:
    cluster = ClusterConfig(
        num_nodes=num_nodes,
        cost=CostModelConfig(gpu=gpu),
        kv_pool_bytes=kv_pool_bytes(gpu, (MIXED_MODEL,)),
        residency=ResidencyConfig(gpu_weight_budget_bytes=40 * GiB),
        placement=[(MIXED_MODEL,)],
        num_tool_workers=8,
        abandon_after_slo_x=3.0,
    )
    return Scenario(
        "mixed-class",
        cluster,
        None,
        workflows_per_node=300,
        rate_per_node_s=1.5,
        model_override=MIXED_MODEL,
        is_class_by_app=True,
    )


def model_per_app(workflows: list[SimWorkflow], cost: CostModelConfig) -> None:
    """Each (app, trace model) served by its own model: a fine-tune of the stage's cost profile (same shape, its own
    weights), registered in `cost.models` under `profile:app:trace-model` on first sight."""
    for stage in (s for w in workflows for s in w.stages):
        traced = str((stage.source or {}).get("model") or "default")
        name = f"{stage.model}:{stage.workflow.app}:{re.sub(r'[^A-Za-z0-9._-]+', '-', traced)}"
        if name not in cost.models:
            cost.models[name] = dataclasses.replace(cost.models[stage.model], name=name)
        stage.model = name


def multi_model(num_nodes: int, gpu: str = "a100-80gb") -> Scenario:
    # 40 GiB of weights: one of the large profiles (coder-32b fp8, 72b int4) or two of the 7-8B ones.
    cluster = ClusterConfig(
        num_nodes=num_nodes,
        cost=CostModelConfig(gpu=gpu),
        kv_pool_bytes=30 * GiB,
        residency=ResidencyConfig(gpu_weight_budget_bytes=40 * GiB),
        placement=[("llama-3-8b",)],
        num_tool_workers=8,
        abandon_after_slo_x=3.0,
    )
    return Scenario("multi-model", cluster, None, workflows_per_node=300, rate_per_node_s=1.5, is_model_per_app=True)


SCENARIOS = {
    "maestro-paper": maestro_paper,
    "mars-swe": mars_swe,
    "mixed-class": mixed_class,
    "multi-model": multi_model,
}


def get_scenario(name: str, num_nodes: int, gpu: str | None = None, regime: str | None = None) -> Scenario:
    """The scenario `name` on `num_nodes` nodes (its own GPU unless `gpu`), `prepare` applying `regime` (the
    scenario's default where None)."""
    try:
        build = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario '{name}'; known scenarios: {', '.join(SCENARIOS)}") from None
    scenario = build(num_nodes, gpu) if gpu else build(num_nodes)
    if regime is not None:
        known = {r.name: r for r in scenario.regimes}
        if regime not in known:
            raise ValueError(f"scenario '{name}' has no regime '{regime}'; known regimes: {', '.join(known)}")
        scenario.regime = known[regime]
    return scenario
