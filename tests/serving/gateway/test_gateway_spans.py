"""`otel_spans`: one OpenTelemetry span per stage in the GenAI conventions, caught by the SDK's in-memory exporter;
and the W3C trace context each call to vLLM carries, so that vLLM's own spans join the trace."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from serving.gateway.spans import StageSpans

from .conftest import run_app

STAGE = {"X-Maestro-Workflow": "wf-otel", "X-Maestro-Stage": "plan", "X-Maestro-Role": "planner"}


CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"  # the caller's trace and span (W3C's example traceparent)
CALLER = {"traceparent": f"00-{CALLER_TRACE}-00f067aa0ba902b7-01", "tracestate": "caller=1"}


def spans_of(
    tmp_path, bodies: list[dict], headers: dict | None = None, node_headers: list | None = None, **sections
) -> tuple[list, bool]:
    """The finished spans of `bodies` sent through the gateway (with `headers`), and whether the config alone made
    spans on; `node_headers` collects the headers of each call the node got."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def calls(client, gateway):
        is_on = gateway.spans is not None
        gateway.spans = (
            StageSpans(gateway.config.model, provider) if is_on else None
        )  # the test's provider, not the process's global one
        for i, body in enumerate(bodies):
            await client.post(
                "/v1/chat/completions", json=body, headers={**STAGE, "X-Maestro-Stage": f"s{i}", **(headers or {})}
            )
        return is_on

    is_on = asyncio.run(run_app(tmp_path, {"a": True}, calls, node_kw={"headers": node_headers}, **sections))
    return exporter.get_finished_spans(), is_on


def parent_of(traceparent: str) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C traceparent, in hex."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00" and len(trace_id) == 32 and len(span_id) == 16 and len(flags) == 2, traceparent
    return trace_id, span_id


def test_vllm_gets_the_stage_span_as_parent_and_the_stage_span_joins_the_callers_trace(tmp_path):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    node_headers: list[dict] = []
    (span,), _ = spans_of(tmp_path, [body], headers=CALLER, node_headers=node_headers, server={"otel_spans": True})
    assert f"{span.context.trace_id:032x}" == CALLER_TRACE and f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    [sent] = node_headers
    assert parent_of(sent["traceparent"]) == (CALLER_TRACE, f"{span.context.span_id:016x}")
    assert sent["tracestate"] == "caller=1"


def test_without_a_callers_trace_the_stage_span_starts_one_that_vllm_joins(tmp_path):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    node_headers: list[dict] = []
    (span,), _ = spans_of(tmp_path, [body], node_headers=node_headers, server={"otel_spans": True})
    assert span.parent is None and span.attributes["maestro.outcome"] == "completed"
    [sent] = node_headers
    assert parent_of(sent["traceparent"]) == (f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}")


def test_with_spans_off_the_callers_trace_context_reaches_vllm_as_it_came(tmp_path):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with_trace, without_trace = [], []
    spans_of(tmp_path / "with", [body], headers=CALLER, node_headers=with_trace)
    spans_of(tmp_path / "without", [body], node_headers=without_trace)
    assert {k: with_trace[0][k] for k in CALLER} == CALLER
    assert "traceparent" not in without_trace[0] and "tracestate" not in without_trace[0]


def test_a_stage_is_one_genai_client_span(tmp_path):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}
    (span,), is_on = spans_of(tmp_path, [body], server={"otel_spans": True})
    assert is_on and span.name == "chat tiny" and span.kind is SpanKind.CLIENT
    attributes = dict(span.attributes)
    assert {
        k: attributes[k]
        for k in (
            "gen_ai.operation.name",
            "gen_ai.request.model",
            "gen_ai.request.max_tokens",
            "gen_ai.conversation.id",
            "gen_ai.agent.name",
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
        )
    } == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "tiny",
        "gen_ai.request.max_tokens": 7,
        "gen_ai.conversation.id": "wf-otel",
        "gen_ai.agent.name": "planner",
        "gen_ai.usage.input_tokens": 5,
        "gen_ai.usage.output_tokens": 7,
    }
    assert attributes["gen_ai.response.finish_reasons"] == ("length",) and attributes["maestro.outcome"] == "completed"
    assert attributes["maestro.tokens_pred"] > 0 and attributes["maestro.node"] == "a"
    assert span.end_time > span.start_time and span.status.status_code is StatusCode.UNSET


def test_a_refused_stage_is_an_error_span(tmp_path):
    (span,), _ = spans_of(tmp_path, [{"messages": []}], server={"otel_spans": True})
    assert span.status.status_code is StatusCode.ERROR and span.attributes["error.type"] == "refused"


def test_spans_are_off_by_default(tmp_path):
    spans, is_on = spans_of(tmp_path, [{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}])
    assert not is_on and spans == ()
