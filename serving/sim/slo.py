"""Per-workflow latency SLOs: a multiple of the workflow's unloaded latency, or the catalog's fixed SLO.

The Maestro paper does not say how its SLOs are defined (PAPERS.md). The usual practice in serving
papers is an *SLO scale*: the objective is a multiple of the latency the request would see alone on
the same hardware (AlpaServe, OSDI'23, "SLO scale × single-device latency"; DistServe, OSDI'24,
scales its SLOs the same way). For a workflow that is its critical path with no queueing:

    unloaded_s = longest path through the DAG of (prefill + lone decode [+ the tool it calls])

with the cost model of the hardware it runs on. A stage that continues its own tool loop prefills
only the new tokens (on an idle GPU nothing would have evicted the parent's KV); a decode step
reads only that stage's model (nothing else runs); tools run at full speed; models are resident.
So unloaded_s is a lower bound any schedule can reach only on an empty cluster.

`scaled-app` gives every workflow of an app the same SLO: slo_scale × the median unloaded latency of
that app's workflows in the run (AlpaServe's SLO is per model, not per request). Its reason: EDF reads
the SLO as a deadline, and a per-workflow SLO computed from true output lengths hands EDF the job's
size, which no scheduler knows at arrival; a per-app SLO is what a user could state up front.
`catalog` keeps the catalog's fixed per-app `slo_s` (10–900 s), the first pass's definition.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from serving.sim.costmodel import CostModel
from serving.sim.workload import SimStage, SimWorkflow


class SLOMode(enum.Enum):
    SCALED = "scaled"  # slo_scale × the workflow's isolated critical-path latency
    SCALED_APP = "scaled-app"  # slo_scale × the median isolated latency of the workflow's app
    CATALOG = "catalog"  # the app's fixed slo_s


@dataclass
class SLOConfig:
    mode: str = "scaled"
    slo_scale: float = 5.0  # a common middle setting of the SLO-scale sweeps in AlpaServe / DistServe

    def __post_init__(self):
        if self.mode not in {m.value for m in SLOMode}:
            raise ValueError(f"unknown SLO mode '{self.mode}'; known: {', '.join(m.value for m in SLOMode)}")
        if self.slo_scale <= 0:
            raise ValueError(f"slo_scale must be > 0, got {self.slo_scale}")


def stage_unloaded_s(stage: SimStage, cost: CostModel) -> float:
    """The stage alone on its GPU: prefill of what is not cached, lone decode, then its tool if any."""
    model = cost.model(stage.model)
    cached = 0
    if stage.session_parent >= 0:
        parent = stage.workflow.stages[stage.session_parent]
        cached = min(stage.prompt_tokens, parent.prompt_tokens + parent.output_tokens)
    seconds = cost.prefill_s(model, stage.prompt_tokens - cached, cached)
    seconds += cost.decode_s(model, stage.output_tokens, stage.prompt_tokens)
    return seconds + (stage.tool_exec_s if stage.is_tool_call else 0.0)


def unloaded_latency_s(workflow: SimWorkflow, cost: CostModel) -> float:
    """The workflow's critical path with no queueing (longest path through its stage DAG)."""
    finish: dict[int, float] = {}

    def finish_s(index: int) -> float:
        if index not in finish:
            stage = workflow.stages[index]
            start = max((finish_s(p) for p in stage.parents), default=0.0)
            finish[index] = start + stage_unloaded_s(stage, cost)
        return finish[index]

    return max((finish_s(s.index) for s in workflow.stages), default=0.0)


def apply_slo(workflows: list[SimWorkflow], cost: CostModel, config: SLOConfig) -> None:
    """Set each workflow's slo_s (what EDF's deadline, abandonment and SLO attainment all read)."""
    mode = SLOMode(config.mode)
    if mode is SLOMode.CATALOG:
        return
    unloaded = [unloaded_latency_s(w, cost) for w in workflows]
    if mode is SLOMode.SCALED_APP:
        by_app: dict[str, list[float]] = {}
        for workflow, seconds in zip(workflows, unloaded):
            by_app.setdefault(workflow.app, []).append(seconds)
        medians = {app: float(np.median(values)) for app, values in by_app.items()}
        unloaded = [medians[w.app] for w in workflows]
    for workflow, seconds in zip(workflows, unloaded):
        workflow.slo_s = config.slo_scale * seconds


