"""OpenTelemetry spans in the GenAI semantic conventions: one per stage, made from its trace line (`otel_spans`).

The gateway makes spans through the OpenTelemetry API only; where they go is the process's TracerProvider, which
the operator sets up (e.g. `opentelemetry-instrument` with an OTLP exporter). Without one, spans cost next to
nothing and go nowhere; with `otel_spans` off (the default) none are made.
"""
from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes
from opentelemetry.trace import SpanKind, Status, StatusCode

PROVIDER = "vllm"
# Trace-line fields carried as they are, under maestro.*: what the gateway predicted and did.
MAESTRO_FIELDS = ("stage_id", "tokens_pred", "tokens_reserve", "p_tool", "prediction_source", "queue_s", "node",
                  "attempts", "outcome")


class StageSpans:
    """Turns each finished stage's trace line into one CLIENT span, backdated to the stage's arrival. `model`: the
    gateway's, for calls that name none (the gateway fills it in before forwarding)."""

    def __init__(self, model: str = "", tracer_provider: trace.TracerProvider | None = None):
        self.model = model
        self.tracer = trace.get_tracer("maestro.gateway", tracer_provider=tracer_provider)

    def emit(self, record: dict) -> None:
        values = attributes(record, record.get("model") or self.model)
        name = f"{values[gen_ai.GEN_AI_OPERATION_NAME]} {values.get(gen_ai.GEN_AI_REQUEST_MODEL, '')}".strip()
        span = self.tracer.start_span(name, kind=SpanKind.CLIENT, start_time=int(record["arrival_s"] * 1e9),
                                      attributes=values)
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
