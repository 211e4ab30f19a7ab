"""A vLLM stat-logger plugin: per-step engine state and per-request queue/prefill/decode times as JSONL.

Installed into vLLM's environment (`pip install -e serving/vllm_plugin`), it is loaded by the
OpenAI server through the entry-point group `vllm.stat_logger_plugins`. It writes to
`$MAESTRO_VLLM_STATS_DIR` (default `./vllm-stats`), one file per engine process, flushed per line.

A request line joins the gateway's stage traces on `gateway_request_id`: the gateway's `X-Request-Id`
(`<workflow>::<stage>#<attempt>`) as vLLM got it. vLLM's own `request_id` (kept as it is) wraps it: the
OpenAI server prefixes `chatcmpl-` or `cmpl-`, and vLLM since 0.11 appends `-` and 8 random hex digits
to keep ids unique in the engine (`VLLM_DISABLE_REQUEST_ID_RANDOMIZATION` turns that off).

This module is plain Python, so that what it writes can be read and tested without vLLM; the logger
class, which needs vLLM, is in `logger.py` and imported when vLLM asks for it.
"""

from __future__ import annotations

import re

# vLLM's request id around the gateway's: the OpenAI server's prefix, then vLLM's random suffix, if any.
_VLLM_REQUEST_ID = re.compile(r"(?:chatcmpl-|cmpl-)?(?P<gateway>.+#\d+)(?:-[0-9a-f]{8})?")


def gateway_request_id(request_id: str | None) -> str | None:
    """The gateway's `X-Request-Id` inside vLLM's `request_id`; None for a request that did not come through it."""
    match = _VLLM_REQUEST_ID.fullmatch(request_id or "")
    return match["gateway"] if match else None


def step_record(stats, iteration, now: float, engine: int, num_preemptions: int) -> dict:
    return {
        "kind": "step",
        "t": round(now, 6),
        "engine": engine,
        "running": stats.num_running_reqs,
        "waiting": stats.num_waiting_reqs,
        "kv_usage": round(stats.kv_cache_usage, 5),
        "generation_tokens": iteration.num_generation_tokens if iteration else 0,
        "prompt_tokens": iteration.num_prompt_tokens if iteration else 0,
        "preempted": iteration.num_preempted_reqs if iteration else 0,
        "preemptions_total": num_preemptions,
    }


def request_record(finished, now: float, engine: int) -> dict:
    return {
        "kind": "request",
        "t": round(now, 6),
        "engine": engine,
        "request_id": finished.request_id,
        "gateway_request_id": gateway_request_id(finished.request_id),
        "finish_reason": str(finished.finish_reason),
        "prompt_tokens": finished.num_prompt_tokens,
        "generation_tokens": finished.num_generation_tokens,
        "max_tokens": finished.max_tokens_param,
        "queued_s": finished.queued_time,
        "prefill_s": finished.prefill_time,
        "decode_s": finished.decode_time,
        "inference_s": finished.inference_time,
        "e2e_s": finished.e2e_latency,
        "num_preemptions": finished.num_preemptions,
        "num_cached_tokens": finished.num_cached_tokens,
    }


def __getattr__(name: str):
    """`MaestroStatLogger` (the entry point) on first use: importing it imports vLLM."""
    if name == "MaestroStatLogger":
        from .logger import MaestroStatLogger

        return MaestroStatLogger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
