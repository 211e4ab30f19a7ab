"""The scheduling policies. Each is a few lines: what its key is, and (for two) how queues combine."""

from __future__ import annotations

from collections.abc import Iterator

from serving.core.request import StageRequest
from serving.core.scheduler.base import FIRST, KeyedScheduler, LazyHeap, Scheduler, SchedulerConfig, merge_by_wait, pick


class FCFSScheduler(KeyedScheduler):
    """First come, first served, by the time the stage became ready."""

    def key(self, request: StageRequest):
        return request.ready_s


class EDFScheduler(KeyedScheduler):
    """Earliest deadline first; the deadline is the workflow's arrival + its SLO."""

    def key(self, request: StageRequest):
        return (request.deadline_s, request.ready_s)


class SRTFScheduler(KeyedScheduler):
    """SRTF without prediction: least service attained by the workflow first (LAS)."""

    def key(self, request: StageRequest):
        return (request.attained_service_s, request.ready_s)


class ContinuumScheduler(KeyedScheduler):
    """Continuum's program-level FCFS: preempted first, then programs with pinned KV, then the rest."""

    def key(self, request: StageRequest):
        rank = 0 if request.is_preempted else (1 if request.is_kv_pinned else 2)
        return (rank, request.workflow_arrival_s, request.ready_s)


class PredictedSRTFScheduler(Scheduler):
    """Workflow-aware SRTF on *predicted* remaining time, interactive before batch, with aging.

    Key = this stage's predicted time + w · the workflow's predicted remaining time − v · the service the
    workflow already received − α · wait (v = `attained_weight`, 0 unless set: the gateway cannot predict
    what remains of a workflow, and with v > 0 it finishes workflows in progress before starting new ones).
    Interactive work goes first unless the batch head has waited `batch_max_wait_s`, so batch
    work cannot starve. Preemption happens only at stage boundaries: a popped stage runs to its
    end, and the workflow's next stage queues afresh.
    """

    def __init__(self, config: SchedulerConfig):
        super().__init__(config)
        self._interactive = LazyHeap()
        self._batch = LazyHeap()

    def key(self, request: StageRequest) -> float:
        c = self.config
        remaining = request.pred_service_s + c.workflow_weight * request.workflow_remaining_s
        return remaining - c.attained_weight * request.attained_service_s + c.aging_per_s * request.ready_s

    def add(self, request: StageRequest, now: float) -> None:
        (self._interactive if request.interactive else self._batch).push(self.key(request), request)

    def _queue(self, now: float) -> LazyHeap | None:
        head_i, head_b = self._interactive.top(), self._batch.top()
        first = pick(head_i and head_i[2], head_b and head_b[2], self.config.batch_max_wait_s, now)
        return None if first is None else (self._interactive if first is FIRST else self._batch)

    def in_order(self, now: float) -> Iterator[StageRequest]:
        return merge_by_wait(
            (e[2] for e in self._interactive.in_order()),
            (e[2] for e in self._batch.in_order()),
            self.config.batch_max_wait_s,
            now,
        )

    def peek(self, now: float) -> StageRequest | None:
        queue = self._queue(now)
        return queue.top()[2] if queue else None

    def pop(self, now: float) -> StageRequest | None:
        queue = self._queue(now)
        return queue.pop() if queue else None

    def remove(self, request: StageRequest) -> None:
        (self._interactive if request.interactive else self._batch).discard(request)

    def __len__(self) -> int:
        return len(self._interactive) + len(self._batch)


class MARSScheduler(Scheduler):
    """MARS's agent-centric priority: low initial KV, high accumulated service, long wait first.

    Level by the prefill the stage needs (≤2048 → 0, ≤8192 → 1, ≤32768 → 2, else 3, the authors'
    defaults); within a level, the session with the most attained service first, then the
    longest waiting. Waiting boosts one level per `mars_boost_s`; the boost is applied to the head
    of each level (O(levels) per decision), which is where starvation would show.
    """

    def __init__(self, config: SchedulerConfig):
        super().__init__(config)
        self._levels = [LazyHeap() for _ in range(len(config.mars_level_bounds_tokens) + 1)]

    def level(self, request: StageRequest) -> int:
        prefill = request.prompt_tokens
        return next(
            (i for i, bound in enumerate(self.config.mars_level_bounds_tokens) if prefill <= bound),
            len(self.config.mars_level_bounds_tokens),
        )

    def add(self, request: StageRequest, now: float) -> None:
        self._levels[self.level(request)].push((-request.attained_service_s, request.ready_s), request)

    def _best_level(self, heads: list[tuple | None], now: float) -> int | None:
        """The level whose head (boosted for its wait) goes next."""
        best, best_key = None, None
        for level, entry in enumerate(heads):
            if entry is None:
                continue
            boosted = max(0, level - int((now - entry[2].ready_s) // self.config.mars_boost_s))
            key = (boosted, entry[0])
            if best_key is None or key < best_key:
                best, best_key = level, key
        return best

    def _best(self, now: float) -> LazyHeap | None:
        level = self._best_level([heap.top() for heap in self._levels], now)
        return None if level is None else self._levels[level]

    def in_order(self, now: float) -> Iterator[StageRequest]:
        walks = [heap.in_order() for heap in self._levels]
        heads = [next(walk, None) for walk in walks]
        while (level := self._best_level(heads, now)) is not None:
            yield heads[level][2]
            heads[level] = next(walks[level], None)

    def peek(self, now: float) -> StageRequest | None:
        heap = self._best(now)
        return heap.top()[2] if heap else None

    def pop(self, now: float) -> StageRequest | None:
        heap = self._best(now)
        return heap.pop() if heap else None

    def remove(self, request: StageRequest) -> None:
        self._levels[self.level(request)].discard(request)

    def __len__(self) -> int:
        return sum(len(h) for h in self._levels)