@dataclass(frozen=True)
class SLOTable:
    """SLOs fixed before any replayed workflow arrives: one per (app, class), from the *training* side only.

    `by_app[app][class]` = scale × the median unloaded latency of that app's training workflows of that class
    ("interactive" or "batch"); a workflow of an app (or class) training never saw gets `global_s` = scale × the
    median over all training workflows. Nothing of a replayed workflow's own stages enters its deadline — a user
    could state it up front. `ceiling` says what share of a replay can meet its SLO at all (alone on the cluster).
    """

    scale: float
    by_app: dict[str, dict[str, float]]
    global_s: float

    @classmethod
    def fit(cls, train: list[SimWorkflow], cost: CostModel, scale: float) -> SLOTable:
        if not train:
            raise ValueError("SLOTable.fit: no training workflows to fix SLOs from")
        groups: dict[str, dict[str, list[float]]] = {}
        unloaded = [unloaded_latency_s(w, cost) for w in train]
        for workflow, seconds in zip(train, unloaded):
            groups.setdefault(workflow.app, {}).setdefault(slo_class(workflow), []).append(seconds)
        by_app = {app: {c: scale * float(np.median(v)) for c, v in classes.items()} for app, classes in groups.items()}
        return cls(scale, by_app, scale * float(np.median(unloaded)))

    def declared(self, calibration: list[SimWorkflow], cost: CostModel) -> SLOTable:
        """This table with the SLOs of apps it has none of declared from their owners' pilot (`calibration`
        workflows, never replayed) by the same rule as `fit`; its own apps and `global_s` stay as they are."""
        pilot = SLOTable.fit(calibration, cost, self.scale).by_app
        return SLOTable(self.scale, {**pilot, **self.by_app}, self.global_s)

    def slo_s(self, workflow: SimWorkflow) -> float:
        return self.by_app.get(workflow.app, {}).get(slo_class(workflow), self.global_s)

    def apply(self, workflows: list[SimWorkflow]) -> None:
        for workflow in workflows:
            workflow.slo_s = self.slo_s(workflow)

    def ceiling(self, workflows: list[SimWorkflow], cost: CostModel) -> float:
        """The share of `workflows` whose unloaded latency fits their SLO: what no schedule can beat."""
        fits = [unloaded_latency_s(w, cost) <= self.slo_s(w) for w in workflows]
        return float(np.mean(fits)) if fits else 0.0

    def to_json(self) -> dict:
        return {"mode": "per-app-from-train", "scale": self.scale, "by_app": self.by_app, "global": self.global_s}


def slo_class(workflow: SimWorkflow) -> str:
    return "interactive" if workflow.interactive else "batch"


def turn_unloaded_s(stage: SimStage, cost: CostModel) -> float:
    """One LLM call alone on its GPU: `stage_unloaded_s` without its tool (the turn ends when the call does)."""
    return stage_unloaded_s(stage, cost) - (stage.tool_exec_s if stage.is_tool_call else 0.0)


@dataclass(frozen=True)
class TurnSLO:
    """The per-turn SLO of interactive workflows (the mixed-class scenario): each LLM call of an interactive workflow
    is a turn its user waits on, judged on its own latency — from ready to the call's end, queueing, prefill, decode
    and preemptions included, its tool excluded — against scale × the median unloaded turn of that app's interactive
    training workflows (`global_s`, over all of them, for an app training never saw). Fixed from the training side,
    as `SLOTable`; it scores, it is not a deadline any scheduler reads."""

    scale: float
    by_app: dict[str, float]
    global_s: float

    @classmethod
    def fit(cls, train: list[SimWorkflow], cost: CostModel, scale: float) -> TurnSLO:
        groups: dict[str, list[float]] = {}
        for workflow in (w for w in train if w.interactive):
            groups.setdefault(workflow.app, []).extend(turn_unloaded_s(s, cost) for s in workflow.stages)
        every = [t for turns in groups.values() for t in turns]
        by_app = {app: scale * float(np.median(turns)) for app, turns in groups.items()}
        return cls(scale, by_app, scale * float(np.median(every)) if every else float("inf"))

    def bound_s(self, workflow: SimWorkflow) -> float:
        return self.by_app.get(workflow.app, self.global_s)

    def report(self, workflows: list[SimWorkflow], cost: CostModel) -> dict:
        """After a run: the share of interactive turns within their bound (a turn never finished misses), the share
        of interactive workflows every turn of which did, and each share's ceiling (the turns alone); and the p95
        latency of the turns that finished (`turn_p95_s`, None if none did: it does not see the turns that never
        did, the attainment does)."""
        inter = [w for w in workflows if w.interactive]
        met = [[s.finished_s >= 0 and s.finished_s - s.ready_s <= self.bound_s(w) for s in w.stages] for w in inter]
        latency = [s.finished_s - s.ready_s for w in inter for s in w.stages if s.finished_s >= 0]
        alone = [[turn_unloaded_s(s, cost) <= self.bound_s(w) for s in w.stages] for w in inter]
        turns, alone_turns = [t for m in met for t in m], [t for a in alone for t in a]
        return {
            "turn_attainment": float(np.mean(turns)) if turns else None,
            "turn_ceiling": float(np.mean(alone_turns)) if alone_turns else None,
            "interactive_all_turns": float(np.mean([all(m) for m in met])) if met else None,
            "interactive_all_turns_ceiling": float(np.mean([all(a) for a in alone])) if alone else None,
            "num_interactive_turns": len(turns),
            "turn_p95_s": float(np.percentile(latency, 95)) if latency else None,
        }
