"""Rotating JSONL file of observed stages, in the contract `collect` reads (a directory of *.jsonl)."""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pipelines.contract import StageTrace


@dataclass(frozen=True)
class TraceLogConfig:
    directory: str = "data/traces/observed"
    prefix: str = "predictor"
    max_bytes: int = 64 << 20  # rotate to a new file past this size

    def __post_init__(self) -> None:
        if self.max_bytes < 1024:
            raise ValueError(f"trace max_bytes must be ≥ 1024, got {self.max_bytes}")
        if not self.prefix or "/" in self.prefix:
            raise ValueError(f"trace prefix must be a plain file-name prefix, got {self.prefix!r}")


class TraceLog:
    """Appends completed stages, one contract line each; file names sort in time order for `collect`."""

    def __init__(self, config: TraceLogConfig | None = None):
        self.config = config or TraceLogConfig()
        self._lock = threading.Lock()
        self._path: Path | None = None
        self._bytes = 0

    @property
    def path(self) -> str | None:
        return str(self._path) if self._path else None

    def _new_file(self) -> Path:
        directory = Path(self.config.directory)
        directory.mkdir(parents=True, exist_ok=True)
        now_ns = time.time_ns()  # one reading: names must sort in the order the files were started
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now_ns // 10**9))
        # the nanoseconds keep two rotations within a second in order; the pid keeps workers apart
        return directory / f"{self.config.prefix}-{stamp}-{now_ns % 10**9:09d}-{os.getpid()}.jsonl"

    def append(self, stages: list[StageTrace], extra: list[dict] | None = None) -> int:
        """Write the stages (each merged with its `extra` fields); returns how many lines were written."""
        extra = extra or [{} for _ in stages]
        lines = "".join(json.dumps({**s.model_dump(exclude_none=True, exclude={"in_degree", "out_degree"}), **e},
                                   ensure_ascii=False) + "\n" for s, e in zip(stages, extra))
        data = lines.encode("utf-8")
        with self._lock:
            if self._path is None or self._bytes + len(data) > self.config.max_bytes:
                self._path, self._bytes = self._new_file(), 0
            with self._path.open("ab") as handle:
                handle.write(data)
            self._bytes += len(data)
        return len(stages)
