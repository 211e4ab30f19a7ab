"""The referee's runs: one replayed side at several rates and seeds, every arm on the same workflows.

Per seed: the held-out workflows cycled to `--workflows` in a seeded order, Poisson arrivals, tool times drawn from
the stated distribution (`serving.sim.tooltime`), the per-app SLOs fixed from the training side
(`serving.sim.slo.SLOTable`). Per arm: the system, fed predictions made at readiness (`serving.sim.ready`). The
cluster is the named scenario's (`serving.sim.scenarios`), which also prepares every workflow it replays or fixes
SLOs from (its context growth, classes, model mapping), priced by the cost model's `step_model` where one is named.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks.referee.arms import COMPARE, Arm, predict_ready
from benchmarks.referee.stats import Outcomes
from maestro.contract import StageTrace
from serving.sim.arrivals import arrival_times
from serving.sim.costmodel import CostModel
from serving.sim.engine import Simulator
from serving.sim.ready import ReadyPredictions, WorkflowPrior, base_id, reserve_margin
from serving.sim.scenarios import get_scenario
from serving.sim.slo import SLOTable, TurnSLO
from serving.sim.tooltime import ToolTimeDistribution
from serving.sim.workload import SimWorkflow, map_models, reset, trace_workflows

MODEL_MAP = {  # trace model -> cost profile: each large family on its own placed model (as benchmarks.sim.replay)
    "gpt-4.1": "llama-3-8b",
    "gpt-4.1-2025-04-14": "llama-3-8b",
    "gpt-4.1-mini": "llama-3-8b",
    "ft:gpt-4.1-2025-04-14:sierra:tau2-full-sft:BzrYdMNm": "qwen2-7b",
    "gpt-4o": "mistral-7b",
    "claude-opus-4-6": "qwen2.5-coder-32b",
    "ModelType.GPT_3_5_TURBO": "qwen2-72b",
    "ModelType.GPT_3_5_TURBO_NEW": "qwen2-72b",
}
# `--rates auto`: each rate's name and the share of the ceiling the search's arm attains there
RATE_TARGETS = {"light": 0.99, "knee": 0.9, "past": 0.7, "heavy": 0.5}
TARGETS = tuple(RATE_TARGETS.values())
RATES_FOUND_BY = "edf"  # the arm the rate search runs
MARGIN_WORKFLOWS = 120  # training workflows the oracle's reserve margin is measured on
COUNTERS = (
    "num_preemptions",
    "num_demoted",
    "num_refused_by_batch_cost",
    "num_abandoned",
    "num_rejected",
    "oom_rate",
    "kv_reserved_frac_vs_maxlen",
    "num_kv_refused",  # stages a node could not start for want of KV pages (memory binding before a preemption)
    "num_model_loads",
    "model_load_s",
    "interactive_queue_p95_s",  # interactive stages' queueing p95 (s): mixed-class's interactive/batch split
)


@dataclass
class Replay:
    """The replayed side of one split, with its SLOs and each arm's predictions (cached across rates and seeds)."""

    train: list[StageTrace]
    test: list[StageTrace]
    model_dir: Path | None
    nodes: int = 8
    workflows: int = 1600
    slo_scale: float = 5.0
    tool_times: ToolTimeDistribution = field(default_factory=ToolTimeDistribution)
    sources: dict = field(default_factory=dict)
    compare_dir: Path | None = None  # the predictor of the `model@compare` source
    scenario_name: str = "maestro-paper"
    regime: str | None = None  # the scenario's context regime (None: its default)
    step_model: str | None = None  # the cost model's step pricing, `fitted` or `datasheet` (None: the config's)
    calibration: list[StageTrace] = field(default_factory=list)  # SLOs of apps the train side lacks; never replayed

    def __post_init__(self):
        self.scenario = get_scenario(self.scenario_name, self.nodes, regime=self.regime)
        self.scenario.cluster.show_progress = False
        if self.step_model is not None:
            self.scenario.cluster.cost = replace(self.scenario.cluster.cost, step_model=self.step_model)
        self.cost = CostModel(self.scenario.cluster.cost)
        self.default_model = self.scenario.cluster.placement[0][0]
        self.train_workflows = self._workflows(self.train, None, seed=0)
        self.slo = SLOTable.fit(self.train_workflows, self.cost, self.slo_scale)
        # interactive workflows' turns, each judged on its own latency (mixed-class): scored, read by no arm
        is_interactive = any(w.interactive for w in self.train_workflows)
        self.turn_slo = TurnSLO.fit(self.train_workflows, self.cost, self.slo_scale) if is_interactive else None
        if self.calibration:
            self.slo = self.slo.declared(self._workflows(self.calibration, None, seed=0), self.cost)
        self.margin: float | None = None
        self.workflow_prior = WorkflowPrior(self.train)
        self.base = self._workflows(self.test, None, seed=0)
        self.clusters = {w.workflow_id: i for i, w in enumerate(self.base)}

    def _workflows(self, stages: list[StageTrace], count: int | None, seed: int) -> list[SimWorkflow]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unmapped trace models run as the default model
            workflows = trace_workflows(stages, self.default_model, count, seed)
            map_models(workflows, self.scenario.cluster.cost.models, self.default_model, MODEL_MAP)
        self.scenario.prepare(workflows)
        self.tool_times.draw(workflows, seed)
        return workflows

    def workload(self, rate: float, seed: int) -> list[SimWorkflow]:
        workflows = self._workflows(self.test, self.workflows, seed)
        self.slo.apply(workflows)
        for workflow, at in zip(workflows, arrival_times("poisson", len(workflows), rate, seed)):
            workflow.arrival_s = float(at)
        return workflows

    def ceiling(self, seed: int) -> float:
        return self.slo.ceiling(self._workflows(self.test, None, seed), self.cost)

    def source(self, name: str, seed: int) -> ReadyPredictions:
        """The arm's prediction source, built and prewarmed once on the replayed side (noise: once per seed)."""
        key = (name, seed if name.startswith("noise") else 0)
        if key not in self.sources:
            self.sources[key] = self.build_source(name, key[1], self.base)
        return self.sources[key]

    def build_source(self, name: str, seed: int, workflows: list[SimWorkflow]) -> ReadyPredictions:
        """The arm's prediction source prewarmed on `workflows`, not cached (the leak tests build one per changed
        workload, so that a source reading a changed truth would see the change)."""
        margin = self.model_margin() if name == "oracle" or name.startswith("noise") else 1.0
        base, compare, _ = name.partition(COMPARE)
        if compare and self.compare_dir is None:
            raise ValueError(f"source '{name}' needs a second predictor: give --compare-model DIR")
        predictions = ReadyPredictions(
            base,
            self.compare_dir if compare else self.model_dir,
            seed=seed,
            margin=margin,
            workflow_prior=self.workflow_prior,
        )
        predictions.prewarm([s for w in workflows for s in w.stages])
        return predictions

    def model_margin(self) -> float:
        """The oracle's and the noise arms' reserve margin, from the model on (a sample of) the training side."""
        if self.margin is None:
            self.margin = reserve_margin(self.model_dir, self.train_workflows[:MARGIN_WORKFLOWS])
        return self.margin

    def run(
        self, arm: Arm, workflows: list[SimWorkflow], seed: int, log_decisions: bool = False, fresh: bool = False
    ) -> Outcomes:
        """One arm on `workflows`; with `fresh`, its sources built from these workflows (`build_source`), not cached."""
        reset(workflows)
        sources = {
            name: self.build_source(name, seed, workflows) if fresh else self.source(name, seed) for name in arm.sources
        }
        sim = Simulator(
            self.scenario.cluster,
            arm.system,
            workflows,
            predict_ready=predict_ready(arm, sources),
            log_decisions=log_decisions,
        )
        summary = sim.run().summary
        done = np.array([w.done_s >= 0 and not w.is_dropped for w in workflows])
        e2e = np.array([w.done_s - w.arrival_s if d else math.inf for w, d in zip(workflows, done)])
        met = done & (e2e <= np.array([w.slo_s for w in workflows]))
        clusters = np.array([self.clusters[base_id(w)] for w in workflows])
        extra = {k: summary[k] for k in COUNTERS}
        if self.turn_slo is not None:
            turns = self.turn_slo.report(workflows, self.cost)
            extra["turn_attainment"] = turns["turn_attainment"]  # a turn never finished misses
            extra["interactive_turn_p95_s"] = turns["turn_p95_s"]  # the turns that finished, ready to end
        if log_decisions:
            extra["decisions"] = sim.recorder.decisions
        return Outcomes(met, e2e, clusters, extra)


