"""A stage's call ended (`Gateway.record`): its one trace line written (and its span, and /metrics), and what the
gateway learns from it fed where it is kept.

Its session's tool phase and held context, its workflow's attained service and remaining-work history, an unseen app's
own reserve level (`Gateway.own_reserves`), the triage's measure of the pool, the predictor, the prompt sizer and its
node's decode pace; the workflow ends at its final call.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from serving.gateway.jobs import Job
from serving.gateway.outcome import CallResult
from serving.gateway.sessions import tool_key
from serving.gateway.traces import trace_record

if TYPE_CHECKING:
    from serving.gateway.core import Gateway


def record_call(
    gateway: Gateway, job: Job, body: dict, result: CallResult, node_name: str | None, kv_usage: float | None
) -> None:
    """Write the stage's one trace line and report the outcome to the predictor."""
    record = trace_record(job, body, result, node_name, kv_usage)
    gateway.traces.write(record)
    gateway.metrics.observe(record)
    if gateway.spans is not None:
        gateway.spans.emit(record, job.span or gateway.spans.start(job.meta.trace_context, job.arrival.unix_s))
    node = next((n for n in gateway.nodes if n.name == node_name), None)
    key = job.meta.workflow_key
    if "output_tokens" not in record:
        if job.meta.final:
            gateway.end_workflow(key, completed=False)
        return
    gateway.sessions.stage_ended(
        key,
        node,
        result.prompt_tokens + result.output_tokens,
        result.is_tool_call or job.meta.tool_call,
        tool_key(job.meta.app, job.meta.role),
        job.meta.final,
        time.monotonic(),
    )
    service_s = gateway.pace.service_s(result.prompt_tokens, result.output_tokens)
    if (workflow := gateway.workflows.get(key)) is not None:
        workflow.attained_s += service_s
    gateway.remaining_work.observe(key, job.meta.app or "", service_s)
    if job.unseen_reserve is not None:  # an unseen app's finished stage scores the reserve it was answered
        gateway.own_reserves.observe(job.meta.app or "", job.unseen_reserve, result.output_tokens)
    gateway.served(job, service_s)
    if job.meta.final:
        gateway.end_workflow(key, completed=True)
    gateway.predictor.observe(record)
    gateway.sizer.observe(job.prompt_chars, job.num_messages, result.prompt_tokens)
    if node is not None:
        node.observe_decode(result.output_tokens, record["upstream_s"])  # the node's time, not the gateway's
