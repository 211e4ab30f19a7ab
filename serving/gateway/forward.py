"""A stage forwarded to its node: the body vLLM gets, what the node orders it by, and a JSON client's answer.

The body is the client's, without its metadata, with the token limit its reservation was sized to; on each attempt
the node is told what to order the stage by (Maestro's hints, or vLLM's `priority`) and the router hints. A JSON
client's call goes plain, or streamed and assembled (`upstream.stream`, streaming.py); vLLM's bytes go back as they
came. A client that disconnects meanwhile closes the upstream request, which makes vLLM abort it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from serving.gateway.attempt import NodeFailed, attempt_failed, upstream_headers
from serving.gateway.core import Gateway
from serving.gateway.jobs import Job
from serving.gateway.nodes import Node
from serving.gateway.outcome import CallResult, can_assemble
from serving.gateway.router_hints import add_agent_hints
from serving.gateway.streaming import post_streamed
from serving.gateway.upstream import Reply, UpstreamError
from serving.vllm_plugin.hints import XARGS_KEY, hints_for_stage
from serving.vllm_plugin.session_kv import SESSION_KEY

if TYPE_CHECKING:
    from serving.gateway.call import StageCall


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


def set_engine_order(upstream: dict, gateway: Gateway, job: Job, node: Node) -> None:
    """What the node orders the stage by: its prediction where the node runs Maestro's scheduler, else vLLM's
    `priority` (set afresh on every attempt: a retry may go to the other kind of node); and the router hints."""
    priority = gateway.vllm_priority(job)
    xargs = {k: v for k, v in (upstream.get("vllm_xargs") or {}).items() if k != XARGS_KEY}
    if node.runs_maestro_scheduler:
        upstream.pop("priority", None)
        xargs.update(hints_for_stage(job.request, time.monotonic(), final=job.meta.final).to_xargs())
        if SESSION_KEY not in xargs:  # the caller's own session hint goes as it came
            meta = job.meta
            xargs.update(
                gateway.sessions.engine_hint(meta.workflow_key, meta.app, meta.role, job.prediction.p_tool).to_xargs()
            )
    else:
        upstream["priority"] = priority
    if xargs:
        upstream["vllm_xargs"] = xargs
    else:
        upstream.pop("vllm_xargs", None)
    add_agent_hints(gateway.config.upstream.router_hints, upstream, job.request.tokens_pred, priority)


async def forward_json(call: StageCall, node: Node) -> Response:
    """A JSON client's answer from the node; `NodeFailed` goes to the caller's retry loop."""
    gateway = call.gateway
    result, kv_usage = CallResult(), node.kv_usage
    if gateway.config.upstream.stream and can_assemble(call.body):
        send = asyncio.ensure_future(post_streamed(call, node, result))
    else:
        send = asyncio.ensure_future(post(call, node))
    disconnect = asyncio.ensure_future(wait_disconnect(call.request))
    await asyncio.wait({send, disconnect}, return_when=asyncio.FIRST_COMPLETED)
    if not send.done():  # client left: closing the connection makes vLLM abort the request
        send.cancel()
        result.error = "client disconnected"
        return call.cancelled(result, node, kv_usage)
    disconnect.cancel()
    response, parsed = send.result()  # NodeFailed propagates to the retry loop
    if response.status_code != 200:
        result.error = f"vLLM {node.name} answered {response.status_code}: {response.text[:300]}"
        call.end(result, node, kv_usage, counter="rejected_invalid")  # (a 5xx was retried: this is the call's fault)
        return Response(response.content, response.status_code, media_type="application/json")
    result.read_response(parsed if parsed is not None else json.loads(response.content))
    call.end(result, node, kv_usage, answer=response.content)
    await settled(call)
    # vLLM's bytes go back as they came: parsing once for the trace is needed, re-encoding is not.
    return Response(response.content, media_type="application/json", headers={"X-Maestro-Node": node.name})


async def post(call: StageCall, node: Node) -> tuple[Reply, None]:
    try:
        response = await node.upstream.post_json(
            f"{node.url}{call.path}", call.upstream, upstream_headers(call.gateway, call.job), call.job.remaining_s()
        )
    except UpstreamError as error:
        raise attempt_failed(error, "before its answer") from None
    if response.status_code >= 500:
        raise NodeFailed(f"HTTP {response.status_code}: {response.text[:200]}")
    return response, None


async def settled(call: StageCall) -> None:
    """Wait, within the stage's deadline, until the predictor's history has this stage: the caller's next stage,
    through any replica, is predicted with it."""
    try:
        await asyncio.wait_for(call.gateway.predictor.settled(), call.job.remaining_s())
    except TimeoutError:
        pass


async def wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
