"""Where the fields of the flat config file (before the sections) went, so an old file gets a message saying so."""

from __future__ import annotations

MOVED = {
    "policy": "system.name",
    "policy_options": "system.options",
    "slo_s": "system.slo_s",
    "batch_cost": "system.batch_cost",
    "tool_kv": "system.tool_kv",
    "session_cap": "system.cap",
    "host": "server.host",
    "port": "server.port",
    "max_body_bytes": "server.max_body_bytes",
    "api_keys": "server.api_keys",
    "api_keys_file": "server.api_keys_file",
    "cpu_nice": "server.cpu_nice",
    "otel_spans": "server.otel_spans",
    "predictor_model": "predictor.model",
    "predictor_timeout_s": "predictor.timeout_s",
    "predictor_startup_timeout_s": "predictor.startup_timeout_s",
    "kv_admission": "kv.admission",
    "kv_overcommit": "kv.overcommit",
    "decode_rate_margin": "kv.decode_rate_margin",
    "rho": "kv.rho",
    "chars_per_token": "kv.chars_per_token",
    "calibrate_prompt_tokens": "kv.calibrate_prompt_tokens",
    "default_max_tokens": "kv.default_max_tokens",
    "tool_workers": "sessions.tool_workers",
    "prefill_s_per_token": "sessions.prefill_s_per_token",
    "session_idle_s": "sessions.idle_s",
    "aimd": "sessions.aimd",
    "max_queued": "limits.max_queued",
    "max_inflight_per_node": "limits.max_inflight_per_node",
    "retry_after_s": "limits.retry_after_s",
    "max_attempts": "limits.max_attempts",
    "request_timeout_s": "limits.request_timeout_s",
    "backfill_depth": "limits.backfill_depth",
    "backfill_max_overtaken": "limits.backfill_max_overtaken",
    "admission_recheck_s": "limits.admission_recheck_s",
    "completed_cache": "limits.completed_cache",
    "node_timeout_s": "upstream.node_timeout_s",
    "connect_timeout_s": "upstream.connect_timeout_s",
    "metrics_period_s": "upstream.metrics_period_s",
    "node_down_after_failed_polls": "upstream.node_down_after_failed_polls",
    "stream_upstream": "upstream.stream",
    "router_hints": "upstream.router_hints",
    "trace_dir": "traces.dir",
    "trace_rotate_lines": "traces.rotate_lines",
}
# Knobs the experiments found no gain for (serving/gateway/EXPERIMENTS.md keeps what they did).
REMOVED = (
    "workflow_cap",
    "workflow_cap_adaptive",
    "workflow_idle_s",
    "workflow_cap_backoff",
    "workflow_cap_shrink_wait_s",
    "project_from_progress",
    "underoccupied_inflight",
    "handover_lead_s",
    "upstream_stream_interval",
)


def moved_keys(data: dict) -> str:
    """What to change in a config of the old flat shape ("" when none of its keys is old)."""
    parts = []
    if moved := [f"{key} → {MOVED[key]}" for key in data if key in MOVED]:
        parts.append("fields moved into sections: " + ", ".join(moved))
    if removed := [key for key in data if key in REMOVED]:
        parts.append(f"fields removed (no gain measured; serving/gateway/EXPERIMENTS.md): {', '.join(removed)}")
    if "predictor" in data and isinstance(data["predictor"], str):
        parts.append("predictor is a section now: predictor: {source: " + repr(data["predictor"]) + "}")
    return "; ".join(parts)
