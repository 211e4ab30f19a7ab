"""Gateway → scheduler → admission/allocator: queue stages, admit what fits, pick a node by fitness.

A `Job` is one stage's call. `submit` queues it in the policy's scheduler (bounded); `pump` hands
the head of the queue a node whose free KV blocks cover its reserve (`PageAdmission`) — the node
chosen by `select_node` (availability − ready time − degradation) — and wakes its handler.
When the head fits nowhere, `pump` backfills: of the next `backfill_depth` queued stages (policy
order), those that fit now go ahead of it, but no queued stage is overtaken this way more than
`backfill_max_overtaken` times, so a big stage waits a bounded number of small ones, then the
queue is strict head-of-line again until it goes. The policy still decides who goes first.
With a workflow cap (`wip.WorkflowCap`), only stages of the W oldest live workflows (and interactive ones)
may go: the head is the first of those in policy order, and backfill looks only at those.
Failures are explicit: `Full` (queue bound), `NoNode` (nothing healthy / the stage can never fit).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from itertools import islice

from serving.admission import PageAdmission
from serving.gateway.metadata import StageMeta
from serving.gateway.nodes import Node
from serving.gateway.wip import WorkflowCap
from serving.kv import Reservation
from serving.request import StageRequest
from serving.routing import FitnessConfig, select_node
from serving.scheduler import Scheduler


class Full(Exception):
    """The gateway queue is at its bound: answer 429 with Retry-After."""


class NoNode(Exception):
    """No healthy node can take this stage: answer 503 (or 413 when it can never fit)."""

    def __init__(self, message: str, status: int = 503):
        super().__init__(message)
        self.status = status


@dataclass(eq=False)
class Job:
    """One stage's call on its way through the gateway."""

    meta: StageMeta
    request: StageRequest
    reserve_tokens: int
    prediction: object = None  # pipelines.predictor.Prediction
    prediction_source: str = ""  # predict.Source: "model", or why the prior answered
    predict_s: float = 0.0  # time the prediction took, deadline included
    future: asyncio.Future | None = None
    arrival_unix_s: float = field(default_factory=time.time)
    enqueued_s: float = field(default_factory=time.monotonic)
    node: Node | None = None
    reservation: Reservation | None = None
    excluded: set[str] = field(default_factory=set)  # nodes that failed this stage
    last_error: str = ""  # how the last attempt failed ("node: reason")
    num_attempts: int = 0
    queue_s: float = 0.0
    num_overtaken: int = 0  # times backfill dispatched a stage queued behind this one
    in_cap: bool = False  # counted as queued/running by the workflow cap
    prompt_chars: int = 0  # what the prompt-token estimate was made from, to calibrate it on vLLM's count
    num_messages: int = 0
    deadline_s: float | None = None  # monotonic; past it the stage fails with 504 (GatewayConfig.request_timeout_s)

    def remaining_s(self) -> float | None:
        """Seconds left before the stage's deadline (0 once past it); None without a deadline."""
        return None if self.deadline_s is None else max(0.0, self.deadline_s - time.monotonic())


