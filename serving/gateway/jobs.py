"""The gateway's async shell around the dispatch core (serving/core/dispatch.py): futures, recheck timer, errors.

A `Job` is one stage's call. `submit` queues it (bounded) in the core, whose policy order, workflow cap, bounded
backfill and node choice by fitness decide which stage starts where; `pump` applies the core's decisions: a start
reserves the stage's KV blocks on its node, with the admission the node gave the core, and wakes its handler. Each
gateway `Node` is shown to the core through a `NodeSlot` (may this stage start here now, and the node's fitness terms).
Failures are explicit: `Full` (queue bound), `NoNode` (nothing healthy / the stage can never fit)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from maestro.prediction import Prediction
from serving.core.admission.batch_cost import BatchCostGate
from serving.core.admission.cap import CapSignals, SessionCap
from serving.core.dispatch import HELD_BACK, DispatchConfig, DispatchCore, Outcome, Router
from serving.core.kv import Reservation
from serving.core.request import StageRequest
from serving.core.routing import FitnessConfig
from serving.core.scheduler import Scheduler
from serving.gateway import batch_gate
from serving.gateway.metadata import StageMeta
from serving.gateway.nodes import Admission, Node


class Full(Exception):
    """The gateway queue is at its bound: answer 429 with Retry-After."""


class NoNode(Exception):
    """No healthy node can take this stage: answer 503 (or 413 when it can never fit)."""

    def __init__(self, message: str, status: int = 503):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Arrival:
    """When a call was read, before anything else (its prediction included), on both clocks."""

    monotonic_s: float
    unix_s: float

    @classmethod
    def now(cls) -> Arrival:
        return cls(time.monotonic(), time.time())


@dataclass(eq=False)
class Job:
    """One stage's call on its way through the gateway."""

    meta: StageMeta
    request: StageRequest
    reserve_tokens: int
    prediction: Prediction | None = None  # None for a call refused before it was predicted
    prediction_source: str = ""  # maestro.prediction.Source: "model", or why the prior answered
    predict_s: float = 0.0  # time the prediction took, deadline included
    future: asyncio.Future | None = None
    arrival: Arrival = field(default_factory=Arrival.now)  # the call's arrival: trace times, span and workflow start
    enqueued_s: float = field(default_factory=time.monotonic)
    node: Node | None = None
    reservation: Reservation | None = None
    excluded: set[str] = field(default_factory=set)  # nodes that failed this stage
    last_error: str = ""  # how the last attempt failed ("node: reason")
    num_attempts: int = 0
    queue_s: float = 0.0
    in_cap: bool = False  # counted as queued/running by the workflow cap
    prompt_chars: int = 0  # what the prompt-token estimate was made from, to calibrate it on vLLM's count
    num_messages: int = 0
    deadline_s: float | None = None  # monotonic; past it the stage fails with 504 (GatewayConfig.request_timeout_s)
    span: object = None  # the stage's OpenTelemetry span from its dispatch on, with otel_spans (spans.StageSpans)
    was_backlogged: bool = False  # a stage waited in the queue when this one gave its node back (triage's capacity)
    started_s: float | None = None  # the dispatcher's clock when its last attempt started on a node
    unseen_reserve: object = None  # its reserve's `sizing.UnseenReserve` where answered for an unseen app

    def remaining_s(self) -> float | None:
        """Seconds left before the stage's deadline (0 once past it); None without a deadline."""
        return None if self.deadline_s is None else max(0.0, self.deadline_s - time.monotonic())


