"""Streams from vLLM: a streaming client's stream relayed event by event, and a JSON client's call sent streamed
(its KV reservation back at the last chunk) and assembled into one answer.

Until the node's first whole event is in, a failure fails the attempt (the stage may be retried elsewhere); after
that, a failure or a stream that ends without `data: [DONE]` ends the client's stream with an error event and
`data: [DONE]`, as vLLM ends a failed stream.
"""

from __future__ import annotations

import codecs
import json
import time
from typing import TYPE_CHECKING

import aiohttp
from starlette.responses import Response, StreamingResponse

from serving.gateway.attempt import NodeFailed, attempt_failed, describe, end_stream, upstream_headers
from serving.gateway.nodes import Node
from serving.gateway.outcome import CallResult, StreamAssembler, has_content
from serving.gateway.upstream import Reply, UpstreamError, is_deadline

if TYPE_CHECKING:
    from serving.gateway.call import StageCall


async def post_streamed(call: StageCall, node: Node, result: CallResult) -> tuple[Reply, dict | None]:
    """A non-streaming client's call sent to vLLM streamed: the KV reservation goes back at the last chunk
    (vLLM has freed the request), before the answer is assembled and written; the client gets the
    assembled non-streamed JSON."""
    gateway, job, path = call.gateway, call.job, call.path
    body = {**call.upstream, "stream": True, "stream_options": {"include_usage": True}}
    try:
        response = await node.upstream.open_stream(
            f"{node.url}{path}", body, upstream_headers(gateway, job), job.remaining_s()
        )
    except UpstreamError as error:
        raise attempt_failed(error, "before its stream's headers") from None
    is_complete = False
    try:
        if response.status >= 500:
            raise NodeFailed(f"HTTP {response.status}: {(await response.read())[:200]!r}")
        if response.status != 200:
            answer = Reply(response.status, await response.read())
            is_complete = True
            return answer, None
        assembler = StreamAssembler(is_chat="chat" in path, num_choices=int(call.upstream.get("n") or 1))
        decoder, buffer = codecs.getincrementaldecoder("utf-8")(errors="replace"), ""
        async for raw in response.content.iter_any():
            buffer += decoder.decode(raw)
            *lines, buffer = buffer.split("\n")
            for line in lines:
                if (chunk := assembler.feed_line(line)) is not None:
                    call.count("upstream_chunks")
                    if has_content(chunk):
                        result.mark_token()
            if job.node is None:
                continue
            if assembler.is_finished:
                node.observe_stream(
                    (result.first_token_s or result.started_s) - result.started_s,
                    int((assembler.usage or {}).get("completion_tokens") or 0),
                    time.monotonic() - (result.first_token_s or result.started_s),
                )
                gateway.dispatcher.finish(job)
                result.released_s = time.monotonic()
        is_complete = True
        assembler.feed_line(buffer)
        if assembler.error is not None:
            raise NodeFailed(f"vLLM stream error: {str(assembler.error)[:200]}")
        if not assembler.is_finished:
            raise NodeFailed("vLLM's stream ended before its last chunk")
        parsed = assembler.response()
        return Reply(200, json.dumps(parsed, separators=(",", ":")).encode()), parsed
    except UpstreamError as error:
        raise attempt_failed(error, "failed mid-stream") from None
    finally:
        end_stream(response, is_complete)


async def open_stream(call: StageCall, node: Node) -> Response:
    """Open the upstream stream and read its first whole event (a failure until then is retryable), then relay it.
    The call's clock (`CallResult.started_s`) starts before the request goes upstream."""
    gateway, job, result = call.gateway, call.job, CallResult()
    try:
        response = await node.upstream.open_stream(
            f"{node.url}{call.path}", call.upstream, upstream_headers(gateway, job), job.remaining_s()
        )
    except UpstreamError as error:
        raise attempt_failed(error, "before its stream's headers") from None
    if response.status >= 500:
        response.close()
        raise NodeFailed(f"HTTP {response.status}")
    if response.status != 200:
        content = await response.read()
        response.release()
        result.error = f"vLLM answered {response.status}"
        call.end(result, node, node.kv_usage, counter="rejected_invalid")  # (a 5xx was retried: the call's fault)
        return Response(content, response.status, media_type="application/json")
    events = EventReader(result)
    first = events.feed(await read_first_event(response))
    relay = relay_stream(call, node, response, events, first)
    return StreamingResponse(relay, media_type="text/event-stream", headers={"X-Maestro-Node": node.name})


async def read_first_event(response: aiohttp.ClientResponse) -> bytes:
    """The stream's bytes up to the end of its first event; a node that fails before that fails the attempt."""
    data = b""
    try:
        while b"\n\n" not in data:
            raw = await response.content.readany()
            if not raw:
                raise NodeFailed("the stream ended before its first event")
            data += raw
    except UpstreamError as error:
        response.close()
        raise attempt_failed(error, "before the stream's first event") from None
    except NodeFailed:
        response.close()
        raise
    return data


class EventReader:
    """A vLLM stream's bytes → its whole SSE events, each read into the call's `CallResult` as it comes in (so its
    first content event is the stage's first token), a partial event kept until its end arrives."""

    def __init__(self, result: CallResult):
        self.result, self.pending = result, ""
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span two chunks

    def feed(self, raw: bytes) -> str:
        """The whole events `raw` completes ("" for none), already read into the result."""
        head, end, self.pending = (self.pending + self.decoder.decode(raw)).rpartition("\n\n")
        for line in head.split("\n") if end else ():
            self.result.read_sse_line(line)
        return head + end


async def relay_stream(
    call: StageCall, node: Node, response: aiohttp.ClientResponse, events: EventReader, first: str = ""
):
    """Relay whole SSE events to the client (`first`: those read before the relay began); a node failing
    mid-stream, or a stream ending without `[DONE]`, ends it with an error event (a partial event is dropped, so the
    client's stream stays well-formed)."""
    gateway, job, result, kv_usage = call.gateway, call.job, events.result, node.kv_usage
    is_complete = False
    try:
        async for text in _prepend(first, response.content.iter_any(), events.feed):
            if not text:
                continue
            if job.node is not None and result.has_final_usage:  # vLLM's last chunk
                gateway.dispatcher.finish(job)  # KV back before the tail is written to the client
                result.released_s = time.monotonic()
            yield text
        is_complete = True
        if not result.is_stream_done:
            result.error = f"{node.name}'s stream ended before data: [DONE]"
            yield sse_error(result.error)
    except UpstreamError as error:
        result.error = f"{node.name} failed mid-stream: {describe(error)}"
        yield sse_error(result.error, 504 if is_deadline(error) else 502)
    except BaseException:
        result.error = "client disconnected"
        raise
    finally:
        counter = "cancelled" if result.error == "client disconnected" else "failed" if result.error else None
        call.end(result, node, kv_usage, counter=counter)
        end_stream(response, is_complete)


async def _prepend(first: str, rest, read):
    yield first
    async for raw in rest:
        yield read(raw)


def sse_error(message: str, status: int = 502) -> str:
    """The end of a failed stream, as vLLM writes it: an error event, then `data: [DONE]`."""
    error = {"error": {"message": message, "type": "upstream_error", "param": None, "code": status}}
    return f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n"