class Dispatcher:
    def __init__(self, scheduler: Scheduler, nodes: list[Node], max_queued: int, fitness: FitnessConfig | None = None,
                 backfill_depth: int = 8, backfill_max_overtaken: int = 4, recheck_s: float = 0.02,
                 cap: WorkflowCap | None = None):
        self.scheduler, self.nodes, self.max_queued = scheduler, nodes, max_queued
        self.cap = cap
        self.fitness = fitness or FitnessConfig()
        self.backfill_depth, self.backfill_max_overtaken = backfill_depth, backfill_max_overtaken
        self.recheck_s = recheck_s
        self._recheck: asyncio.TimerHandle | None = None
        self.num_dispatched = 0
        self.num_backfilled = 0

    def submit(self, job: Job, front: bool = False) -> None:
        """Queue a job (a retry keeps its original ready time, so it goes ahead of later work)."""
        if not front and len(self.scheduler) >= self.max_queued:
            raise Full(f"gateway queue full ({self.max_queued} stages waiting)")
        self._check_placeable(job)
        job.enqueued_s = time.monotonic()
        if self.cap is not None and not job.in_cap:
            job.in_cap = True
            self.cap.enter(job.meta.workflow_key, job.request.workflow_arrival_s)
        self.scheduler.add(job.request, job.enqueued_s)
        self.pump()

    def withdraw(self, job: Job) -> None:
        """A queued job whose client went away."""
        if job.request.queue_seq >= 0:
            self.scheduler.remove(job.request)
        self._leave_cap(job)

    def finish(self, job: Job) -> None:
        """Give back the job's KV reservation and let waiting work in."""
        if job.node is not None:
            job.node.release(job.reservation)
            job.node.num_inflight -= 1
            job.node, job.reservation = None, None
        self._leave_cap(job)
        self.pump()

    def _leave_cap(self, job: Job) -> None:
        if job.in_cap:
            job.in_cap = False
            self.cap.leave(job.meta.workflow_key, time.monotonic())

    def pump(self) -> None:
        """Dispatch from the head of the queue while the head fits somewhere (policy order), then backfill."""
        now = time.monotonic()
        while (job := self._head(now)) is not None:
            node = self.choose_node(job)
            if node is not None:
                self.scheduler.remove(job.request)
                self._assign(job, node, now)
            elif not self._fail_if_unplaceable(job):
                self._backfill(now)
                self._schedule_recheck()
                return
        if self.cap is not None and len(self.scheduler):
            self._schedule_recheck()  # held by the cap: a workflow's place may expire (idle_s) without an event

    def _head(self, now: float) -> Job | None:
        """The next stage in policy order that may go (with a cap: the first of an eligible workflow)."""
        if self.cap is None:
            return self._peek_job(now)
        cancelled, head = [], None
        for request in self.scheduler.in_order(now):
            job = request.payload
            if job.future.done():
                cancelled.append(request)
            elif self._may_go(job, now):
                head = job
                break
        for request in cancelled:
            self.scheduler.remove(request)
        return head

    def _may_go(self, job: Job, now: float) -> bool:
        return self.cap is None or self.cap.admits(job.meta.workflow_key, job.meta.interactive, now)

    def cap_state(self, now: float) -> tuple[bool, float | None]:
        """For the cap's adaptation: (whether the first stage the cap holds back would fit a node now while no
        eligible stage waits, since when the longest-waiting eligible stage has waited)."""
        held, waiting_since = None, None
        for request in self.scheduler.in_order(now):
            job = request.payload
            if job.future.done():
                continue
            if self._may_go(job, now):
                waiting_since = min(waiting_since or job.enqueued_s, job.enqueued_s)
            elif held is None:
                held = job
        fits = held is not None and waiting_since is None and any(
            n.name not in held.excluded and n.would_fit(held.request.prompt_tokens,
                                                        held.reserve_tokens - held.request.prompt_tokens)
            for n in self.nodes)
        return fits, waiting_since

    def adapt_cap(self, preemptions: dict[str, int]) -> None:
        """At a /metrics poll: let an adaptive cap grow or shrink, then dispatch what it now allows."""
        if self.cap is None or not self.cap.adaptive:
            return
        now = time.monotonic()
        held_fitting, waiting_since = self.cap_state(now)
        limit = self.cap.limit
        self.cap.adapt(preemptions, held_fitting, waiting_since, now)
        if self.cap.limit > limit:
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

    def _backfill(self, now: float) -> None:
        """Dispatch queued stages behind a head that fits nowhere, while everything they pass may be overtaken."""
        if self.backfill_depth <= 0:
            return
        passed: list[Job] = []  # live stages ahead of the candidate in policy order
        for request in self._candidates(now):
            job = request.payload
            if job.future.done() or not self._may_go(job, now):
                continue  # cancelled while queued (dropped when it reaches the head), or held by the workflow cap
            node = self.choose_node(job) if passed else None  # the head was just found not to fit
            if node is None:
                if job.num_overtaken >= self.backfill_max_overtaken:
                    return  # nothing further back may pass this one
                passed.append(job)
                continue
            self.scheduler.remove(request)
            self._assign(job, node, now)
            self.num_backfilled += 1
            for ahead in passed:
                ahead.num_overtaken += 1

    def _candidates(self, now: float) -> list:
        """The head and the next `backfill_depth` stages that may go, in policy order."""
        if self.cap is None:
            return self.scheduler.peek_n(now, self.backfill_depth + 1)
        live = (r for r in self.scheduler.in_order(now) if not r.payload.future.done() and self._may_go(r.payload, now))
        return list(islice(live, self.backfill_depth + 1))

    def fail_all_queued(self, reason: str) -> None:
        while (job := self._peek_job(time.monotonic())) is not None:
            self.scheduler.pop(time.monotonic())
            self._leave_cap(job)
            job.future.set_exception(NoNode(reason))

    def _peek_job(self, now: float) -> Job | None:
        while (request := self.scheduler.peek(now)) is not None:
            job = request.payload
            if not job.future.done():
                return job
            self.scheduler.pop(now)  # cancelled while queued
        return None

    def choose_node(self, job: Job) -> Node | None:
        prompt, output = job.request.prompt_tokens, job.reserve_tokens - job.request.prompt_tokens
        candidates = [n for n in self.nodes if n.name not in job.excluded and n.can_fit(prompt, output)]
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        availability = [n.num_free_blocks / max(1, n.num_blocks) for n in candidates]
        ready = [n.num_inflight + n.num_waiting for n in candidates]
        degradation = [n.num_waiting for n in candidates]
        return candidates[select_node(availability, ready, degradation, self.fitness)]

    def _assign(self, job: Job, node: Node, now: float) -> None:
        job.reservation = node.reserve(job.request.prompt_tokens, job.reserve_tokens - job.request.prompt_tokens)
        job.node = node
        job.num_attempts += 1
        job.queue_s += now - job.enqueued_s
        node.num_inflight += 1
        self.num_dispatched += 1
        job.future.set_result(node)

    def _healthy(self, job: Job) -> list[Node]:
        return [n for n in self.nodes if n.is_healthy and n.name not in job.excluded]

    def _check_placeable(self, job: Job) -> None:
        healthy = self._healthy(job)
        if not healthy:
            raise NoNode("no healthy vLLM node for this stage" + (
                f" (failed on {sorted(job.excluded)}; last: {job.last_error})" if job.excluded else ""))
        if not any(n.allocator is None or n.can_ever_fit(job.reserve_tokens) for n in healthy):
            raise NoNode(f"stage needs {job.reserve_tokens} KV tokens, more than any node holds; "
                         "lower max_tokens or shorten the prompt", status=413)

    def _fail_if_unplaceable(self, job: Job) -> bool:
        """Fail the head if no healthy node could ever take it (it left the queue); False if it may wait."""
        try:
            self._check_placeable(job)
        except NoNode as error:
            self.scheduler.remove(job.request)
            self._leave_cap(job)
            job.future.set_exception(error)
            return True
        return False
