"""A vLLM stat-logger plugin: per-step engine state and per-request queue/prefill/decode times as JSONL.

Installed into vLLM's environment (`pip install -e serving/vllm_plugin`), it is loaded by the
OpenAI server through the entry-point group `vllm.stat_logger_plugins`. It writes to
`$MAESTRO_VLLM_STATS_DIR` (default `./vllm-stats`), one file per engine process, flushed per line.
Request ids are the gateway's `X-Request-Id` (`<workflow>::<stage>#<attempt>`), so lines join
with the gateway's stage traces.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from vllm.v1.metrics.loggers import StatLoggerBase

STEP_EVERY = int(os.environ.get("MAESTRO_VLLM_STATS_STEP_EVERY", "1"))  # write every N-th step record


class MaestroStatLogger(StatLoggerBase):
    def __init__(self, vllm_config, engine_index: int = 0):
        directory = Path(os.environ.get("MAESTRO_VLLM_STATS_DIR", "vllm-stats"))
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"vllm-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-e{engine_index}.jsonl"
        self.handle = self.path.open("a", encoding="utf-8")
        self.engine_index = engine_index
        self.num_steps = 0
        self.num_preemptions = 0

    def _write(self, record: dict) -> None:
        self.handle.write(json.dumps(record) + "\n")
        self.handle.flush()

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        now = time.time()
        if iteration_stats is not None:
            self.num_preemptions += iteration_stats.num_preempted_reqs
            for finished in iteration_stats.finished_requests:
                self._write(request_record(finished, now, engine_idx))
        if scheduler_stats is None:
            return
        self.num_steps += 1
        if self.num_steps % STEP_EVERY == 0:
            self._write(step_record(scheduler_stats, iteration_stats, now, engine_idx, self.num_preemptions))

    def log_engine_initialized(self):
        self._write({"kind": "engine", "t": time.time(), "engine": self.engine_index, "pid": os.getpid()})


def step_record(stats, iteration, now: float, engine: int, num_preemptions: int) -> dict:
    return {"kind": "step", "t": round(now, 6), "engine": engine, "running": stats.num_running_reqs,
            "waiting": stats.num_waiting_reqs, "kv_usage": round(stats.kv_cache_usage, 5),
            "generation_tokens": iteration.num_generation_tokens if iteration else 0,
            "prompt_tokens": iteration.num_prompt_tokens if iteration else 0,
            "preempted": iteration.num_preempted_reqs if iteration else 0, "preemptions_total": num_preemptions}


def request_record(finished, now: float, engine: int) -> dict:
    return {"kind": "request", "t": round(now, 6), "engine": engine, "request_id": finished.request_id,
            "finish_reason": str(finished.finish_reason), "prompt_tokens": finished.num_prompt_tokens,
            "generation_tokens": finished.num_generation_tokens, "max_tokens": finished.max_tokens_param,
            "queued_s": finished.queued_time, "prefill_s": finished.prefill_time, "decode_s": finished.decode_time,
            "inference_s": finished.inference_time, "e2e_s": finished.e2e_latency,
            "num_preemptions": finished.num_preemptions, "num_cached_tokens": finished.num_cached_tokens}
