"""Named scenarios: the cluster, workload and load that `maestro simulate --scenario NAME` runs.

maestro-paper: the Maestro prototype's setting as far as it is known — homogeneous A100-80GB
nodes, the five catalog apps (three interactive, two batch), several models per node, high
contention. mars-swe: MARS's setting — one H200 per run, Qwen3-Coder-30B-A3B, SWE-style coding
loops whose tools run on 8 pinned host cores, three context-length regimes (short → long).
Loads are parameters, chosen to put the baseline near saturation; see serving/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.core.residency import GiB, ResidencyConfig
from serving.sim.costmodel import CostModelConfig
from serving.sim.engine import ClusterConfig
from serving.sim.workload import SimWorkflow


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
    referee_arms: tuple[str, ...] = ()  # the referee's extra baselines here (system names)

    def prepare(self, workflows: list[SimWorkflow]) -> None:
        """In place, on workflows whose trace models are already mapped to cost profiles: the scenario's own changes
        to a replayed workload (context growth, classes, model mapping). This scenario replays the traces as they
        are."""


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


def mars_swe(num_nodes: int, gpu: str = "h200") -> Scenario:
    cluster = ClusterConfig(
        num_nodes=num_nodes,
        cost=CostModelConfig(gpu=gpu),
        kv_pool_bytes=60 * GiB,
        residency=ResidencyConfig(gpu_weight_budget_bytes=64 * GiB),
        placement=[("qwen3-coder-30b-a3b",)],
        num_tool_workers=8,
    )
    regimes = (Regime("short", 2000, 300), Regime("medium", 12000, 1000), Regime("long", 40000, 2500))
    return Scenario(
        "mars-swe",
        cluster,
        {"swe_coding": 1.0},
        workflows_per_node=200,
        rate_per_node_s=0.2,
        regimes=regimes,
        model_override="qwen3-coder-30b-a3b",
        default_policies=("continuum", "continuum-dy", "infercept", "keep-always", "evict-always", "mars"),
    )


SCENARIOS = {"maestro-paper": maestro_paper, "mars-swe": mars_swe}


def get_scenario(name: str, num_nodes: int, gpu: str | None = None, regime: str | None = None) -> Scenario:
    """The scenario `name` on `num_nodes` nodes; `regime` names one of its context regimes (None: its default)."""
    try:
        build = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario '{name}'; known scenarios: {', '.join(SCENARIOS)}") from None
    scenario = build(num_nodes, gpu) if gpu else build(num_nodes)
    known = [r.name for r in scenario.regimes]
    if regime is not None and regime not in known:
        raise ValueError(f"scenario '{name}' has no regime '{regime}'; known regimes: {', '.join(known)}")
    return scenario
