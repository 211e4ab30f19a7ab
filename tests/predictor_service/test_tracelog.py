"""Trace log retention: the oldest files go first, past a number of files or a total size; a file being
written stays."""

import json
import os
import subprocess

import pytest

from maestro.contract import StageTrace
from predictor_service.config import ServiceConfig
from predictor_service.tracelog import TraceLog, TraceLogConfig, read_recent


def stage(i: int) -> StageTrace:
    """A stage whose trace line is ~700 bytes: a 1024-byte file holds one."""
    return StageTrace(
        workflow_id=f"w{i}", stage_id="0", role="r", prompt="p" * 600, output_tokens=i, is_tool_call=False
    )


def trace_files(directory, prefix="predictor"):
    return sorted(directory.glob(f"{prefix}-*.jsonl"))


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_only_the_newest_max_files_are_kept(tmp_path):
    log = TraceLog(TraceLogConfig(directory=str(tmp_path), max_bytes=1024, max_files=3, max_total_bytes=0))
    for i in range(30):
        log.append([stage(i)])
    files = trace_files(tmp_path)
    assert len(files) == 3 and str(files[-1]) == log.path
    kept = [json.loads(line)["workflow_id"] for f in files for line in f.read_text().splitlines()]
    assert kept == ["w27", "w28", "w29"]


def test_total_bytes_stay_under_the_limit_each_time_a_file_is_started(tmp_path):
    config = TraceLogConfig(directory=str(tmp_path), max_bytes=1024, max_files=0, max_total_bytes=3000)
    log, totals = TraceLog(config), []
    for i in range(30):
        before = log.path
        log.append([stage(i)])
        if log.path != before:
            totals.append(sum(f.stat().st_size for f in trace_files(tmp_path)))
    assert len(totals) > 5 and max(totals) <= 3000
    assert len(trace_files(tmp_path)) < 30


def test_the_file_being_written_is_never_deleted_even_past_the_limits(tmp_path):
    log = TraceLog(TraceLogConfig(directory=str(tmp_path), max_bytes=1024, max_files=1, max_total_bytes=1024))
    log.append([stage(0)])
    first = log.path
    log.append([stage(1), stage(2), stage(3)])  # a new file, alone over max_total_bytes: kept; the first one goes
    assert log.path != first and [str(f) for f in trace_files(tmp_path)] == [log.path]
    assert len(open(log.path).readlines()) == 3
    assert log.retain() == [] and [str(f) for f in trace_files(tmp_path)] == [log.path]


def test_files_of_other_live_writers_stay_and_those_of_dead_ones_go(tmp_path):
    live = tmp_path / f"predictor-20000101T000000-000000000-{os.getppid()}.jsonl"
    dead = tmp_path / f"predictor-20000101T000000-000000001-{dead_pid()}.jsonl"
    other = tmp_path / "gateway-20000101T000000-000000000-1.jsonl"
    for path in (live, dead, other):
        path.write_text("{}\n")
    log = TraceLog(TraceLogConfig(directory=str(tmp_path), max_bytes=1024, max_files=1))
    log.append([stage(0)])
    assert trace_files(tmp_path) == sorted([live, tmp_path / os.path.basename(log.path)])
    assert other.exists() and not dead.exists()


def test_retention_is_configured_from_the_environment_and_validated():
    config = ServiceConfig.from_env(
        {"MAESTRO_TRACE_DIR": "/t", "MAESTRO_TRACE_MAX_FILES": "7", "MAESTRO_TRACE_MAX_TOTAL_BYTES": str(1 << 30)}
    )
    assert (config.trace.max_files, config.trace.max_total_bytes) == (7, 1 << 30)
    with pytest.raises(ValueError, match="MAESTRO_TRACE_MAX_FILES"):
        ServiceConfig.from_env({"MAESTRO_TRACE_MAX_FILES": "many"})
    with pytest.raises(ValueError, match="max_total_bytes .* must be ≥ max_bytes"):
        TraceLogConfig(max_bytes=1 << 20, max_total_bytes=1 << 10)
    with pytest.raises(ValueError, match="max_files"):
        TraceLogConfig(max_files=-1)


def test_recent_stages_are_read_back_newest_files_first_within_the_budget(tmp_path):
    config = TraceLogConfig(directory=str(tmp_path), max_bytes=1024, max_files=0, max_total_bytes=0)
    log = TraceLog(config)
    for i in range(5):  # one stage per file
        log.append([stage(i)])
    (tmp_path / "predictor-99999999T000000-000000000-1.jsonl").write_text("not json\n")  # newest, unreadable
    size = trace_files(tmp_path)[0].stat().st_size
    assert [s.output_tokens for s in read_recent(config, 10**6)] == [0, 1, 2, 3, 4]
    assert [s.output_tokens for s in read_recent(config, 3 * size + 20)] == [2, 3, 4]
    assert read_recent(config, 0) == []


def test_a_restarted_service_rebuilds_workflow_history_from_its_traces(model_dir, sample_records, tmp_path):
    from predictor_service.engine import PredictorEngine
    from predictor_service.schemas import ObservedStage, PredictRequest

    trace = TraceLogConfig(directory=str(tmp_path))
    workflow = [r for r in sample_records if r["workflow_id"] == sample_records[0]["workflow_id"]]
    child = {k: v for k, v in workflow[-1].items() if k not in ("output_tokens", "is_tool_call")}
    first = PredictorEngine(ServiceConfig(model=str(model_dir), trace=trace))
    first.observe([ObservedStage.model_validate(r) for r in workflow[:-1]])
    expected = first.predict(PredictRequest.model_validate({"stages": [child]}).stages)
    restarted = PredictorEngine(ServiceConfig(model=str(model_dir), trace=trace))
    assert len(restarted.history) == len(workflow) - 1
    assert restarted.predict(PredictRequest.model_validate({"stages": [child]}).stages) == expected
    empty = PredictorEngine(ServiceConfig(model=str(model_dir), trace=trace, rebuild_history_bytes=0))
    assert len(empty.history) == 0