class NodeSlot:
    """A gateway `Node` as the dispatch core sees it (`admission.dispatch.NodeView`)."""

    def __init__(
        self,
        node: Node,
        count_refusals: bool = True,
        gate: BatchCostGate | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.node, self.name, self.count_refusals, self.gate, self.clock = node, node.name, count_refusals, gate, clock

    def admit(self, request: StageRequest) -> Admission | None:
        """The node's admission of the stage now; None where it may not start here (failed here before, refused by
        the node), `HELD_BACK` where Maestro's batch-cost gate holds it back."""
        job: Job = request.payload
        if self.node.name in job.excluded:
            return None
        now = self.clock()
        admission = self.node.admit(
            request.prompt_tokens, job.reserve_tokens - request.prompt_tokens, now, count_refusal=self.count_refusals
        )
        if not admission.is_admitted:
            return None
        if self.gate is not None and batch_gate.refusal(self.gate, self.node, request, now) is not None:
            return HELD_BACK
        return admission

    def may_fit_later(self, request: StageRequest) -> bool:
        node, job = self.node, request.payload
        return (
            node.is_healthy
            and node.name not in job.excluded
            and (node.kv.allocator is None or node.can_ever_fit(job.reserve_tokens))
        )

    def fitness_terms(self, request: StageRequest) -> tuple[float, float, float]:
        node = self.node
        return node.kv.num_free_blocks / max(1, node.kv.num_blocks), self.load(), node.vllm.num_waiting

    def load(self) -> float:
        return self.node.num_inflight + self.node.vllm.num_waiting


class Dispatcher:
    def __init__(
        self,
        scheduler: Scheduler,
        nodes: list[Node],
        max_queued: int,
        fitness: FitnessConfig | None = None,
        backfill_depth: int = 8,
        backfill_max_overtaken: int = 4,
        recheck_s: float = 0.02,
        cap: SessionCap | None = None,
        batch_cost: BatchCostGate | None = None,
        router: Router = Router.FITNESS,
        clock: Callable[[], float] = time.monotonic,
    ):
        config = DispatchConfig(backfill_depth, backfill_max_overtaken, router, fitness or FitnessConfig())
        self.core = DispatchCore(scheduler, config, cap, is_live=lambda request, now: not request.payload.future.done())
        self.scheduler, self.nodes, self.max_queued, self.cap = scheduler, nodes, max_queued, cap
        self.recheck_s = recheck_s
        self.clock = clock  # monotonic seconds: when stages queue, start and are judged
        self.batch_cost = batch_cost  # Maestro's gate on what a stage costs a node's running stages (batch_gate.py)
        self._recheck: asyncio.TimerHandle | None = None
        self.num_dispatched = 0

    @property
    def num_backfilled(self) -> int:
        return self.core.num_backfilled

    def submit(self, job: Job, front: bool = False) -> None:
        """Queue a job (a retry keeps its original ready time, so it goes ahead of later work)."""
        if not front and len(self.core) >= self.max_queued:
            raise Full(f"gateway queue full ({self.max_queued} stages waiting)")
        self._check_placeable(job)
        job.enqueued_s = self.clock()
        if self.cap is not None and not job.in_cap:
            job.in_cap = True
            self.cap.enter(job.request.workflow_id, job.request.workflow_arrival_s)
        self.core.add(job.request, job.enqueued_s)
        self.pump()

    def withdraw(self, job: Job) -> None:
        """A queued job whose client went away."""
        self.core.remove(job.request)
        self._leave_cap(job)

    def is_backlogged(self) -> bool:
        """Whether a stage waits in the queue: work waits for the nodes (they serve one model: one pool)."""
        return len(self.core) > 0

    def finish(self, job: Job) -> None:
        """Give back the job's KV reservation and let waiting work in."""
        if job.node is not None:
            job.was_backlogged = self.is_backlogged()
            job.node.release(job.reservation)
            job.node.num_inflight -= 1
            job.node.running_requests.pop(job.request, None)
            job.node, job.reservation = None, None
        self._leave_cap(job)
        self.pump()

    def _leave_cap(self, job: Job) -> None:
        if job.in_cap:
            job.in_cap = False
            self.cap.leave(job.request.workflow_id, self.clock())

    def slots(self, count_refusals: bool = True) -> list[NodeSlot]:
        return [NodeSlot(n, count_refusals, self.batch_cost, self.clock) for n in self.nodes]

    def pump(self) -> None:
        """Apply the core's decisions (starts in policy order, then backfill) until the head must wait."""
        now = self.clock()
        for decision in self.core.decisions(self.slots(), now):
            job: Job = decision.request.payload
            if decision.outcome is Outcome.NEVER_FITS:
                self._fail_unplaceable(job)
            elif decision.outcome is Outcome.START and not self._assign(
                job, decision.node.node, decision.admission, now
            ):
                self.core.add(job.request, job.enqueued_s)  # back in its place: the next pump or recheck tries again
                break
        if len(self.core):
            self._schedule_recheck()  # projected admission changes with time alone; a cap's place may expire (idle_s)

    def choose_node(self, job: Job) -> Node | None:
        chosen = self.core.choose_node(job.request, self.slots(), self.clock())
        return chosen[0].node if chosen is not None else None

    def cap_state(self, now: float) -> tuple[bool, float | None]:
        """For the cap's adaptation: (whether the first stage the cap holds back would fit a node now while no
        eligible stage waits, since when the longest-waiting eligible stage has waited)."""
        return self.core.held_back(self.slots(count_refusals=False), now, since=lambda r: r.payload.enqueued_s)

    def adapt_cap(self, signals: CapSignals) -> None:
        """At a /metrics poll: let the cap adapt to the nodes' `signals` and the queue's state, then dispatch what it
        now allows."""
        if self.cap is None:
            return
        now = self.clock()
        held_fitting, waiting_since = self.cap_state(now)
        self.cap.adapt(replace(signals, held_fitting=held_fitting, waiting_since=waiting_since), now)
        self.pump()

    def _schedule_recheck(self) -> None:
        """Pump again soon: projected admission changes with time alone (stages are projected to end), not only
        when a stage finishes or /metrics is polled — waiting for those left the node idle for up to a poll period."""
        if self.recheck_s <= 0 or self._recheck is not None:
            return
        if self.cap is None and not any(n.kv_admission == "projected" for n in self.nodes):
            return  # peak admission changes only on those events
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (unit tests driving the dispatcher by hand): events and polls pump
        self._recheck = loop.call_later(self.recheck_s, self._on_recheck)

    def _on_recheck(self) -> None:
        self._recheck = None
        self.pump()

    def fail_all_queued(self, reason: str) -> None:
        now = self.clock()
        for request in list(self.scheduler.in_order(now)):
            self.core.remove(request)
            job = request.payload
            self._leave_cap(job)
            if not job.future.done():
                job.future.set_exception(NoNode(reason))

    def _assign(self, job: Job, node: Node, admission: Admission, now: float) -> bool:
        """Start the job on `node` with the admission the core chose; False (nothing started) when its blocks no
        longer map there."""
        reservation = node.reserve(admission)
        if reservation is None:
            return False
        job.reservation, job.node = reservation, node
        job.num_attempts += 1
        job.queue_s += now - job.enqueued_s
        job.started_s = now
        node.num_inflight += 1
        node.running_requests[job.request] = now
        self.num_dispatched += 1
        if self.cap is not None:
            self.cap.started(job.request.workflow_id)
        job.future.set_result(node)
        return True

    def _check_placeable(self, job: Job) -> None:
        error = self._unplaceable(job)
        if error is not None:
            raise error

    def _unplaceable(self, job: Job) -> NoNode | None:
        """Why no healthy node could ever take the stage (None: one could)."""
        healthy = [n for n in self.nodes if n.is_healthy and n.name not in job.excluded]
        if not healthy:
            return NoNode(
                "no healthy vLLM node for this stage"
                + (f" (failed on {sorted(job.excluded)}; last: {job.last_error})" if job.excluded else "")
            )
        if not any(n.kv.allocator is None or n.can_ever_fit(job.reserve_tokens) for n in healthy):
            return NoNode(
                f"stage needs {job.reserve_tokens} KV tokens, more than any node holds; "
                "lower max_tokens or shorten the prompt",
                status=413,
            )
        return None

    def _fail_unplaceable(self, job: Job) -> None:
        """The core found that no healthy node could ever take the stage (it left the queue): fail it."""
        self._leave_cap(job)
        job.future.set_exception(self._unplaceable(job) or NoNode("no healthy vLLM node for this stage"))
