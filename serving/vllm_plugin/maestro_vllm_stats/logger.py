"""The stat logger vLLM loads (entry point `maestro_vllm_stats:MaestroStatLogger`): one JSONL file per engine
process, one line per finished request and per N-th step (the records are made in the package's __init__)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from vllm.v1.metrics.loggers import StatLoggerBase

from . import request_record, step_record

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
