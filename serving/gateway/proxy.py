"""Forward one call: queue → node → vLLM (JSON or SSE stream) → trace; retries on node failure.

A stage is retried on another node (5xx, connection failure, a stall past `node_timeout_s`) only
while nothing has reached the client yet: always for JSON answers; for streams, until the node's
first whole event is in (streaming.py). With
`request_timeout_s` the stage's deadline runs from its arrival: the queue wait, every attempt (headers,
body, a stream to its end) and the wait for the predictor's history are cut at it, an attempt it cuts
is not retried, and a stage past it fails with 504 (a stream already relayed ends with a 504 error
event). Every stage ends with one trace line: completed, failed with its reason, or refused (429).
A client that disconnects cancels its queued job or closes the upstream request, which makes
vLLM abort it.
"""
from __future__ import annotations

import asyncio
import json
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from serving.gateway.attempt import DeadlinePassed, NodeFailed, attempt_failed, upstream_headers
from serving.gateway.core import Gateway
from serving.gateway.dispatch import Full, Job, NoNode
from serving.gateway.hints import add_agent_hints
from serving.gateway.metadata import parse_metadata
from serving.gateway.nodes import Node
from serving.gateway.outcome import CallResult, can_assemble
from serving.gateway.streaming import open_stream, post_streamed
from serving.gateway.upstream import Answer, UpstreamError
from serving.gateway.validation import BadRequest, check_body, read_call
from serving.vllm_plugin.hints import XARGS_KEY, hints_for_stage


def error_response(status: int, message: str, kind: str, retry_after_s: int | None = None,
                   param: str | None = None) -> JSONResponse:
    """An OpenAI-style error; `param` names the request field at fault."""
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status,
                        headers=headers)


async def handle(gateway: Gateway, request: Request, path: str, caller_id: str = "") -> Response:
    """Entry point of /v1/chat/completions and /v1/completions; `caller_id`: the API key's id ("" without keys).

    A body too big, not JSON or with bad workflow metadata is refused untraced (no stage to name); a stage whose
    body the endpoint cannot take is refused with 400 and traced."""
    arrived_s = time.monotonic()
    try:
        body = await read_call(request, gateway.config.server.max_body_bytes)
    except BadRequest as error:
        return error_response(error.status, error.message, "invalid_request_error", param=error.param)
    meta = parse_metadata(request.headers, body, caller_id)
    gateway.counters["requests"] += 1
    if meta.key in gateway.inflight:
        return error_response(409, f"stage {meta.label} is already running; stage ids are idempotency keys",
                              "conflict")
    if meta.key in gateway.completed and gateway.completed[meta.key] is not None and not body.get("stream"):
        gateway.counters["replayed"] += 1
        return Response(gateway.completed[meta.key], media_type="application/json", headers={"X-Maestro-Replay": "1"})
    gateway.inflight.add(meta.key)
    is_streaming = False
    try:
        try:
            check_body(path, body)
        except BadRequest as error:
            gateway.counters["rejected_invalid"] += 1
            refused = Job(meta=meta, request=None, reserve_tokens=0)  # no prediction: traced as refused
            return fail(gateway, refused, body, error.status, error.message, param=error.param)
        job = await gateway.prepare(meta, body)
        upstream = forward_body(gateway, body, job.request.max_tokens)
        response = await run_job(gateway, request, job, path, upstream, body, arrived_s)
        is_streaming = isinstance(response, StreamingResponse)  # its relay releases the key when done
        return response
    finally:
        if not is_streaming:
            gateway.inflight.discard(meta.key)


def forward_body(gateway: Gateway, body: dict, max_tokens: int) -> dict:
    """The body vLLM gets; a chat call without a token limit is sent with the one its reservation was sized to
    (`Gateway.output_cap`): vLLM's own is the whole context. A completion call's (vLLM's 16) is left to vLLM."""
    upstream = {k: v for k, v in body.items() if k != "metadata"}
    if "messages" in body and not upstream.get("max_tokens") and not upstream.get("max_completion_tokens"):
        upstream["max_tokens"] = max_tokens
    if not upstream.get("model") and gateway.config.model:
        upstream["model"] = gateway.config.model
    if upstream.get("stream"):
        upstream["stream_options"] = {**(upstream.get("stream_options") or {}), "include_usage": True}
    return upstream


