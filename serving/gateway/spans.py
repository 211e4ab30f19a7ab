"""OpenTelemetry spans in the GenAI semantic conventions: one per stage, its attributes from its trace line
(`otel_spans`).

The gateway makes spans through the OpenTelemetry API only; where they go is the process's TracerProvider, which
the operator sets up (e.g. `opentelemetry-instrument` with an OTLP exporter). Without one, spans cost next to
nothing and go nowhere; with `otel_spans` off (the default) none are made.

A stage's span is a child of the caller's trace (its `traceparent`/`tracestate`, StageMeta.trace_context), and is
started when the stage is first dispatched, so that each call to vLLM carries it as `traceparent` (`headers`):
vLLM started with `--otlp-traces-endpoint` makes its request spans children of the gateway's. With spans off the
caller's trace context goes to vLLM as it came (attempt.upstream_headers).
"""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

PROVIDER = "vllm"
PROPAGATOR = TraceContextTextMapPropagator()  # W3C traceparent / tracestate, as vLLM reads them
# Trace-line fields carried as they are, under maestro.*: what the gateway predicted and did.
MAESTRO_FIELDS = (
    "stage_id",
    "tokens_pred",
    "tokens_reserve",
    "p_tool",
    "prediction_source",
    "queue_s",
    "node",
    "attempts",
    "outcome",
)


class StageSpans:
    """One CLIENT span per stage, from its arrival (`start`) to its trace line (`emit`). `model`: the gateway's, for
    calls that name none (the gateway fills it in before forwarding)."""

    def __init__(self, model: str = "", tracer_provider: trace.TracerProvider | None = None):
        self.model = model
        self.tracer = trace.get_tracer("maestro.gateway", tracer_provider=tracer_provider)

    def start(self, trace_context: tuple[tuple[str, str], ...], arrival_unix_s: float) -> Span:
        """The stage's span, a child of the caller's trace (none: a new trace), backdated to its arrival; named
        and given its attributes by `emit`."""
        parent = PROPAGATOR.extract(dict(trace_context))
        return self.tracer.start_span(
            "stage", context=parent, kind=SpanKind.CLIENT, start_time=int(arrival_unix_s * 1e9)
        )

    @staticmethod
    def headers(span: Span) -> dict[str, str]:
        """`traceparent` (and `tracestate`) naming `span` as the parent, for the call to vLLM."""
        carrier: dict[str, str] = {}
        PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def emit(self, record: dict, span: Span) -> None:
        """End the stage's `span` with the attributes of its trace line."""
        values = attributes(record, record.get("model") or self.model)
        model = values.get(gen_ai.GEN_AI_REQUEST_MODEL, "")
        span.update_name(f"{values[gen_ai.GEN_AI_OPERATION_NAME]} {model}".strip())
        span.set_attributes(values)
        if record["outcome"] != "completed":
            span.set_attribute(error_attributes.ERROR_TYPE, record["outcome"])
            span.set_status(Status(StatusCode.ERROR, record.get("error")))
        span.end(end_time=time.time_ns())


def attributes(record: dict, model: str) -> dict:
    """GenAI attributes of a trace line: the workflow is the conversation, the stage's role the agent."""
    values = {
        gen_ai.GEN_AI_OPERATION_NAME: "chat" if isinstance(record.get("prompt"), list) else "text_completion",
        gen_ai.GEN_AI_PROVIDER_NAME: PROVIDER,
        gen_ai.GEN_AI_REQUEST_MODEL: model or None,
        gen_ai.GEN_AI_REQUEST_MAX_TOKENS: record.get("max_tokens"),
        gen_ai.GEN_AI_CONVERSATION_ID: record["workflow_id"],
        gen_ai.GEN_AI_AGENT_NAME: record.get("role"),
        gen_ai.GEN_AI_USAGE_INPUT_TOKENS: record.get("prompt_tokens"),
        gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: record.get("output_tokens"),
        gen_ai.GEN_AI_RESPONSE_FINISH_REASONS: [record["finish_reason"]] if record.get("finish_reason") else None,
        gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: record.get("ttft_s"),
        **{f"maestro.{name}": record.get(name) for name in MAESTRO_FIELDS},
    }
    return {k: v for k, v in values.items() if v is not None}
