"""The scheduler contract: policies by name behind one interface, O(log n) per decision.

A policy orders ready stages; it never touches KV pages or nodes (admission and the allocator do).
All policies here are heaps with lazy deletion: `remove` marks a request, `pop`/`peek` skip it.
`peek_n(now, k)` lists the next k in the order `pop` would give them (the gateway's backfill).
Aging is folded into static keys (key − α·wait = key + α·ready_s − α·now, and the −α·now term
is common to everyone), so aging never needs a re-heapify.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

from serving.core.request import StageRequest


class Policy(enum.Enum):
    FCFS = "fcfs"
    EDF = "edf"
    SRTF = "srtf"  # least attained service: no prediction
    LEAST_SLACK = "least-slack"  # least predicted slack: deadline − predicted remaining work (slack.py)
    TRIAGE = "triage"  # deadline order, workflows the pool cannot also carry shed behind (Moore–Hodgson, triage.py)
    PREDICTED_SRTF = "predicted-srtf"  # workflow-aware SRTF on predicted remaining work
    MARS = "mars"
    CONTINUUM = "continuum"


@dataclass
class SchedulerConfig:
    """Knobs of the policies; each policy reads only its own."""

    policy: str = "fcfs"
    aging_per_s: float = 0.05  # seconds of predicted work forgiven per second waited (both predicted-work orders)
    batch_max_wait_s: float = 60.0  # a batch head waiting this long beats interactive work (both)
    workflow_weight: float = 0.5  # predicted-srtf: weight of the workflow's remaining work vs this stage
    # predicted-srtf: seconds of key taken off per second of service the workflow already received; with it, workflows
    # in progress finish before new ones start.
    attained_weight: float = 0.0
    late_max_wait_s: float = 30.0  # maestro: a demoted (late) head waiting this long goes before on-time work
    demote_late: bool = True  # maestro: work whose latest start has passed goes behind on-time work
    # maestro: weight of the workflow's predicted remaining work (its app's history) in its slack; 0: the stage's own
    # (the history's mean misjudged single workflows and cost SLOs on the replayed traces: serving/EXPERIMENTS.md)
    slack_workflow_weight: float = 0.0
    mars_level_bounds_tokens: tuple[int, ...] = (2048, 8192, 32768)  # MARS prefill levels
    mars_boost_s: float = 30.0  # MARS: one level up per this many seconds unscheduled

    def __post_init__(self):
        if isinstance(self.policy, Policy):
            self.policy = self.policy.value
        if self.policy not in {p.value for p in Policy}:
            raise ValueError(
                f"unknown scheduling policy '{self.policy}'; known policies: {', '.join(p.value for p in Policy)}"
            )
        if self.aging_per_s < 0 or self.attained_weight < 0:
            raise ValueError("aging_per_s and attained_weight must be >= 0")
        if self.batch_max_wait_s <= 0 or self.mars_boost_s <= 0 or self.late_max_wait_s <= 0:
            raise ValueError("batch_max_wait_s, late_max_wait_s and mars_boost_s must be > 0")

    @property
    def is_workflow_order(self) -> bool:
        """Whether the policy puts workflows further along (earlier, more served) first, rather than ordering stages."""
        return self.policy in (Policy.CONTINUUM.value, Policy.MARS.value) or (
            self.policy == Policy.PREDICTED_SRTF.value and self.attained_weight > 0
        )


class Scheduler(ABC):
    """Orders ready stages. `pop(now)` returns the next to run, or None when empty."""

    def __init__(self, config: SchedulerConfig):
        self.config = config

    @abstractmethod
    def add(self, request: StageRequest, now: float) -> None: ...

    @abstractmethod
    def peek(self, now: float) -> StageRequest | None: ...

    @abstractmethod
    def pop(self, now: float) -> StageRequest | None: ...

    @abstractmethod
    def in_order(self, now: float) -> Iterator[StageRequest]:
        """Queued requests in the order successive `pop(now)` calls would return them, without removing any."""

    def peek_n(self, now: float, k: int) -> list[StageRequest]:
        """The next `k` requests in policy order (O(k log k) beyond skipping removed entries)."""
        return list(itertools.islice(self.in_order(now), k))

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def remove(self, request: StageRequest) -> None:
        """Withdraw a queued request (lazy: it is skipped when it reaches the top)."""


# Sequence numbers are unique across heaps, so a stale entry in one heap never matches a live one in another.
_SEQ = itertools.count()


class LazyHeap:
    """A min-heap of (key, seq, request); an entry is live only while request.queue_seq == seq."""

    def __init__(self):
        self._heap: list = []
        self.num_live = 0

    def push(self, key, request: StageRequest) -> None:
        if request.queue_seq >= 0:
            raise RuntimeError(f"stage {request.workflow_id}/{request.stage_id} queued twice")
        request.queue_seq = seq = next(_SEQ)
        heapq.heappush(self._heap, (key, seq, request))
        self.num_live += 1

    def top(self) -> tuple | None:
        heap = self._heap
        while heap and heap[0][2].queue_seq != heap[0][1]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def pop(self) -> StageRequest | None:
        entry = self.top()
        if entry is None:
            return None
        heapq.heappop(self._heap)
        self.num_live -= 1
        entry[2].queue_seq = -1
        return entry[2]

    def in_order(self) -> Iterator[tuple]:
        """Live entries smallest first: a best-first walk of the heap's tree (O(log k) per entry), after dropping the
        removed entries at the top (as `top` does, so a queue only ever walked does not pile them up).

        Do not push or pop while iterating; `discard` is safe (it only marks).
        """
        self.top()
        heap = self._heap
        frontier = [(heap[0], 0)] if heap else []
        while frontier:
            entry, index = heapq.heappop(frontier)
            for child in (2 * index + 1, 2 * index + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
            if entry[2].queue_seq == entry[1]:
                yield entry

    def discard(self, request: StageRequest) -> None:
        if request.queue_seq < 0:
            raise RuntimeError(f"stage {request.workflow_id}/{request.stage_id} is not queued")
        request.queue_seq = -1
        self.num_live -= 1

    def __len__(self) -> int:
        return self.num_live


FIRST, SECOND = "first", "second"


def pick(first: StageRequest | None, second: StageRequest | None, max_wait_s: float, now: float) -> str | None:
    """Which of two queue heads goes next: the first queue's (interactive, on-time work), unless it is empty or the
    second's head (batch, late work) has waited `max_wait_s` since it became ready, so the second never starves."""
    if second is None:
        return None if first is None else FIRST
    return SECOND if first is None or now - second.ready_s >= max_wait_s else FIRST