async def run_job(gateway: Gateway, request: Request, job: Job, path: str, upstream: dict, body: dict,
                  arrived_s: float) -> Response:
    """Queue, dispatch and forward, retrying on node failure up to max_attempts within the stage's deadline
    (`arrived_s` + request_timeout_s).

    An attempt the deadline cut ends the stage at once, whatever `remaining_s()` says then: the loop's clock fires
    the cut (uvloop's: in whole milliseconds, up to ~1 ms before `time.monotonic()` reaches the deadline)."""
    if gateway.config.limits.request_timeout_s:
        job.deadline_s = arrived_s + gateway.config.limits.request_timeout_s
    last_error = ""
    while job.num_attempts < gateway.config.limits.max_attempts and job.remaining_s() != 0:
        node = await wait_for_node(gateway, request, job, body)
        if isinstance(node, Response):
            gateway.inflight.discard(job.meta.key)
            return node
        if gateway.spans is not None and job.span is None:
            job.span = gateway.spans.start(job.meta.trace_context, job.arrival_unix_s)
        set_engine_order(gateway, job, node, upstream)
        add_agent_hints(gateway.config.upstream.router_hints, upstream, job.request.tokens_pred, gateway.vllm_priority(job))
        try:
            if upstream.get("stream"):
                return await open_stream(gateway, request, job, node, path, upstream, body)
            return await forward_json(gateway, request, job, node, path, upstream, body)
        except DeadlinePassed as error:
            gateway.dispatcher.finish(job)
            return deadline_passed(gateway, job, body, f"on {node.name}, {error}")
        except NodeFailed as error:
            last_error = job.last_error = f"{node.name}: {error}"
            job.excluded.add(node.name)
            gateway.dispatcher.finish(job)
            gateway.counters["retries"] += 1
    if job.remaining_s() == 0:
        return deadline_passed(gateway, job, body, f"after {job.num_attempts} attempt(s) ({last_error})")
    return fail(gateway, job, body, 502, f"stage {job.meta.label} failed on every node tried ({last_error}); "
                                         "retry later or check the vLLM nodes")


def set_engine_order(gateway: Gateway, job: Job, node: Node, upstream: dict) -> None:
    """What the node orders the stage by: its prediction where the node runs Maestro's scheduler, else vLLM's
    `priority` (set afresh on every attempt: a retry may go to the other kind of node)."""
    xargs = {k: v for k, v in (upstream.get("vllm_xargs") or {}).items() if k != XARGS_KEY}
    if node.runs_maestro_scheduler:
        upstream.pop("priority", None)
        xargs.update(hints_for_stage(job.request, time.monotonic()).to_xargs())
    else:
        upstream["priority"] = gateway.vllm_priority(job)
    if xargs:
        upstream["vllm_xargs"] = xargs
    else:
        upstream.pop("vllm_xargs", None)


def deadline_passed(gateway: Gateway, job: Job, body: dict, where: str) -> Response:
    return fail(gateway, job, body, 504, f"stage {job.meta.label} passed its deadline (request_timeout_s="
                                         f"{gateway.config.limits.request_timeout_s}) {where}; retry later or raise the deadline")


def fail(gateway: Gateway, job: Job, body: dict, status: int, message: str, retry_after_s: int | None = None,
         param: str | None = None) -> Response:
    """End a stage with an error: counted, traced with its reason, its idempotency key released."""
    gateway.counters["failed"] += 1
    gateway.record(job, body, CallResult(error=message), None, None)
    gateway.inflight.discard(job.meta.key)
    kind = "upstream_error" if status >= 500 else "invalid_request_error" if status == 400 else "rejected"
    return error_response(status, message, kind, retry_after_s, param)


