"""Rotating JSONL file of observed stages, in the contract `collect` reads (a directory of *.jsonl)."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from maestro.contract import StageTrace


@dataclass(frozen=True)
class TraceLogConfig:
    directory: str = "data/traces/observed"
    prefix: str = "predictor"
    max_bytes: int = 64 << 20  # rotate to a new file past this size
    # Retention, applied each time a new file is started: the oldest files of this prefix are deleted
    # until at most max_files are left, holding at most max_total_bytes. 0: no limit.
    max_files: int = 256
    max_total_bytes: int = 8 << 30

    def __post_init__(self) -> None:
        if self.max_bytes < 1024:
            raise ValueError(f"trace max_bytes must be ≥ 1024, got {self.max_bytes}")
        if not self.prefix or "/" in self.prefix:
            raise ValueError(f"trace prefix must be a plain file-name prefix, got {self.prefix!r}")
        if self.max_files < 0:
            raise ValueError(f"trace max_files must be ≥ 1, or 0 to keep every file; got {self.max_files}")
        if self.max_total_bytes and self.max_total_bytes < self.max_bytes:
            raise ValueError(
                f"trace max_total_bytes ({self.max_total_bytes}) must be ≥ max_bytes ({self.max_bytes}) "
                "so that one full file fits, or 0 for no limit"
            )


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
        lines = "".join(
            json.dumps(
                {**s.model_dump(exclude_none=True, exclude={"in_degree", "out_degree"}), **e}, ensure_ascii=False
            )
            + "\n"
            for s, e in zip(stages, extra)
        )
        data = lines.encode("utf-8")
        with self._lock:
            is_new_file = self._path is None or self._bytes + len(data) > self.config.max_bytes
            if is_new_file:
                self._path, self._bytes = self._new_file(), 0
            with self._path.open("ab") as handle:
                handle.write(data)
            self._bytes += len(data)
            if is_new_file:
                self.retain()
        return len(stages)

    def retain(self) -> list[Path]:
        """Delete the oldest files of this prefix past max_files / max_total_bytes; returns those deleted.

        A file that a running writer may still append to (the newest file of a live pid, this
        process's included) is never deleted, so the limits can be exceeded by those files."""
        sizes = _sizes(sorted(Path(self.config.directory).glob(f"{self.config.prefix}-*.jsonl")))
        live = _files_being_written(list(sizes)) | ({self._path} if self._path else set())
        num_files, num_bytes, deleted = len(sizes), sum(sizes.values()), []
        for path, size in sizes.items():  # oldest first: names sort in the order files were started
            if self._is_within_limits(num_files, num_bytes):
                break
            if path in live:
                continue
            path.unlink(missing_ok=True)
            num_files, num_bytes = num_files - 1, num_bytes - size
            deleted.append(path)
        return deleted

    def _is_within_limits(self, num_files: int, num_bytes: int) -> bool:
        max_files, max_bytes = self.config.max_files, self.config.max_total_bytes
        return (not max_files or num_files <= max_files) and (not max_bytes or num_bytes <= max_bytes)


def read_recent(config: TraceLogConfig, max_bytes: int) -> list[StageTrace]:
    """The newest observed stages in the trace directory, oldest first, from at most `max_bytes` of its newest
    files (every writer's: replicas sharing the directory rebuild each other's history). A line that does not
    parse is skipped: the history is a cache, the trace file stays the record."""
    paths = sorted(Path(config.directory).glob(f"{config.prefix}-*.jsonl"))
    chosen, total = [], 0
    for path, size in reversed(_sizes(paths).items()):  # newest first
        if total + size > max_bytes:
            break
        chosen.append(path)
        total += size
    stages = []
    for path in reversed(chosen):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                stages.append(StageTrace.model_validate_json(line))
            except ValueError:
                continue
    return stages


def _sizes(paths: list[Path]) -> dict[Path, int]:
    sizes = {}
    for path in paths:
        try:
            sizes[path] = path.stat().st_size
        except FileNotFoundError:  # deleted meanwhile by another writer's retention
            pass
    return sizes


def _files_being_written(paths: list[Path]) -> set[Path]:
    """The newest file of each writer pid (the name's last part) whose process is still running."""
    newest: dict[int, Path] = {}
    for path in paths:  # in name order, so the last one seen per pid is its newest
        pid = path.stem.rsplit("-", 1)[-1]
        if pid.isdigit():
            newest[int(pid)] = path
    return {path for pid, path in newest.items() if _is_running(pid)}


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