def merge_by_wait(
    first: Iterator[StageRequest], second: Iterator[StageRequest], max_wait_s: float, now: float
) -> Iterator[StageRequest]:
    """Two queues' walks merged as successive `pick`s would take their heads."""
    head_1, head_2 = next(first, None), next(second, None)
    while head_1 is not None or head_2 is not None:
        if pick(head_1, head_2, max_wait_s, now) is FIRST:
            yield head_1
            head_1 = next(first, None)
        else:
            yield head_2
            head_2 = next(second, None)


class KeyedScheduler(Scheduler):
    """One heap ordered by a static per-request key: FCFS, EDF, SRTF, Continuum."""

    def __init__(self, config: SchedulerConfig):
        super().__init__(config)
        self._heap = LazyHeap()

    @abstractmethod
    def key(self, request: StageRequest):
        """Smaller runs first; must not depend on the current time."""

    def add(self, request: StageRequest, now: float) -> None:
        self._heap.push(self.key(request), request)

    def peek(self, now: float) -> StageRequest | None:
        entry = self._heap.top()
        return entry[2] if entry else None

    def pop(self, now: float) -> StageRequest | None:
        return self._heap.pop()

    def in_order(self, now: float) -> Iterator[StageRequest]:
        return (entry[2] for entry in self._heap.in_order())

    def remove(self, request: StageRequest) -> None:
        self._heap.discard(request)

    def __len__(self) -> int:
        return len(self._heap)


def create_scheduler(config: SchedulerConfig | Policy | str) -> Scheduler:
    """Build the scheduler for a policy name; ValueError names the known policies."""
    from serving.core.scheduler import policies, slack, triage

    config = config if isinstance(config, SchedulerConfig) else SchedulerConfig(policy=config)
    classes = {
        Policy.FCFS: policies.FCFSScheduler,
        Policy.EDF: policies.EDFScheduler,
        Policy.SRTF: policies.SRTFScheduler,
        Policy.LEAST_SLACK: slack.LeastSlackScheduler,
        Policy.TRIAGE: triage.TriageScheduler,
        Policy.PREDICTED_SRTF: policies.PredictedSRTFScheduler,
        Policy.MARS: policies.MARSScheduler,
        Policy.CONTINUUM: policies.ContinuumScheduler,
    }
    return classes[Policy(config.policy)](config)
