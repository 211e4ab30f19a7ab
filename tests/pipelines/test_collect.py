"""`collect` over a trace directory that holds files it cannot read: each is reported by name, the rest collected."""

import json
import os
import sys

import pandas as pd
import pytest

from maestro.contract import StageTrace, UnreadableTraceFile, read_traces, write_jsonl
from pipelines.collect import collect
from pipelines.stages import collect as collect_stage


def stages(workflow: str, n: int = 3) -> list[StageTrace]:
    return [
        StageTrace(workflow_id=workflow, stage_id=str(i), role="r", prompt="p", output_tokens=i, is_tool_call=False)
        for i in range(n)
    ]


def write_parquet(rows: list[StageTrace], path):
    pd.DataFrame([s.model_dump(exclude_none=True) for s in rows]).to_parquet(path)
    return path


@pytest.fixture
def trace_dir(tmp_path):
    """Good JSONL and Parquet files beside random bytes, a truncated real Parquet file, one with a corrupt page
    and a `*.jsonl` that is a directory."""
    write_jsonl(stages("a"), tmp_path / "1-good.jsonl")
    write_parquet(stages("b"), tmp_path / "2-good.parquet")
    (tmp_path / "3-random.parquet").write_bytes(os.urandom(4096))
    whole = write_parquet(stages("c", 50), tmp_path / "whole.parquet").read_bytes()
    (tmp_path / "whole.parquet").unlink()
    (tmp_path / "4-truncated.parquet").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "4-bad-page.parquet").write_bytes(whole[:4] + b"\xff" * 64 + whole[68:])  # footer intact
    (tmp_path / "5-dir.jsonl").mkdir()
    write_jsonl(stages("d"), tmp_path / "6-good.jsonl")
    return tmp_path


def test_unreadable_files_are_reported_by_name_and_the_others_collected(trace_dir):
    read, errors = collect(trace_dir)
    assert sorted({s.workflow_id for s in read}) == ["a", "b", "d"] and len(read) == 9
    assert sorted(e.path.rsplit("/", 1)[-1] for e in errors) == [
        "3-random.parquet",
        "4-bad-page.parquet",
        "4-truncated.parquet",
        "5-dir.jsonl",
    ]
    assert all(e.line is None for e in errors)
    by_name = {e.path.rsplit("/", 1)[-1]: str(e) for e in errors}
    assert by_name["3-random.parquet"].startswith(f"{trace_dir / '3-random.parquet'}: not a readable Parquet file")
    assert "not a readable Parquet file" in by_name["4-truncated.parquet"]
    assert "OSError: Couldn't deserialize thrift" in by_name["4-bad-page.parquet"]
    assert "IsADirectoryError" in by_name["5-dir.jsonl"]


def test_a_corrupt_file_read_alone_raises_naming_it(trace_dir):
    with pytest.raises(UnreadableTraceFile, match="4-truncated.parquet: not a readable Parquet file"):
        read_traces(trace_dir / "4-truncated.parquet")
    with pytest.raises(ValueError, match="no trace file could be read:\n  .*3-random.parquet"):
        collect(trace_dir / "3-random.parquet")


def test_collect_report_counts_unreadable_files_apart_from_malformed_lines(
    trace_dir, tmp_path_factory, monkeypatch, capsys
):
    (trace_dir / "7-bad-line.jsonl").write_text(json.dumps(stages("e")[0].model_dump()) + "\n{not json\n")
    work = tmp_path_factory.mktemp("work")
    (work / "params.yaml").write_text(f"collect:\n  source: {trace_dir}\n")
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "argv", ["collect", "--out", "out.jsonl", "--report", "report.json"])
    collect_stage.main()
    report = json.loads((work / "report.json").read_text())
    assert (report["stages"], report["labelled"], report["malformed"], report["unreadable_files"]) == (10, 10, 1, 4)
    assert report["errors"][0].startswith(f"{trace_dir / '3-random.parquet'}: not a readable Parquet file")
    assert report["errors"][-1].startswith(f"{trace_dir / '7-bad-line.jsonl'}:2: not valid JSON")
    out = capsys.readouterr().out
    assert "1 malformed lines, 4 unreadable files" in out and "4-truncated.parquet: not a readable Parquet" in out
    assert len((work / "out.jsonl").read_text().splitlines()) == 10


def test_a_stage_refused_then_completed_in_a_later_file_is_collected_once_as_completed(tmp_path, monkeypatch):
    done = stages("w", 2)
    refused = {
        **done[1].model_dump(exclude_none=True, exclude={"output_tokens", "is_tool_call"}),
        "outcome": "refused",
        "error": "no healthy vLLM node",
    }
    (tmp_path / "1.jsonl").write_text(json.dumps(done[0].model_dump()) + "\n" + json.dumps(refused) + "\n")
    write_jsonl([done[1], done[0]], tmp_path / "2.jsonl")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(f"collect:\n  source: {tmp_path}\n")
    monkeypatch.setattr(sys, "argv", ["collect", "--out", "out.jsonl", "--report", "report.json"])
    collect_stage.main()
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["stages"], report["labelled"], report["superseded"], report["malformed"]) == (2, 2, 1, 1)
    assert report["errors"] == [
        f"{tmp_path / '2.jsonl'}:-1: duplicate stage_id '0' in workflow 'w': a second "
        "completed line (the first is kept); the first is in an earlier file"
    ]
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(s["stage_id"], s["output_tokens"]) for s in out] == [("0", 0), ("1", 1)]
