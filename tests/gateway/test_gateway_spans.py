"""`otel_spans`: one OpenTelemetry span per stage in the GenAI conventions, caught by the SDK's in-memory exporter."""
from __future__ import annotations

import asyncio

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from serving.gateway.spans import StageSpans

from .conftest import run_app

STAGE = {"X-Maestro-Workflow": "wf-otel", "X-Maestro-Stage": "plan", "X-Maestro-Role": "planner"}


def spans_of(tmp_path, bodies: list[dict], **config_kw) -> tuple[list, bool]:
    """The finished spans of `bodies` sent through the gateway, and whether the config alone made spans on."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def calls(client, gateway):
        is_on = gateway.spans is not None
        gateway.spans = StageSpans(gateway.config.model, provider) if is_on else None  # the test's provider, not the process's global one
        for i, body in enumerate(bodies):
            await client.post("/v1/chat/completions", json=body, headers={**STAGE, "X-Maestro-Stage": f"s{i}"})
        return is_on

    is_on = asyncio.run(run_app(tmp_path, {"a": True}, calls, **config_kw))
    return exporter.get_finished_spans(), is_on


def test_a_stage_is_one_genai_client_span(tmp_path):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}
    (span,), is_on = spans_of(tmp_path, [body], otel_spans=True)
    assert is_on and span.name == "chat tiny" and span.kind is SpanKind.CLIENT
    attributes = dict(span.attributes)
    assert {k: attributes[k] for k in ("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.request.max_tokens",
                                       "gen_ai.conversation.id", "gen_ai.agent.name", "gen_ai.usage.input_tokens",
                                       "gen_ai.usage.output_tokens")} == {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "tiny", "gen_ai.request.max_tokens": 7,
        "gen_ai.conversation.id": "wf-otel", "gen_ai.agent.name": "planner", "gen_ai.usage.input_tokens": 5,
        "gen_ai.usage.output_tokens": 7}
    assert attributes["gen_ai.response.finish_reasons"] == ("length",) and attributes["maestro.outcome"] == "completed"
    assert attributes["maestro.tokens_pred"] > 0 and attributes["maestro.node"] == "a"
    assert span.end_time > span.start_time and span.status.status_code is StatusCode.UNSET


def test_a_refused_stage_is_an_error_span(tmp_path):
    (span,), _ = spans_of(tmp_path, [{"messages": []}], otel_spans=True)
    assert span.status.status_code is StatusCode.ERROR and span.attributes["error.type"] == "refused"


def test_spans_are_off_by_default(tmp_path):
    spans, is_on = spans_of(tmp_path, [{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}])
    assert not is_on and spans == ()
