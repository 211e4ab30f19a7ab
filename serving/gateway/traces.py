"""Rotating JSONL stage-trace files (DESIGN §3) that `pipelines.collect` reads as a directory, and the one line a
call writes there (`trace_record`).

Each line is flushed as soon as it is written, so a crash loses at most the line being written.
Files are named `<prefix>-<start stamp>-<seq>.jsonl`, so name order is write order.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from serving.gateway.jobs import Job
from serving.gateway.outcome import CallResult


class TraceWriter:
    """Append stage traces, one JSON object per line, rotating every `rotate_lines` lines."""

    def __init__(self, directory: str | Path, rotate_lines: int = 10000, prefix: str = "gateway", fsync: bool = False):
        self.directory = Path(directory)
        self.rotate_lines = rotate_lines
        self.prefix = f"{prefix}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        self.fsync = fsync
        self.num_files = 0
        self.num_lines = 0
        self._lines_in_file = 0
        self._handle = None

    @property
    def path(self) -> Path | None:
        return Path(self._handle.name) if self._handle else None

    def write(self, record: dict) -> None:
        if self._handle is None or self._lines_in_file >= self.rotate_lines:
            self._rotate()
        self._handle.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._handle.flush()
        if self.fsync:
            os.fsync(self._handle.fileno())
        self._lines_in_file += 1
        self.num_lines += 1

    def _rotate(self) -> None:
        self.close()
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.prefix}-{self.num_files:05d}.jsonl"
        self._handle = path.open("a", encoding="utf-8")
        self.num_files += 1
        self._lines_in_file = 0

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def trace_record(job: Job, body: dict, result: CallResult, node_name: str | None, kv_usage: float | None) -> dict:
    """The contract line (DESIGN §3) for one call, plus gateway-side extras.

    `outcome`: completed (labelled), failed (it reached a node), or refused (it never did: invalid, queue full,
    no node, deadline or client gone while queued; `error` says which). A stage refused as invalid has no
    prediction (`job.prediction` None) and its body is only what the client sent.

    Times: `arrival_s` (Unix) is when the call was read, before its prediction; `ttft_s`, `e2e_s` and
    `kv_released_s` count from it, so each holds `predict_s` and `queue_s`; `upstream_s` is the last attempt's
    time at its node (sent → answer's end). `slo_s` is the SLO the call sent, `deadline_s` (Unix) the deadline
    the stage was scheduled by (its workflow's first arrival + the SLO, the call's or `system.slo_s`).
    """
    meta, prediction, end = job.meta, job.prediction, time.monotonic()
    since_arrival = lambda instant: round(instant - job.arrival.monotonic_s, 6) if instant is not None else None
    tools = body.get("tools") if prediction is not None else None  # (an invalid body's tools may be anything)
    record = {
        "workflow_id": meta.workflow_id,
        "stage_id": meta.stage_id,
        "role": meta.role,
        "app": meta.app,
        "caller_id": meta.caller_id or None,
        "model": body.get("model"),
        "parent_ids": list(meta.parent_ids),
        "interactive": meta.interactive,
        "prompt": body.get("messages") if "messages" in body else body.get("prompt", ""),
        "n_tools": len(tools or []) or None,
        "tool_names": [t.get("function", {}).get("name") for t in tools or []] or None,
        "arrival_s": round(job.arrival.unix_s, 6),
        "slo_s": meta.slo_s,
        "queue_s": round(job.queue_s, 6),
        "node": node_name,
        "kv_usage_seen": kv_usage,
        "attempts": job.num_attempts,
    }
    if prediction is not None:
        record.update(
            tokens_pred=prediction.tokens_pred,
            tokens_reserve=prediction.tokens_reserve,
            p_tool=prediction.p_tool,
            fallback_level=prediction.fallback_level,
            history=prediction.history,
            prediction_source=job.prediction_source,
            predict_s=round(job.predict_s, 6),
            kv_tokens_reserved=job.reserve_tokens,
            max_tokens=job.request.max_tokens,
            deadline_s=unix_deadline(job),
        )
    if result.error is None and result.output_tokens is not None:
        record["outcome"] = "completed"
        record.update(
            output_tokens=result.output_tokens,
            prompt_tokens=result.prompt_tokens,
            is_tool_call=result.is_tool_call,
            output_text=result.output_text,
            finish_reason=result.finish_reason,
            e2e_s=since_arrival(end),
            ttft_s=since_arrival(result.first_token_s),
            kv_released_s=since_arrival(result.released_s),
            upstream_s=round(end - result.started_s, 6),
        )
    else:
        record["outcome"] = "failed" if job.num_attempts else "refused"
        record["error"] = result.error or "no usage in vLLM's response"
    return {k: v for k, v in record.items() if v is not None}


def unix_deadline(job: Job) -> float | None:
    """The deadline the stage was scheduled by, on the Unix clock of `arrival_s` (None without an SLO)."""
    deadline_s = job.request.deadline_s
    if not math.isfinite(deadline_s):
        return None
    return round(job.arrival.unix_s + deadline_s - job.arrival.monotonic_s, 6)
