"""The scheduling policies. Each is a few lines: what its key is, and (for two) how queues combine."""
from __future__ import annotations

from serving.request import StageRequest
from serving.scheduler.base import KeyedScheduler, LazyHeap, Scheduler, SchedulerConfig


class FCFSScheduler(KeyedScheduler):
    """First come, first served, by the time the stage became ready."""

    def key(self, request: StageRequest):
        return request.ready_s


class EDFScheduler(KeyedScheduler):
    """Earliest deadline first; the deadline is the workflow's arrival + its app's SLO."""

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


class MaestroScheduler(Scheduler):
    """Workflow-aware SRTF on *predicted* remaining time, interactive before batch, with aging.

    Key = this stage's predicted time + w · the workflow's predicted remaining time − α · wait.
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
        return remaining + c.aging_per_s * request.ready_s

    def add(self, request: StageRequest, now: float) -> None:
        (self._interactive if request.interactive else self._batch).push(self.key(request), request)

    def _queue(self, now: float) -> LazyHeap | None:
        head_i, head_b = self._interactive.top(), self._batch.top()
        if head_b is None:
            return self._interactive if head_i else None
        if head_i is None or now - head_b[2].ready_s >= self.config.batch_max_wait_s:
            return self._batch
        return self._interactive

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
        return next((i for i, bound in enumerate(self.config.mars_level_bounds_tokens) if prefill <= bound),
                    len(self.config.mars_level_bounds_tokens))

    def add(self, request: StageRequest, now: float) -> None:
        self._levels[self.level(request)].push((-request.attained_service_s, request.ready_s), request)

    def _best(self, now: float) -> LazyHeap | None:
        best, best_key = None, None
        for level, heap in enumerate(self._levels):
            entry = heap.top()
            if entry is None:
                continue
            boosted = max(0, level - int((now - entry[2].ready_s) // self.config.mars_boost_s))
            key = (boosted, entry[0])
            if best_key is None or key < best_key:
                best, best_key = heap, key
        return best

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