def find_rates(replay: Replay, ceiling: float, targets=TARGETS, iterations: int = 6) -> list[float]:
    """Arrival rates where EDF (`RATES_FOUND_BY`) attains about each target × the ceiling (seed 0; bisection in log
    space): light, the knee, sustained overload and (EDF keeps about half of the ceiling even when every workflow
    arrives at once, the replay's fixed number of workflows then being a burst) the search's upper bound."""
    from benchmarks.referee.arms import parse_arm

    edf, cache = parse_arm(RATES_FOUND_BY), {}

    def attained(rate: float) -> float:
        if rate not in cache:
            cache[rate] = float(replay.run(edf, replay.workload(rate, 0), 0).met.mean())
        return cache[rate]

    rates, low, high = [], 0.25, 64.0
    for target in tqdm(targets, desc="capacity (EDF)", unit="target"):
        lo, hi = low, high
        for _ in range(iterations):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if attained(mid) > target * ceiling else (lo, mid)
        rates.append(round(math.sqrt(lo * hi), 2))
        if hi >= high:
            print(
                f"capacity: EDF stays above {target} × the ceiling up to {high}/s; the rate for that target is "
                "the search's upper bound"
            )
        low = lo
    return rates


def run_grid(replay: Replay, arms: list[Arm], rates: list[float], seeds: int) -> dict[str, dict[str, list]]:
    """`out[rate][arm]` = the arm's `Outcomes` per seed; a progress bar over the runs."""
    out: dict[str, dict[str, list]] = {str(rate): {arm.name: [] for arm in arms} for rate in rates}
    bar = tqdm(total=len(out) * seeds * len(arms), desc="referee", unit="run")
    started = time.perf_counter()
    for rate in dict.fromkeys(rates):  # a rate found twice (the search's bound) runs once
        for seed in range(seeds):
            workflows = replay.workload(rate, seed)
            for arm in arms:
                bar.set_postfix_str(f"{rate}/s seed {seed} {arm.name}")
                out[str(rate)][arm.name].append(replay.run(arm, workflows, seed))
                bar.update(1)
    bar.close()
    print(f"grid: {len(out) * seeds * len(arms)} runs in {time.perf_counter() - started:.0f} s")
    return out
