"""Maestro's order: least predicted slack first, work that can no longer make its deadline demoted behind work that can.

A stage's slack at time t is its workflow's deadline − t − the workflow's predicted remaining work (this stage's
predicted service plus its not-yet-started stages', `StageRequest.workflow_remaining_s`). Every queued stage loses slack
at the same rate, so the order by slack is the order by the static key `deadline − predicted remaining` (the "latest
start"), kept in a heap. A stage whose latest start has passed cannot make its deadline on the predictions: it moves,
once and for good (time only runs forward), to a late queue ordered by predicted remaining work, so a lost workflow
does not take a place that an on-time one could use, and ends soon when it runs. Against starvation the late head
goes first once it has waited `late_max_wait_s`, and batch work once its head has waited `batch_max_wait_s`.

Stages without a deadline (∞) have the same infinite latest start and fall back to workflow-aware predicted SRTF with
aging (`PredictedSRTFScheduler.key`), so a gateway that knows no deadlines still orders by prediction.
"""

from __future__ import annotations

from collections.abc import Iterator

from serving.core.request import StageRequest
from serving.core.scheduler.base import FIRST, LazyHeap, Scheduler, SchedulerConfig, merge_by_wait, pick


def latest_start_s(request: StageRequest, workflow_weight: float = 1.0) -> float:
    """When the stage must start to finish its workflow by the deadline on the predictions (slack = this − now)."""
    return request.deadline_s - request.pred_service_s - workflow_weight * request.workflow_remaining_s


class SlackQueue:
    """One class of work (interactive or batch): an on-time heap by latest start, a late heap by remaining work."""

    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.on_time, self.late = LazyHeap(), LazyHeap()
        self.late_requests: set[StageRequest] = set()
        self.num_demoted = 0

    def tiebreak(self, request: StageRequest) -> float:
        """Predicted remaining work with aging: the order among equal latest starts (no deadline) and in the late
        heap."""
        return request.pred_service_s + request.workflow_remaining_s + self.config.aging_per_s * request.ready_s

    def push(self, request: StageRequest, now: float) -> None:
        latest = latest_start_s(request, self.config.slack_workflow_weight)
        if self.config.demote_late and latest < now:
            self._push_late(request)
        else:
            self.on_time.push((latest, self.tiebreak(request)), request)

    def _push_late(self, request: StageRequest) -> None:
        self.late.push(self.tiebreak(request), request)
        self.late_requests.add(request)
        self.num_demoted += 1

    def demote(self, now: float) -> None:
        """Move every stage whose latest start has passed to the late heap."""
        while self.config.demote_late and (entry := self.on_time.top()) is not None and entry[0][0] < now:
            self._push_late(self.on_time.pop())

    def head(self, now: float) -> StageRequest | None:
        """The stage this class would run next (on-time first; the late head once it has waited its bound)."""
        self.demote(now)
        first, second = self.on_time.top(), self.late.top()
        side = pick(first and first[2], second and second[2], self.config.late_max_wait_s, now)
        return None if side is None else (first[2] if side is FIRST else second[2])

    def walk(self, now: float) -> Iterator[StageRequest]:
        self.demote(now)
        return merge_by_wait(
            (e[2] for e in self.on_time.in_order()),
            (e[2] for e in self.late.in_order()),
            self.config.late_max_wait_s,
            now,
        )

    def discard(self, request: StageRequest) -> None:
        if request in self.late_requests:
            self.late_requests.discard(request)
            self.late.discard(request)
        else:
            self.on_time.discard(request)

    def __len__(self) -> int:
        return len(self.on_time) + len(self.late)


class LeastSlackScheduler(Scheduler):
    """Least predicted slack first (the workflow's deadline − now − its predicted remaining work), a stage whose slack
    has run out demoted behind the on-time ones; interactive before batch.

    Why one static key orders by slack, the late queue, the starvation bounds and the order without deadlines
    (predicted SRTF): the module docstring.
    """

    def __init__(self, config: SchedulerConfig):
        super().__init__(config)
        self._interactive, self._batch = SlackQueue(config), SlackQueue(config)

    @property
    def num_demoted(self) -> int:
        """Stages moved behind on-time work because their latest start had passed."""
        return self._interactive.num_demoted + self._batch.num_demoted

    def add(self, request: StageRequest, now: float) -> None:
        (self._interactive if request.interactive else self._batch).push(request, now)

    def peek(self, now: float) -> StageRequest | None:
        head_i, head_b = self._interactive.head(now), self._batch.head(now)
        side = pick(head_i, head_b, self.config.batch_max_wait_s, now)
        return None if side is None else (head_i if side is FIRST else head_b)

    def pop(self, now: float) -> StageRequest | None:
        request = self.peek(now)
        if request is not None:
            self.remove(request)
        return request

    def in_order(self, now: float) -> Iterator[StageRequest]:
        return merge_by_wait(self._interactive.walk(now), self._batch.walk(now), self.config.batch_max_wait_s, now)

    def remove(self, request: StageRequest) -> None:
        (self._interactive if request.interactive else self._batch).discard(request)

    def __len__(self) -> int:
        return len(self._interactive) + len(self._batch)
