"""Workflow triage: deadline order while the admitted workflows can all make their deadlines, and when they cannot,
the workflow with the most predicted work left goes behind — decided when its stages become ready, not in its middle.

This is Moore–Hodgson's rule (which maximises the number of jobs on time on one machine: keep deadline order, and
whenever the job just added would be late, drop the longest job so far) made online, for a pool of nodes that serves
one model. Each open workflow w has a deadline D_w and a predicted remaining work W_w, in unloaded seconds (the unit
of `StageRequest.pred_service_s`: the ready stage's own service plus `workflow_remaining_s`). The pool completes
about `c` such seconds per wall second while work is waiting (its measured capacity, see below). Sorted by deadline,
the admitted set is feasible when, for every w,

    Σ_{v: D_v ≤ D_w} W_v  ≤  c · (D_w − now)

and while it is not, the workflow with the largest W among those up to the first violation is shed, and so is one
whose ready stage alone cannot end before its deadline (only the stage: the workflow's remaining work is a median, and
a single workflow may well need less; past its deadline, it cannot). Shedding is final, and it withdraws
the workflow's claim to its deadline (`apply`): its stages carry no deadline from then on, so they queue behind every
on-time stage (`TriageScheduler`) and the batch-cost gate admits one only where it endangers no running stage that can
still make its deadline. The capacity goes to the workflows that can still be met; the rest end when there is room
(or by the starvation bound, `late_max_wait_s`).

Capacity is measured, not configured: the unloaded seconds of the stages a pool finished over a window, divided by the
window, kept only for windows in which work waited for the pool at every finish (a pool with room shows its load, not
its capacity), as a moving average. Until such a window no workflow is shed, nor while no work waits for the pool's
nodes: with room for every ready stage, shedding one helps nobody.

With no workflow prediction (`workflow_remaining_s` = 0) W is the ready stage's own service, and triage sheds by
stage size alone; fed the predicted remaining work it sheds the workflows that would use the most of the pool.
The gateway, the simulator and the vLLM plugin call the same object: `assess` when a stage becomes ready, `served`
when one finishes, `end` when a workflow does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from serving.core.request import StageRequest
from serving.core.scheduler.base import SchedulerConfig
from serving.core.scheduler.slack import LeastSlackScheduler, SlackQueue


@dataclass
class _Pool:
    capacity: float | None = None  # unloaded seconds served per wall second while work waits
    window_start_s: float | None = None
    window_work_s: float = 0.0
    window_backlogged: bool = True
    open: dict[str, tuple[float, float]] = field(default_factory=dict)  # workflow → (deadline, predicted work)


@dataclass
class TriageConfig:
    window_s: float = 10.0  # the capacity measurement's window
    smoothing: float = 0.5  # weight of the newest backlogged window in the capacity's moving average


class WorkflowTriage:
    """Which workflows are shed (see the module docstring); one per cluster, pools keyed by model."""

    def __init__(self, config: TriageConfig | None = None):
        self.config = config or TriageConfig()
        self.pools: dict[str, _Pool] = {}
        self.shed: set[str] = set()
        self.num_assessed = 0

    def assess(self, request: StageRequest, now: float, backlogged: bool = True) -> bool:
        """A stage of `request.workflow_id` became ready: update its workflow's predicted work, re-check the pool's
        admitted set (only while `backlogged`: work waits for the pool's nodes), and say whether the workflow is
        shed."""
        workflow = request.workflow_id
        self.num_assessed += 1
        if workflow in self.shed:
            return True
        pool = self.pools.setdefault(request.model, _Pool())
        work = request.pred_service_s + request.workflow_remaining_s
        pool.open[workflow] = (request.deadline_s, work)
        if request.deadline_s < now:
            self._shed(workflow)
        elif not backlogged:
            return False
        elif request.pred_service_s > request.deadline_s - now:
            self._shed(workflow)
        elif pool.capacity is not None and math.isfinite(request.deadline_s):
            self._moore_hodgson(pool, now)
        return workflow in self.shed

    def apply(self, request: StageRequest, now: float, backlogged: bool = True) -> bool:
        """`assess`, and a shed workflow's stage marked shed with no deadline left to meet."""
        if self.assess(request, now, backlogged):
            request.is_shed, request.deadline_s = True, math.inf
        return request.is_shed

    def _moore_hodgson(self, pool: _Pool, now: float) -> None:
        names = [w for w, (deadline, _) in pool.open.items() if math.isfinite(deadline)]
        deadlines = np.array([pool.open[w][0] for w in names])
        work = np.array([pool.open[w][1] for w in names])
        order = np.argsort(deadlines, kind="stable")
        names, deadlines, work = [names[i] for i in order], deadlines[order], work[order]
        kept = np.ones(len(names), dtype=bool)
        budget = pool.capacity * (deadlines - now)
        while True:
            late = np.flatnonzero(kept & (np.cumsum(np.where(kept, work, 0.0)) > budget))
            if len(late) == 0:
                return
            prefix = np.flatnonzero(kept[: late[0] + 1])
            longest = prefix[np.argmax(work[prefix])]
            kept[longest] = False
            self._shed(names[longest])

    def _shed(self, workflow: str) -> None:
        self.shed.add(workflow)
        for pool in self.pools.values():
            pool.open.pop(workflow, None)

    def served(self, model: str, work_s: float, now: float, backlogged: bool) -> None:
        """A stage of `model` finished after `work_s` unloaded seconds of service; `backlogged`: work was waiting for
        the pool's nodes."""
        pool = self.pools.setdefault(model, _Pool())
        if pool.window_start_s is None:
            pool.window_start_s = now
        pool.window_work_s += work_s
        pool.window_backlogged &= backlogged
        elapsed = now - pool.window_start_s
        if elapsed >= self.config.window_s:
            if pool.window_backlogged:
                rate, a = pool.window_work_s / elapsed, self.config.smoothing
                pool.capacity = rate if pool.capacity is None else a * rate + (1 - a) * pool.capacity
            pool.window_start_s, pool.window_work_s, pool.window_backlogged = now, 0.0, True

    def end(self, workflow: str) -> None:
        """The workflow ended (completed or dropped)."""
        self.shed.discard(workflow)
        for pool in self.pools.values():
            pool.open.pop(workflow, None)


class TriageQueue(SlackQueue):
    """One class of work: on-time stages by deadline, shed (or past-deadline) stages behind them."""

    def push(self, request: StageRequest, now: float) -> None:
        if request.is_shed or request.deadline_s - request.pred_service_s < now:
            self._push_late(request)
        else:
            self.on_time.push((request.deadline_s, request.ready_s), request)

    def demote(self, now: float) -> None:
        """Move every stage whose deadline has passed behind on-time work."""
        while (entry := self.on_time.top()) is not None and entry[0][0] < now:
            self._push_late(self.on_time.pop())


class TriageScheduler(LeastSlackScheduler):
    """Earliest deadline first; the stages of workflows that `WorkflowTriage` shed, and stages that can no longer end
    by their deadline, behind every on-time stage; interactive before batch.

    Late work goes as in `LeastSlackScheduler`; which workflows are shed: the module docstring.
    """

    def __init__(self, config: SchedulerConfig):
        super().__init__(config)
        self._interactive, self._batch = TriageQueue(config), TriageQueue(config)
