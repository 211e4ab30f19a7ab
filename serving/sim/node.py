"""One simulated GPU node: a continuous-batching clock, its KV allocator, queue, residency and tool CPUs.

The node keeps a *virtual step clock* V: every running sequence gains one token per engine step,
and a step lasts `step_s` (cost model, from the current batch). A stage that needs n more tokens
finishes when V has advanced by n, so one heap keyed by V gives every node's next event, and a
batch change only changes how fast V runs. Prefills stall decoding (their GPU time is serial).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, OrderedDict, deque
from typing import TYPE_CHECKING

from serving.core.admission import AIMDConfig, AIMDWindow, CapKind, SessionCap, SessionWindow
from serving.core.dispatch import DispatchConfig, DispatchCore, Router
from serving.core.kv import KVAllocator, KVAllocatorConfig
from serving.core.residency import NodeResidency
from serving.core.routing import FitnessConfig
from serving.core.scheduler import SchedulerConfig, create_scheduler
from serving.sim.costmodel import CostModel
from serving.sim.hostcpu import HostCPU
from serving.sim.prefixcache import PrefixCache

if TYPE_CHECKING:
    from serving.core.systems import System
    from serving.sim.engine import ClusterConfig

FINISH, GROW = 0, 1
PACE_WINDOW_S = 10.0  # the measured pace is the step clock's rate over about this long
_TIE = itertools.count()


class SimNode:
    """One node; its queue is a dispatch core (serving/core/dispatch.py) over this node."""

    def __init__(
        self, index: int, cost: CostModel, cluster: ClusterConfig, system: System, is_live=lambda request, now: True
    ):
        self.index = index
        self.name = f"node{index}"
        self.cost = cost
        self.alloc = KVAllocator(KVAllocatorConfig(cluster.kv_pool_bytes, cluster.page_bytes, cluster.overcommit))
        self.sched = create_scheduler(SchedulerConfig(policy=system.scheduler))
        self.residency = NodeResidency(cluster.residency, {m: p.weight_bytes for m, p in cost.config.models.items()})
        self.num_tool_workers = cluster.num_tool_workers
        self.cap = self._make_cap(CapKind(system.cap), cluster.aimd, cluster.num_tool_workers)
        self.core = DispatchCore(self.sched, node_dispatch_config(system.router, cluster.fitness), self.cap, is_live)
        self.host = HostCPU(cluster.host_cpu, cluster.num_tool_workers)
        self.cache = PrefixCache(cluster.prefix_caching)
        self.running: dict = {}  # stage -> None, in start order (the preemption order)
        self.pinned: OrderedDict = OrderedDict()  # stage whose tool runs -> its kept Reservation
        self.queued_work_s = 0.0
        self.num_batch_changes = 0  # starts and ends of running stages (what a view of the batch is valid for)
        self.version = 0
        self.is_control_armed = False
        self._vheap: list = []
        self._pace_marks: deque[tuple[float, float]] = deque()  # (time, V) while stages run
        self.v = 0.0
        self.last_s = 0.0
        self.stall_end_s = 0.0
        self._weight_s = 0.0
        self._kv_bytes = 0.0
        self._models = Counter()

    def _make_cap(self, kind: CapKind, aimd: AIMDConfig, num_tool_workers: int) -> SessionCap | None:
        if kind is CapKind.AIMD:
            return SessionWindow(AIMDWindow(aimd, num_tool_workers), lambda: self.alloc.usage)
        return None

    # --- the step clock -------------------------------------------------------------------
    def step_s(self) -> float:
        return self.cost.step_s(self._weight_s, self._kv_bytes, self.host.engine_slowdown())

    def advance(self, now: float) -> None:
        if now > self.last_s:
            if self.running:
                active = now - max(self.last_s, self.stall_end_s)
                if active > 0:
                    self.v += active / self.step_s()
                self._mark_pace(now)
            self.last_s = now

    def _mark_pace(self, now: float) -> None:
        marks = self._pace_marks
        marks.append((now, self.v))
        while len(marks) > 2 and marks[1][0] <= now - PACE_WINDOW_S:
            marks.popleft()

    def pace_s_per_token(self, now: float) -> float:
        """Seconds a running stage takes per output token lately, prefill stalls included (the step time if too
        little has run to tell): what the engine's token stream would show."""
        if self._pace_marks:
            t0, v0 = self._pace_marks[0]
            dv = self.v_at(now) - v0
            if dv >= 1.0:
                return max(self.step_s(), (now - t0) / dv)
        return self.step_s()

    def v_at(self, now: float) -> float:
        """The step clock at `now` (without advancing it)."""
        active = now - max(self.last_s, self.stall_end_s)
        return self.v + active / self.step_s() if self.running and active > 0 else self.v

    def stall(self, now: float, seconds: float) -> float:
        """Serialise `seconds` of GPU work (a prefill, a model load); returns when it ends."""
        self.stall_end_s = max(now, self.stall_end_s) + seconds
        return self.stall_end_s

    def next_event_s(self) -> float | None:
        heap = self._vheap
        while heap and heap[0][3].epoch != heap[0][4]:
            heapq.heappop(heap)
        if not heap:
            return None
        return max(self.last_s, self.stall_end_s) + max(0.0, heap[0][0] - self.v) * self.step_s()

    def pop_due(self) -> list[tuple[int, object, int]]:
        due, heap = [], self._vheap
        while heap and (heap[0][3].epoch != heap[0][4] or heap[0][0] <= self.v + 1e-6):
            _, _, kind, stage, epoch = heapq.heappop(heap)
            if stage.epoch == epoch:
                due.append((kind, stage, epoch))
        return due

    def at_tokens(self, stage, num_tokens: float, kind: int) -> None:
        heapq.heappush(self._vheap, (stage.v_start + num_tokens, next(_TIE), kind, stage, stage.epoch))

    # --- the batch --------------------------------------------------------------------------
    def add_running(self, stage, context_tokens: int) -> None:
        model = self.cost.model(stage.model)
        if self._models[stage.model] == 0:
            self._weight_s += self.cost.weight_read_s(model)
        self._models[stage.model] += 1
        self._kv_bytes += context_tokens * model.kv_bytes_per_token
        stage.v_start = self.v
        self.running[stage] = context_tokens
        self.num_batch_changes += 1

    def remove_running(self, stage) -> None:
        model = self.cost.model(stage.model)
        context_tokens = self.running.pop(stage)
        self._kv_bytes = max(0.0, self._kv_bytes - context_tokens * model.kv_bytes_per_token)
        self._models[stage.model] -= 1
        if self._models[stage.model] == 0:
            self._weight_s -= self.cost.weight_read_s(model)
        stage.epoch += 1  # invalidates its pending V-events
        self.num_batch_changes += 1
        if not self.running:
            self._pace_marks.clear()  # an idle node's pace is measured afresh

    def busy_models(self) -> set[str]:
        return {m for m, n in self._models.items() if n > 0}

    def other_context_tokens(self) -> int:
        return int(sum(self.running.values()))

    def release(self, stage, reservation) -> None:
        """Free a stage's KV; its pages stay in the prefix cache, keyed by the stage, until overwritten."""
        num_pages = reservation.mapped_pages
        self.alloc.release(reservation)
        self.cache.put(stage, num_pages)

    def num_tool_jobs(self) -> int:
        return self.host.num_jobs()


def node_dispatch_config(router: Router, fitness: FitnessConfig) -> DispatchConfig:
    """The gateway's dispatch rules (backfill included) on one node's queue, and the system's router."""
    return DispatchConfig(router=router, fitness=fitness)
