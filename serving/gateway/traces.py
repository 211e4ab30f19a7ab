"""Rotating JSONL stage-trace files (DESIGN §3) that `pipelines.collect` reads as a directory.

Each line is flushed as soon as it is written, so a crash loses at most the line being written.
Files are named `<prefix>-<start stamp>-<seq>.jsonl`, so name order is write order.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


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
