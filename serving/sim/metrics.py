"""What a simulation run measured, per policy, in the shape `maestro simulate` writes to JSON."""

from __future__ import annotations

import numpy as np


def _stats(values: list[float], quantiles: tuple[int, ...]) -> dict:
    if not values:
        return {"mean": None, **{f"p{q}": None for q in quantiles}}
    array = np.asarray(values, dtype=float)
    return {"mean": float(array.mean()), **{f"p{q}": float(np.percentile(array, q)) for q in quantiles}}


class Recorder:
    def __init__(self):
        self.interactive_waits_s: list[float] = []
        self.num_stages = 0
        self.num_oom_stages = 0
        self.peak_pages = 0
        self.maxlen_pages = 0
        self.preemptions = 0
        self.abandoned = 0
        self.rejected = 0  # workflows turned away by triage (serving/core/scheduler/triage.py)
        self.never_fit = 0
        self.kv_refused: set[int] = set()  # stages a node could not start for want of KV pages, at least once
        self.num_kept_reclaimed = 0  # kept tool-call contexts reclaimed for another stage's start or decode growth
        self.num_cold_session_starts = 0  # a session's next stage started with neither its kept KV nor a prefix hit
        self.num_reprefilled_tokens = 0  # ... and the parent context it prefilled again
        self.num_ready = 0  # stages that became ready
        self.num_ready_behind_queue = 0  # ... and found their node's queue non-empty (the order had work to act on)
        self.summary: dict = {}
        self.decisions: list[tuple] | None = None  # set to [] to log every decision (the referee's leak test)

    def decision(self, kind: str, now: float, stage, node: int) -> None:
        """Log one decision — a stage routed to a node (where it had a choice), started or dropped, a workflow
        rejected, a KV kept or evicted at a tool call — where logging is on."""
        if self.decisions is not None:
            self.decisions.append((now, kind, stage.workflow.workflow_id, stage.stage_id, node))

    def stage_ready(self, queue_length: int) -> None:
        self.num_ready += 1
        self.num_ready_behind_queue += queue_length > 0

    def stage_done(self, stage) -> None:
        self.num_stages += 1
        self.num_oom_stages += stage.is_oom
        self.peak_pages += stage.peak_pages
        self.maxlen_pages += stage.maxlen_pages
        if stage.workflow.interactive:
            self.interactive_waits_s.append(stage.queue_wait_s)

    def finish(self, sim) -> None:
        workflows = sim.workflows
        done = [w for w in workflows if w.done_s >= 0 and not w.is_dropped]
        e2e = [w.done_s - w.arrival_s for w in done]
        good = sum(1 for w in done if w.done_s - w.arrival_s <= w.slo_s)
        first = min(w.arrival_s for w in workflows)
        last = max([w.done_s for w in done] + [w.arrival_s for w in workflows])
        n = max(1, len(workflows))
        self.summary = {
            "slo_attainment": good / n,
            "interactive_queue_delay_s": _stats(self.interactive_waits_s, (95,)),
            # interactive stages' wait from ready to start, p95 (0 with no interactive stage)
            "interactive_queue_p95_s": float(np.percentile(self.interactive_waits_s, 95))
            if self.interactive_waits_s
            else 0.0,
            "e2e_s": _stats(e2e, (90, 95)),
            "kv_reserved_frac_vs_maxlen": self.peak_pages / max(1, self.maxlen_pages),
            "oom_rate": self.num_oom_stages / max(1, self.num_stages),
            "rejected_rate": sum(w.is_dropped for w in workflows) / n,
            "goodput_rps": good / max(1e-9, last - first),
            "num_workflows": len(workflows),
            "num_stages_total": sum(len(w.stages) for w in workflows),
            "num_stages_completed": self.num_stages,
            "num_preemptions": self.preemptions,
            "num_abandoned": self.abandoned,
            "num_rejected": self.rejected,
            "num_never_fit": self.never_fit,
            "num_events": sim.num_events,
            "queue_nonempty_at_ready": self.num_ready_behind_queue / max(1, self.num_ready),
            "num_demoted": sum(getattr(node.sched, "num_demoted", 0) for node in sim.nodes),
            "num_refused_by_batch_cost": sim.dispatch.batch_gate.num_refused if sim.dispatch.batch_gate else 0,
            "makespan_s": last - first,
            "num_kv_refused": len(self.kv_refused),
            "num_kept_reclaimed": self.num_kept_reclaimed,
            "num_cold_session_starts": self.num_cold_session_starts,
            "num_reprefilled_tokens": self.num_reprefilled_tokens,
            "num_model_loads": sum(node.residency.num_loads for node in sim.nodes),
            "model_load_s": sum(node.residency.load_s for node in sim.nodes),
        }
