"""Workflow triage: deadline order while the admitted workflows can all make their deadlines, and when they cannot,
the workflow with the most predicted work left goes behind — decided when its stages become ready, not in its middle.

This is Moore–Hodgson's rule (which maximises the number of jobs on time on one machine: keep deadline order, and
whenever the job just added would be late, drop the longest job so far) made online, for a pool of nodes that serves
one model. Each open workflow w has a deadline D_w and a predicted remaining pool work W_w, in unloaded seconds of
service (the unit of `StageRequest.pred_service_s`: the ready stage's own service plus `workflow_remaining_s`; no tool
time, which takes none of the pool). The pool completes about `c` such seconds per wall second while work is waiting
(its measured capacity, see below). The workflow also waits T_w of tool time from its ready stage on
(`remaining_tool_s`), outside the pool, so its pool work must end by D'_w = D_w − T_w (`pool_deadline_s`). Sorted by
D', the admitted set is feasible when, for every w,

    Σ_{v: D'_v ≤ D'_w} W_v  ≤  c · (D'_w − now)

and while it is not, the workflow with the largest W among those up to the first violation is shed, and so is one whose
ready stage alone, with its tool time after it, cannot end before its deadline (`is_late_alone`; only the stage's
service: the workflow's remaining service is a median, and a single workflow may well need less). A workflow whose
deadline has passed when a stage of it becomes ready can no longer be met: it is shed while the pool is saturated (it
takes the pool from work that can), and whatever the pool's state where its predicted work, at the pool's pace, would
end after its callers give it up (`patience_slo_x` × its SLO after it arrived, where the caller knows it): the
alternative is abandonment, after the work. Shedding is final, and it withdraws the workflow's claim to its deadline
(`apply`): its stages carry no deadline from then on, so they queue behind every on-time stage (`TriageScheduler`) and
the batch-cost gate admits one only where it endangers no running stage that can still make its deadline. The capacity
goes to the workflows that can still be met; the rest end when there is room (or by the starvation bound,
`late_max_wait_s`).

The feasibility test runs only while the pool is saturated: work of its model waits for its nodes (`backlogged`; a
node holding several models may queue another's, which says nothing of this pool), or, where
`saturated_stretch` is set, its stages run that many × slower than alone (a pool whose batches take every stage never
queues; it slows everyone instead). With room for every stage at near its own pace, shedding one helps nobody. The
stretch is wall over unloaded seconds of the stages the pool finished (where the caller reports their wall time), per
window.

Capacity is measured, not configured: the unloaded seconds of the stages a pool finished over a window, divided by the
window, kept for windows through which the pool was saturated (work waited at every finish, or the window's stretch
reached `saturated_stretch`; a pool with room shows its load, not its capacity), as a moving average. A stage's work
is counted when it ends, so a window shorter than the stages it counts reads the pace at which stages started before
it end, not the pool's: where the caller reports wall times, a window stays open until it is at least as long as the
longest stage it counts (docs/triage.md: pools of long stages read several times low while they filled). With
`saturated_stretch` set, the capacity before the first such window — a burst into an empty fleet — is seeded from what
the pool has shown so far: its stages in flight (assessed, not yet served) at the pace its finished stages ran,
`num_in_flight / stretch`, once `min_seed_stages` finishes were timed. The seed errs high (queued and never-served
stages count as in flight), and the first window's rate — low, since it counts a stage's work only when it ends — is
raised to it. Both are off by default: on the referee's dev-side burst, fed the trained model, they shed three times
as many workflows and lost 4.6 pp (serving/EXPERIMENTS.md, 2026-12-04).

With no workflow prediction (`workflow_remaining_s` = 0) W is the ready stage's own service, and triage sheds by
stage size alone; fed the predicted remaining work it sheds the workflows that would use the most of the pool.
The gateway, the simulator and the vLLM plugin call the same object: `assess` when a stage becomes ready, `served`
when one finishes, `end` when a workflow does.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from serving.core.request import StageRequest
from serving.core.scheduler.base import SchedulerConfig, merge_by_wait
from serving.core.scheduler.slack import LeastSlackScheduler, SlackQueue


@dataclass
class _Pool:
    capacity: float | None = None  # unloaded seconds served per wall second while the pool is saturated
    stretch: float | None = None  # wall seconds per unloaded second of the stages it finished (last window)
    num_in_flight: int = 0  # stages assessed and not yet served (over-counts those never served: the seed's side)
    window_start_s: float | None = None
    window_work_s: float = 0.0
    window_backlogged: bool = True
    window_timed_work_s: float = 0.0  # the window's work whose wall time was reported
    window_wall_s: float = 0.0
    window_max_wall_s: float = 0.0  # the longest wall time of a stage the window credits
    window_num_timed: int = 0
    open: dict[str, tuple[float, float]] = field(default_factory=dict)  # workflow → (deadline, predicted work)


@dataclass
class TriageConfig:
    window_s: float = 10.0  # the capacity measurement's window
    smoothing: float = 0.5  # weight of the newest saturated window in the capacity's moving average
    # stages slowed this much (wall / unloaded) mean the pool is saturated, and its capacity is seeded before the first
    # saturated window; None: saturated only while work waits for it (the default: see serving/EXPERIMENTS.md)
    saturated_stretch: float | None = None
    min_seed_stages: int = 8  # timed finishes before the stretch (and the seeded capacity) is read
    patience_slo_x: float | None = None  # callers give a workflow up this many × its SLO after it arrived, if known

    def __post_init__(self):
        if self.window_s <= 0 or not 0 < self.smoothing <= 1:
            raise ValueError("TriageConfig: window_s must be > 0 and smoothing in (0, 1]")
        if (self.saturated_stretch is not None and self.saturated_stretch < 1) or self.min_seed_stages < 1:
            raise ValueError("TriageConfig: saturated_stretch must be >= 1 and min_seed_stages >= 1")
        if self.patience_slo_x is not None and self.patience_slo_x < 1:
            raise ValueError("TriageConfig: patience_slo_x must be >= 1 (callers wait at least the SLO) or None")


def pool_deadline_s(request: StageRequest) -> float:
    """When the workflow's pool work must end for the workflow to make its deadline: the deadline less the tool time
    predicted ahead of it (`remaining_tool_s`), which it waits outside the pool."""
    return request.deadline_s - request.remaining_tool_s


def is_late_alone(request: StageRequest, now: float) -> bool:
    """Whether the ready stage cannot end by its deadline even alone on a node, with its workflow's predicted tool time
    still to wait (only the stage's service: the workflow's remaining service is a median, and a single workflow may
    well need less)."""
    return request.pred_service_s + request.remaining_tool_s > request.deadline_s - now


class WorkflowTriage:
    """Which workflows are shed (see the module docstring); one per cluster, pools keyed by model."""

    def __init__(self, config: TriageConfig | None = None):
        self.config = config or TriageConfig()
        self.pools: dict[str, _Pool] = {}
        self.shed: set[str] = set()
        self.num_assessed = 0
        self.num_shed = 0  # workflows shed so far, whichever workflow's stage the test that shed them ran for

    def assess(self, request: StageRequest, now: float, backlogged: bool = True) -> bool:
        """A stage of `request.workflow_id` became ready: update its workflow's predicted work, re-check the pool's
        admitted set (only while the pool is saturated: work waits for its nodes, `backlogged`, or its stages run
        `saturated_stretch` × slower than alone), and say whether the workflow is shed."""
        workflow = request.workflow_id
        self.num_assessed += 1
        if workflow in self.shed:
            return True
        pool = self.pools.setdefault(request.model, _Pool())
        pool.open[workflow] = (pool_deadline_s(request), request.pred_service_s + request.workflow_remaining_s)
        is_saturated = self.is_saturated(pool, backlogged)
        if request.deadline_s < now and (is_saturated or self.is_given_up(request, pool, now)):
            self._shed(workflow)
        elif is_saturated:
            capacity = self.capacity_s(pool)
            if is_late_alone(request, now):
                self._shed(workflow)
            elif capacity is not None and math.isfinite(request.deadline_s):
                self._moore_hodgson(pool, capacity, now)
        is_shed = workflow in self.shed
        pool.num_in_flight += not is_shed
        return is_shed

    def stretch(self, pool: _Pool) -> float | None:
        """Wall seconds per unloaded second of the pool's stages: the last closed window's, else the open window's
        once `min_seed_stages` of its finishes were timed; None before."""
        if pool.stretch is not None:
            return pool.stretch
        if pool.window_num_timed >= self.config.min_seed_stages and pool.window_timed_work_s > 0:
            return pool.window_wall_s / pool.window_timed_work_s
        return None

    def is_given_up(self, request: StageRequest, pool: _Pool, now: float) -> bool:
        """Whether the workflow's predicted work, at the pool's pace, ends after its callers give it up
        (`patience_slo_x` × its SLO after it arrived); False where the patience is not known."""
        if self.config.patience_slo_x is None:
            return False
        give_up_s = request.workflow_arrival_s + self.config.patience_slo_x * (
            request.deadline_s - request.workflow_arrival_s
        )
        work_s = request.pred_service_s + request.workflow_remaining_s
        return now + work_s * max(1.0, self.stretch(pool) or 1.0) > give_up_s

    def is_stretched(self, stretch: float | None) -> bool:
        threshold = self.config.saturated_stretch
        return threshold is not None and stretch is not None and stretch >= threshold

    def is_saturated(self, pool: _Pool, backlogged: bool) -> bool:
        return backlogged or self.is_stretched(self.stretch(pool))

    def capacity_s(self, pool: _Pool) -> float | None:
        """Unloaded seconds the pool serves per wall second: measured over saturated windows; before the first, seeded
        from what the pool has shown so far — its stages in flight at the pace its finished stages ran
        (`num_in_flight` / stretch), which over-counts rather than under-counts (queued stages are in flight too)."""
        if pool.capacity is not None or self.config.saturated_stretch is None:
            return pool.capacity
        stretch = self.stretch(pool)
        return pool.num_in_flight / stretch if stretch is not None and pool.num_in_flight > 0 else None

    def apply(self, request: StageRequest, now: float, backlogged: bool = True) -> bool:
        """`assess`, and a shed workflow's stage marked shed with no deadline left to meet."""
        if self.assess(request, now, backlogged):
            request.is_shed, request.deadline_s = True, math.inf
        return request.is_shed

    def _moore_hodgson(self, pool: _Pool, capacity: float, now: float) -> None:
        names = [w for w, (deadline, _) in pool.open.items() if math.isfinite(deadline)]
        deadlines = np.array([pool.open[w][0] for w in names])
        work = np.array([pool.open[w][1] for w in names])
        order = np.argsort(deadlines, kind="stable")
        names, deadlines, work = [names[i] for i in order], deadlines[order], work[order]
        kept = np.ones(len(names), dtype=bool)
        budget = capacity * (deadlines - now)
        while True:
            late = np.flatnonzero(kept & (np.cumsum(np.where(kept, work, 0.0)) > budget))
            if len(late) == 0:
                return
            prefix = np.flatnonzero(kept[: late[0] + 1])
            longest = prefix[np.argmax(work[prefix])]
            kept[longest] = False
            self._shed(names[longest])

    def _shed(self, workflow: str) -> None:
        self.num_shed += workflow not in self.shed
        self.shed.add(workflow)
        for pool in self.pools.values():
            pool.open.pop(workflow, None)

    def served(self, model: str, work_s: float, now: float, backlogged: bool, wall_s: float | None = None) -> None:
        """A stage of `model` finished after `work_s` unloaded seconds of service (`wall_s` on the clock, where the
        caller knows it); `backlogged`: work was waiting for the pool's nodes."""
        pool = self.pools.setdefault(model, _Pool())
        pool.num_in_flight = max(0, pool.num_in_flight - 1)
        if pool.window_start_s is None:
            pool.window_start_s = now
        pool.window_work_s += work_s
        pool.window_backlogged &= backlogged
        if wall_s is not None:
            pool.window_timed_work_s += work_s
            pool.window_wall_s += wall_s
            pool.window_num_timed += 1
            pool.window_max_wall_s = max(pool.window_max_wall_s, wall_s)
        elapsed = now - pool.window_start_s
        if elapsed >= max(self.config.window_s, pool.window_max_wall_s):
            self._close_window(pool, pool.window_work_s / elapsed)
            pool.window_start_s, pool.window_work_s, pool.window_backlogged = now, 0.0, True
            pool.window_timed_work_s, pool.window_wall_s, pool.window_num_timed = 0.0, 0.0, 0
            pool.window_max_wall_s = 0.0

    def _close_window(self, pool: _Pool, rate: float) -> None:
        """A window of the pool closed having served `rate` unloaded seconds a second: that is its capacity where it
        was saturated all through it (work waited at every finish, or its stages ran `saturated_stretch` × slower);
        the first such window's rate, biased low by the stages still running at its end, is raised to the seed."""
        seed = self.capacity_s(pool)
        if pool.window_num_timed >= self.config.min_seed_stages and pool.window_timed_work_s > 0:
            pool.stretch = pool.window_wall_s / pool.window_timed_work_s
        if pool.window_backlogged or self.is_stretched(pool.stretch):
            a = self.config.smoothing
            pool.capacity = max(rate, seed or 0.0) if pool.capacity is None else a * rate + (1 - a) * pool.capacity

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
    """Earliest deadline first across both classes among on-time stages; the stages of workflows that `WorkflowTriage`
    shed, and stages that can no longer end by their deadline, behind every on-time stage of either class, interactive
    before batch among them. A late interactive stage never goes before an on-time batch stage: its own deadline is lost
    already, the batch stage's is not.

    On-time interactive stages are not put first by class: in heavy overload that gave a turn on time the pool that a
    batch workflow with an earlier deadline needed (serving/EXPERIMENTS.md). What keeps a turn's queueing short is
    that the batch-cost gate never holds one back, and that a batch stage the gate holds does not hold up the stages
    behind it (`serving.core.dispatch.HELD_BACK`).

    The starvation bounds: a late head that waited `late_max_wait_s` beats on-time work, and among late stages a batch
    head that waited `batch_max_wait_s` beats the interactive one. Which workflows are shed: the module docstring.
    """

    def __init__(self, config: SchedulerConfig):
        super().__init__(config)
        self._interactive, self._batch = TriageQueue(config), TriageQueue(config)

    def peek(self, now: float) -> StageRequest | None:
        return next(self.in_order(now), None)

    def in_order(self, now: float) -> Iterator[StageRequest]:
        inter, batch, config = self._interactive, self._batch, self.config
        inter.demote(now)
        batch.demote(now)

        on_time = (e[2] for e in heapq.merge(inter.on_time.in_order(), batch.on_time.in_order(), key=lambda e: e[0]))
        late = merge_by_wait(
            (e[2] for e in inter.late.in_order()), (e[2] for e in batch.late.in_order()), config.batch_max_wait_s, now
        )
        return merge_by_wait(on_time, late, config.late_max_wait_s, now)
