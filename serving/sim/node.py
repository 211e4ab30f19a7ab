"""One simulated GPU node: a continuous-batching clock, its KV allocator, queue, residency and tool CPUs.

The node keeps a *virtual step clock* V that counts engine steps: every decoding sequence gains one token per step,
and a step lasts `step_s`, the cost model's price of what the step carries (serving/sim/steps.py: the decodes, then
the chunks of the prefills under way while vLLM's token budget lasts). A stage that needs n more tokens finishes when
V has advanced by n, a prefill when V reaches its last chunk's step, so one heap keyed by V (and the prefills' ends)
gives every node's next event, and a batch change only changes how fast V runs. A prefill slows the decodes beside it
(its chunks make their steps dearer); only a model load stalls the node.
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
from serving.sim.steps import StepBuilder

if TYPE_CHECKING:
    from serving.core.systems import System
    from serving.sim.engine import ClusterConfig

FINISH, GROW, PREFILLED = 0, 1, 2
HOLD_TOLERANCE_STEPS = 1e-6  # a step clock this close to the end of a preempting step has passed it
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
        overcommit = system.reservation.virtual_overcommit(cluster.overcommit)
        self.alloc = KVAllocator(KVAllocatorConfig(cluster.kv_pool_bytes, cluster.page_bytes, overcommit))
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
        self.steps = StepBuilder(cluster.token_budget)
        self.starts_held_until_v = float("-inf")  # vLLM schedules no waiting request in a step that preempted
        self._step_s: dict[bool, tuple[tuple[int, float], float]] = {}  # is bare -> ((batch changes, slowdown), price)
        self._models = Counter()

    def _make_cap(self, kind: CapKind, aimd: AIMDConfig, num_tool_workers: int) -> SessionCap | None:
        return SessionWindow.of(kind, AIMDWindow(aimd, num_tool_workers), lambda: self.alloc.usage)

    # --- the step clock -------------------------------------------------------------------
    def price_s(self, loads) -> float:
        """Seconds of one step carrying `loads` on this node now (`CostModel.step_time_s`)."""
        return self.cost.step_time_s(loads, self.host.engine_slowdown())

    def step_s(self) -> float:
        """The price of the step the node runs now: its decodes and the chunks of its prefills under way."""
        return self._cached_step_s(not self.steps.prefills)  # without prefills, the bare decode step

    def decode_step_s(self) -> float:
        """The bare decode step: the price of a step in which every running stage decodes, none prefills."""
        return self._cached_step_s(True)

    def _cached_step_s(self, is_bare: bool) -> float:
        key, cached = (self.num_batch_changes, self.host.engine_slowdown()), self._step_s.get(is_bare)
        if cached is None or cached[0] != key:
            loads = self.steps.bare_loads() if is_bare else self.steps.loads()
            cached = self._step_s[is_bare] = (key, self.price_s(loads))
        return cached[1]

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
        """Seconds a running stage takes per output token lately, the prefills beside it and the stalls included
        (the bare decode step if too little has run to tell): what the engine's token stream would show."""
        step_s = self.decode_step_s()
        if self._pace_marks:
            t0, v0 = self._pace_marks[0]
            dv = self.v_at(now) - v0
            if dv >= 1.0:
                return max(step_s, (now - t0) / dv)
        return step_s

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
        next_v = min(heap[0][0] if heap else float("inf"), self.steps.next_end_v())
        # (within the tolerance `may_start` reads the hold with: an event a float's rounding ahead would not move the
        # clock, and would come back at the same instant for ever)
        if self.running and self.starts_held_until_v > self.v + HOLD_TOLERANCE_STEPS and len(self.core):
            next_v = min(next_v, self.starts_held_until_v)  # the step after a preemption may start the queue
        if next_v == float("inf"):
            return None
        return max(self.last_s, self.stall_end_s) + max(0.0, next_v - self.v) * self.step_s()

    def pop_due(self) -> list[tuple[int, object, int]]:
        """The events due at the step clock's value: prefills that ended, then decodes that finish or must grow."""
        due, heap = [(PREFILLED, stage, stage.epoch) for stage in self.steps.due(self.v)], self._vheap
        while heap and (heap[0][3].epoch != heap[0][4] or heap[0][0] <= self.v + 1e-6):
            _, _, kind, stage, epoch = heapq.heappop(heap)
            if stage.epoch == epoch:
                due.append((kind, stage, epoch))
        return due

    def at_tokens(self, stage, num_tokens: float, kind: int) -> None:
        heapq.heappush(self._vheap, (stage.v_start + num_tokens, next(_TIE), kind, stage, stage.epoch))

    # --- the batch --------------------------------------------------------------------------
    def add_running(self, stage, context_tokens: int, cached_tokens: int = 0) -> None:
        """Start a stage: it prefills its context less what its KV already holds, in chunks, then decodes."""
        self._models[stage.model] += 1
        stage.v_start = self.v
        self.running[stage] = context_tokens
        self.steps.start_prefill(stage, stage.model, context_tokens, cached_tokens, self.v)
        self.num_batch_changes += 1

    def end_prefill(self, stage) -> bool:
        """The stage's last chunk ran (it sampled its first token): it decodes from now; False if it is not due."""
        if not self.steps.end_prefill(stage, self.v):
            return False
        stage.v_start = self.v - 1.0
        self.num_batch_changes += 1
        return True

    def hold_starts(self) -> None:
        """A step preempted: no stage starts before the next step (vLLM's scheduler admits none in that step)."""
        self.starts_held_until_v = self.v + 1.0

    def may_start(self, now: float) -> bool:
        """False during a step that preempted (an idle node's next step is now)."""
        return not self.running or self.v_at(now) >= self.starts_held_until_v - HOLD_TOLERANCE_STEPS

    def is_prefilling(self, stage) -> bool:
        return stage in self.steps.prefills

    def produced_tokens(self, stage, v: float) -> float:
        """Output tokens a running stage has produced since it started here, at step clock value `v`."""
        return 0.0 if self.is_prefilling(stage) else v - stage.v_start

    def remove_running(self, stage) -> None:
        context_tokens = self.running.pop(stage)
        if self.is_prefilling(stage):
            self.steps.drop_prefill(stage, self.v)
        else:
            self.steps.settle(self.v)
            self.steps.set_decode(stage.model, context_tokens, -1)
        self._models[stage.model] -= 1
        stage.epoch += 1  # invalidates its pending V-events
        self.num_batch_changes += 1
        if not self.running:
            self._pace_marks.clear()  # an idle node's pace is measured afresh

    # --- the next steps, as the batch-cost gate reads them ------------------------------------
    def prefill_backlog_s(self, now: float) -> float:
        """What the stalls (a model load) and the prefills under way still add to every decode's time."""
        return max(0.0, self.stall_end_s - now) + self.steps.backlog_s(self.price_s, self.v_at(now))

    def added_prefill_s(self, model: str, context_tokens: int, cached_tokens: int, now: float) -> float:
        """What a prefill started now adds to the steps it shares with the running decodes."""
        return self.steps.added_prefill_s(self.price_s, model, context_tokens, cached_tokens, self.v_at(now))

    def added_decode_s(self, model: str, context_tokens: float) -> float:
        """What one more decode of `context_tokens` adds to each decode step."""
        return self.steps.added_decode_s(self.price_s, model, context_tokens)

    def busy_models(self) -> set[str]:
        return {m for m, n in self._models.items() if n > 0}

    def models_in_use(self) -> set[str]:
        """Models whose work is under way here: a stage running, a session's context kept over its tool call, or a
        tool call on this host (its session's next stage comes back here)."""
        return self.busy_models() | {stage.model for stage in self.pinned} | {job.model for job in self.host.jobs()}

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
