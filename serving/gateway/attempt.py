"""One attempt at a node: the headers it goes with, how it ends, and what a failure of it means for the stage."""

from __future__ import annotations

import asyncio

import aiohttp

from serving.gateway.core import Gateway
from serving.gateway.jobs import Job
from serving.gateway.router_hints import hint_headers
from serving.gateway.upstream import is_deadline


class NodeFailed(Exception):
    """The node did not answer (connection, timeout, 5xx): the stage may run elsewhere."""


class DeadlinePassed(Exception):
    """The stage's deadline cut the attempt: the stage fails with 504, it is not retried."""


def attempt_failed(error: BaseException, where: str) -> Exception:
    """What a transport failure of an attempt (`where`: in which part of the call) means for the stage: past its
    deadline, or a node that failed."""
    if is_deadline(error):
        return DeadlinePassed(where)
    return NodeFailed(f"{where}: {describe(error)}")


def describe(error: BaseException) -> str:
    """A transport failure in words (aiohttp's timeouts carry no message)."""
    if is_deadline(error):
        return "cut at the stage's deadline"
    if isinstance(error, asyncio.TimeoutError):
        return f"timed out ({type(error).__name__}: no byte within node_timeout_s, or no connection)"
    return f"{type(error).__name__}: {error}"


def upstream_headers(gateway: Gateway, job: Job) -> dict:
    """The request id of the attempt, the trace context vLLM's spans join (the stage's span with otel_spans, else
    the caller's as it came: spans.py), and the stage's prediction as router hints (hints.py)."""
    hints = hint_headers(
        gateway.config.upstream.router_hints, job.request.tokens_pred, job.request.tokens_reserve, job.prediction.p_tool
    )
    trace_context = gateway.spans.headers(job.span) if job.span is not None else dict(job.meta.trace_context)
    return {"X-Request-Id": f"{job.meta.label}#{job.num_attempts}", **trace_context, **hints}


def end_stream(response: aiohttp.ClientResponse, is_complete: bool) -> None:
    """A stream read to its end goes back to the pool; any other end (e.g. the client left) closes the
    connection, which makes vLLM abort the request."""
    if is_complete:
        response.release()
    else:
        response.close()