async def wait_for_node(gateway: Gateway, request: Request, job: Job, body: dict) -> Node | Response:
    """Submit to the scheduler and wait for a node, or answer 429/503/413 or the client's disconnect."""
    job.future = asyncio.get_running_loop().create_future()
    retry_after = gateway.config.limits.retry_after_s
    try:
        gateway.dispatcher.submit(job, front=job.num_attempts > 0)
    except Full as error:
        gateway.counters["rejected_full"] += 1
        gateway.record(job, body, CallResult(error=f"refused: {error}"), None, None)
        return error_response(429, f"{error}; retry after {retry_after} s", "rate_limited", retry_after)
    except NoNode as error:
        gateway.counters["rejected_no_node"] += 1
        return no_node(gateway, job, body, error, retry_after)
    if job.future.done():
        return await _node_or_error(gateway, job, body, retry_after)
    disconnect = asyncio.ensure_future(wait_disconnect(request))
    done, _ = await asyncio.wait({job.future, disconnect}, timeout=job.remaining_s(),
                                 return_when=asyncio.FIRST_COMPLETED)
    disconnect.cancel()
    if job.future.done():
        return await _node_or_error(gateway, job, body, retry_after)
    job.future.cancel()
    gateway.dispatcher.withdraw(job)
    if disconnect not in done:
        return deadline_passed(gateway, job, body, "while queued")
    gateway.counters["cancelled"] += 1
    gateway.record(job, body, CallResult(error="client disconnected while queued"), None, None)
    return error_response(499, "client disconnected while queued", "cancelled")


async def _node_or_error(gateway: Gateway, job: Job, body: dict, retry_after: int) -> Node | Response:
    try:
        return job.future.result()
    except NoNode as error:
        return no_node(gateway, job, body, error, retry_after)


def no_node(gateway: Gateway, job: Job, body: dict, error: NoNode, retry_after: int) -> Response:
    """503 with Retry-After (no healthy node now), or 413 (no node could ever hold the stage's KV)."""
    if error.status == 413:
        return fail(gateway, job, body, 413, str(error), param="max_tokens")
    return fail(gateway, job, body, error.status, str(error), retry_after)


async def wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def forward_json(gateway, request, job, node, path, upstream, body) -> Response:
    result, kv_usage = CallResult(), node.kv_usage
    if gateway.config.upstream.stream and can_assemble(body):
        send = asyncio.ensure_future(post_streamed(gateway, node, path, upstream, job, result))
    else:
        send = asyncio.ensure_future(post(gateway, node, path, upstream, job))
    disconnect = asyncio.ensure_future(wait_disconnect(request))
    await asyncio.wait({send, disconnect}, return_when=asyncio.FIRST_COMPLETED)
    if not send.done():  # client left: closing the connection makes vLLM abort the request
        send.cancel()
        gateway.dispatcher.finish(job)
        gateway.counters["cancelled"] += 1
        result.error = "client disconnected"
        gateway.record(job, body, result, node.name, kv_usage)
        return error_response(499, "client disconnected", "cancelled")
    disconnect.cancel()
    response, parsed = send.result()  # NodeFailed propagates to the retry loop
    gateway.dispatcher.finish(job)  # (a streamed call released its KV at its last chunk already)
    if response.status_code != 200:
        result.error = f"vLLM {node.name} answered {response.status_code}: {response.text[:300]}"
        gateway.record(job, body, result, node.name, kv_usage)
        return Response(response.content, response.status_code, media_type="application/json")
    result.read_response(parsed if parsed is not None else json.loads(response.content))
    gateway.record(job, body, result, node.name, kv_usage)
    gateway.remember(job.meta.key, response.content)
    await settled(gateway, job)
    # vLLM's bytes go back as they came: parsing once for the trace is needed, re-encoding is not.
    return Response(response.content, media_type="application/json", headers={"X-Maestro-Node": node.name})


async def settled(gateway: Gateway, job: Job) -> None:
    """Wait, within the stage's deadline, until the predictor's history has this stage: the caller's next stage,
    through any replica, is predicted with it."""
    try:
        await asyncio.wait_for(gateway.predictor.settled(), job.remaining_s())
    except asyncio.TimeoutError:
        pass


async def post(gateway: Gateway, node: Node, path: str, upstream: dict, job: Job) -> tuple[Answer, None]:
    try:
        response = await node.upstream.post_json(f"{node.url}{path}", upstream, upstream_headers(gateway, job),
                                                 job.remaining_s())
    except UpstreamError as error:
        raise attempt_failed(error, "before its answer") from None
    if response.status_code >= 500:
        raise NodeFailed(f"HTTP {response.status_code}: {response.text[:200]}")
    return response, None


