"""DVC stage `collect`: gather stage traces into one validated contract file.

`collect.source` is a trace file (the synthetic sample, or any JSONL/Parquet import) or a directory
of rotating trace files written by the gateway (`*.jsonl`, read in name order). Malformed lines, and
files that cannot be read at all (a corrupt Parquet file, an I/O error, a file deleted mid-run by trace
retention), are reported (stdout and collect_report.json) and skipped; they never stop the rest.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tqdm import tqdm

from pipelines.contract import LineError, StageTrace, UnreadableTraceFile, line_report, read_traces, write_jsonl
from pipelines.params import load_params


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


def collect(source: str | Path) -> tuple[list[StageTrace], list[LineError]]:
    """Read every file of the source; stages of one workflow may span rotated files.

    A file that cannot be read is one error (line None) and the other files are still read; when
    no file at all could be read there is nothing to collect, and that raises."""
    stages, errors, seen = [], [], set()
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
        for stage in result.stages:
            key = (stage.workflow_id, stage.stage_id)
            if key in seen:
                errors.append(LineError(str(path), -1, f"stage {key} already read from an earlier file; kept the first"))
                continue
            seen.add(key)
            stages.append(stage)
    unreadable = unreadable_files(errors)
    if unreadable and len(unreadable) == len(files):
        raise ValueError("no trace file could be read:\n" + "\n".join(f"  {e}" for e in unreadable))
    return stages, errors


def unreadable_files(errors: list[LineError]) -> list[LineError]:
    return [e for e in errors if e.line is None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="data/traces/collected.jsonl")
    parser.add_argument("--report", default="data/traces/collect_report.json")
    args = parser.parse_args()
    stages, errors = collect(load_params("collect")["source"])
    labelled = [s for s in stages if s.is_labelled and s.is_tool_call is not None]
    write_jsonl(labelled, args.out)
    unreadable = unreadable_files(errors)
    ordered = unreadable + [e for e in errors if e.line is not None]  # whole files first: they lose the most
    report = {"stages": len(stages), "labelled": len(labelled), "malformed": len(errors) - len(unreadable),
              "unreadable_files": len(unreadable), "errors": [str(e) for e in ordered[:1000]]}
    Path(args.report).write_text(json.dumps(report, indent=1))
    print(line_report(f"collected {len(labelled)} labelled stages ({len(stages) - len(labelled)} unlabelled "
                      f"skipped, {report['malformed']} malformed lines, {len(unreadable)} unreadable files)", ordered))


if __name__ == "__main__":
    main()
