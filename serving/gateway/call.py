"""One call through the gateway, as one object: body → stage → prediction → queue → node → vLLM → trace.

`StageCall.respond()` reads and checks the call, has the gateway predict and size it (`Gateway.prepare`), queues it
(`Dispatcher`), forwards it to the node the dispatcher chose (forward.py; streams in streaming.py) and retries on
another node (5xx, connection failure, a stall past `node_timeout_s`) while nothing has reached the client yet. With
`limits.request_timeout_s` the stage's deadline runs from its arrival: the queue wait, every attempt and the wait for
the predictor's history are cut at it, an attempt it cuts is not retried, and a stage past it fails with 504.

Every stage leaves through `end()`, once: its counter, its node's reservation given back, its one trace line
(completed, failed with its reason, or refused) and its idempotency key released. A client that disconnects cancels
its queued job or closes the upstream request, which makes vLLM abort it.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from serving.gateway.attempt import DeadlinePassed, NodeFailed
from serving.gateway.core import Gateway
from serving.gateway.forward import forward_body, forward_json, set_engine_order, wait_disconnect
from serving.gateway.jobs import Arrival, Full, Job, NoNode
from serving.gateway.metadata import StageMeta, parse_metadata
from serving.gateway.nodes import Node
from serving.gateway.outcome import CallResult
from serving.gateway.streaming import open_stream
from serving.gateway.validation import BadRequest, check_body, read_call


def error_response(
    status: int, message: str, kind: str, retry_after_s: int | None = None, param: str | None = None, **details
) -> JSONResponse:
    """An OpenAI-style error; `param` names the request field at fault, `details` are further fields of it."""
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status, **details}},
        status,
        headers=headers,
    )


class StageCall:
    """One /v1/chat/completions or /v1/completions call; `caller_id` is the API key's id ("" without keys)."""

    def __init__(self, gateway: Gateway, request: Request, path: str, caller_id: str = ""):
        self.gateway, self.request, self.path, self.caller_id = gateway, request, path, caller_id
        self.arrival = Arrival.now()  # before the body is read: the stage's clock (trace times, deadline, workflow)
        self.arrived_s = self.arrival.monotonic_s
        self.body: dict = {}
        self.meta: StageMeta | None = None
        self.job: Job | None = None
        self.upstream: dict = {}  # the body vLLM gets
        self.has_ended = False

    # ---- the way in -----------------------------------------------------------------------------------------
    async def respond(self) -> Response:
        """A body too big, not JSON or with bad workflow metadata is refused untraced (no stage to name); a stage
        whose body the endpoint cannot take is refused with 400, one of a workflow triage turned away with 503, both
        traced. Every call counts in `requests`, and each refusal once, by its reason."""
        gateway = self.gateway
        self.count("requests")
        try:
            self.body = await read_call(self.request, gateway.config.server.max_body_bytes)
        except BadRequest as error:
            self.count("rejected_invalid")
            return error_response(error.status, error.message, "invalid_request_error", param=error.param)
        self.meta = meta = parse_metadata(self.request.headers, self.body, self.caller_id)
        if meta.key in gateway.inflight:
            self.count("rejected_invalid")
            return error_response(
                409, f"stage {meta.label} is already running; stage ids are idempotency keys", "conflict"
            )
        if gateway.completed.get(meta.key) is not None and not self.body.get("stream"):
            self.count("replayed")
            return Response(
                gateway.completed[meta.key], media_type="application/json", headers={"X-Maestro-Replay": "1"}
            )
        gateway.inflight.add(meta.key)
        try:
            check_body(self.path, self.body)
        except BadRequest as error:
            self.job = self.unpredicted_job()  # no prediction: traced as refused
            return self.fail(error.status, error.message, param=error.param, counter="rejected_invalid")
        response = None
        try:
            if gateway.triage is not None and gateway.triage.has_rejected(meta.workflow_key):
                self.job = self.unpredicted_job()  # turned away before: not predicted again
                return self.turn_away()
            self.job = await gateway.prepare(meta, self.body, self.arrival)
            if gateway.turns_away(self.job):
                return self.turn_away()
            self.upstream = forward_body(gateway, self.body, self.job.request.max_tokens)
            response = await self.attempts()
            return response
        finally:
            if not isinstance(response, StreamingResponse):  # (a stream's relay ends the call when it is done)
                gateway.inflight.discard(meta.key)  # released by end(); here also when something raised

    async def attempts(self) -> Response:
        """Queue, dispatch and forward, retrying on node failure up to max_attempts within the stage's deadline.

        An attempt the deadline cut ends the stage at once, whatever `remaining_s()` says then: the loop's clock fires
        the cut (uvloop's: in whole milliseconds, up to ~1 ms before `time.monotonic()` reaches the deadline)."""
        gateway, job, limits = self.gateway, self.job, self.gateway.config.limits
        if limits.request_timeout_s:
            job.deadline_s = self.arrived_s + limits.request_timeout_s
        last_error = ""
        while job.num_attempts < limits.max_attempts and job.remaining_s() != 0:
            node = await self.wait_for_node()
            if isinstance(node, Response):
                return node
            if gateway.spans is not None and job.span is None:
                job.span = gateway.spans.start(job.meta.trace_context, job.arrival.unix_s)
            set_engine_order(self.upstream, gateway, job, node)
            try:
                if self.upstream.get("stream"):
                    return await open_stream(self, node)
                return await forward_json(self, node)
            except DeadlinePassed as error:
                gateway.dispatcher.finish(job)
                return self.deadline_passed(f"on {node.name}, {error}")
            except NodeFailed as error:
                last_error = job.last_error = f"{node.name}: {error}"
                job.excluded.add(node.name)
                gateway.dispatcher.finish(job)
                self.count("retries")
        if job.remaining_s() == 0:
            return self.deadline_passed(f"after {job.num_attempts} attempt(s) ({last_error})")
        return self.fail(
            502,
            f"stage {job.meta.label} failed on every node tried ({last_error}); retry later or check the vLLM nodes",
        )

    def unpredicted_job(self) -> Job:
        """The Job of a stage refused before its prediction: traced as refused, from the call's arrival."""
        return Job(meta=self.meta, request=None, reserve_tokens=0, arrival=self.arrival)

    # ---- waiting for a node ---------------------------------------------------------------------------------
    async def wait_for_node(self) -> Node | Response:
        """Submit to the scheduler and wait for a node, or answer 429/503/413 or the client's disconnect."""
        gateway, job = self.gateway, self.job
        job.future = asyncio.get_running_loop().create_future()
        retry_after = gateway.config.limits.retry_after_s
        try:
            gateway.dispatcher.submit(job, front=job.num_attempts > 0)
        except Full as error:
            self.end(CallResult(error=f"refused: {error}"), counter="rejected_full")
            return error_response(429, f"{error}; retry after {retry_after} s", "rate_limited", retry_after)
        except NoNode as error:
            return self.no_node(error)
        if not job.future.done():
            disconnect = asyncio.ensure_future(wait_disconnect(self.request))
            done, _ = await asyncio.wait(
                {job.future, disconnect}, timeout=job.remaining_s(), return_when=asyncio.FIRST_COMPLETED
            )
            disconnect.cancel()
            if not job.future.done():
                job.future.cancel()
                gateway.dispatcher.withdraw(job)
                if disconnect not in done:
                    return self.deadline_passed("while queued")
                return self.cancelled(CallResult(error="client disconnected while queued"))
        try:
            return job.future.result()
        except NoNode as error:
            return self.no_node(error)

    def no_node(self, error: NoNode) -> Response:
        """503 with Retry-After (no healthy node now), or 413 (no node could ever hold the stage's KV: the call must
        ask for less, so a client error)."""
        if error.status == 413:
            return self.fail(413, str(error), param="max_tokens", counter="rejected_invalid")
        return self.fail(error.status, str(error), self.gateway.config.limits.retry_after_s, counter="rejected_no_node")

    # ---- the way out ----------------------------------------------------------------------------------------
    def count(self, counter: str) -> None:
        """The one place a call moves the gateway's counters (/maestro/status, /metrics)."""
        self.gateway.counters[counter] += 1

    def end(
        self,
        result: CallResult,
        node: Node | None = None,
        kv_usage: float | None = None,
        counter: str | None = None,
        answer: bytes | None = None,
    ) -> None:
        """The stage is over: counted (`counter`), its node's reservation given back, its trace line written, its
        answer remembered for replays, its idempotency key released. Only the first call does anything."""
        if self.has_ended:
            return
        self.has_ended = True
        gateway, job = self.gateway, self.job
        if counter is not None:
            self.count(counter)
        if job.request is not None:
            gateway.dispatcher.finish(job)
        gateway.record(job, self.body, result, node.name if node is not None else None, kv_usage)
        if answer is not None:
            gateway.remember(job.meta.key, answer)
        gateway.inflight.discard(job.meta.key)

    def fail(
        self,
        status: int,
        message: str,
        retry_after_s: int | None = None,
        param: str | None = None,
        counter: str = "failed",
    ) -> Response:
        """End the stage with an error: counted once as `counter` (`failed`: the nodes failed it), traced with its
        reason."""
        self.end(CallResult(error=message), counter=counter)
        kind = "upstream_error" if status >= 500 else "invalid_request_error" if status == 400 else "rejected"
        return error_response(status, message, kind, retry_after_s, param)

    def cancelled(self, result: CallResult, node: Node | None = None, kv_usage: float | None = None) -> Response:
        """End the stage its client left (counted as cancelled, traced with `result.error`): 499."""
        self.end(result, node, kv_usage, counter="cancelled")
        return error_response(499, result.error, "cancelled")

    def turn_away(self) -> Response:
        """503 without Retry-After: triage shed the stage's workflow and the system turns shed workflows away
        (serving/core/scheduler/triage.py); the same stage, or a later one of the workflow, would be refused again."""
        workflow_id = self.meta.workflow_id
        message = (
            f"workflow {workflow_id!r} was turned away: beside the workflows already admitted it cannot meet "
            "its deadline (its SLO from its first call), so this stage and every later stage of it are refused; "
            "start it again as a new workflow (another workflow_id) when the load is lower, or with a longer SLO"
        )
        self.end(CallResult(error=f"refused: {message}"), counter="rejected_shed")
        return error_response(503, message, "workflow_rejected", reason="deadline_infeasible", workflow_id=workflow_id)

    def deadline_passed(self, where: str) -> Response:
        return self.fail(
            504,
            f"stage {self.job.meta.label} passed its deadline (request_timeout_s="
            f"{self.gateway.config.limits.request_timeout_s}) {where}; retry later or raise the "
            "deadline",
        )
