"""Gathering stage traces into one validated contract file (the DVC stage: pipelines/stages/collect.py).

`collect.source` is a trace file (the synthetic sample, or any JSONL/Parquet import) or a directory
of rotating trace files written by the gateway (`*.jsonl`, read in name order). Malformed lines, and
files that cannot be read at all (a corrupt Parquet file, an I/O error, a file deleted mid-run by trace
retention), are reported (stdout and collect_report.json) and skipped; they never stop the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from maestro.contract import LineError, StageIndex, StageTrace, UnreadableTraceFile, read_traces


def source_files(source: str | Path) -> list[Path]:
    source = Path(source)
    if source.is_dir():
        files = sorted([*source.glob("*.jsonl"), *source.glob("*.parquet")])
        if not files:
            raise FileNotFoundError(f"{source} holds no *.jsonl or *.parquet trace files")
        return files
    if not source.exists():
        raise FileNotFoundError(f"collect.source {source} does not exist: point it at a trace file or directory")
    return [source]


@dataclass
class Collected:
    """The stages collected (one per workflow_id/stage_id), the lines and files that could not be read, and
    how many unfinished lines (a refused or failed attempt the client retried) a completed line superseded."""

    stages: list[StageTrace]
    errors: list[LineError]
    num_superseded: int


def collect(source: str | Path) -> tuple[list[StageTrace], list[LineError]]:
    """The stages and the errors of `collect_stages`."""
    collected = collect_stages(source)
    return collected.stages, collected.errors


def collect_stages(source: str | Path) -> Collected:
    """Read every file of the source; stages of one workflow may span rotated files, and a stage's unfinished
    line and its completed retry may lie in different files (`StageIndex` keeps the completed one).

    A file that cannot be read is one error (line None) and the other files are still read; when
    no file at all could be read there is nothing to collect, and that raises."""
    index, errors, num_superseded = StageIndex(), [], 0
    files = source_files(source)
    for path in tqdm(files, desc="collecting traces", unit="file"):
        try:
            result = read_traces(path, derive=False)
        except UnreadableTraceFile as error:
            errors.append(error.error)
            continue
        except FileNotFoundError:
            errors.append(LineError(str(path), None, "deleted while collecting (trace retention?); rerun collect"))
            continue
        errors.extend(result.errors)
        num_superseded += result.num_superseded
        for stage in result.stages:
            try:
                index.add(stage)
            except ValueError as error:
                errors.append(LineError(str(path), -1, f"{error}; the first is in an earlier file"))
    unreadable = unreadable_files(errors)
    if unreadable and len(unreadable) == len(files):
        raise ValueError("no trace file could be read:\n" + "\n".join(f"  {e}" for e in unreadable))
    return Collected(index.stages, errors, num_superseded + index.num_superseded)


def unreadable_files(errors: list[LineError]) -> list[LineError]:
    return [e for e in errors if e.line is None]
