import json

import pandas as pd

from maestro.contract import StageTrace, derive_structure, prompt_text, read_traces, task_id, write_jsonl

GOOD = {
    "workflow_id": "w1",
    "stage_id": "0",
    "role": "planner",
    "prompt": "plan a trip",
    "output_tokens": 12,
    "is_tool_call": False,
}


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_malformed_lines_are_reported_with_line_and_field_and_the_rest_is_read(tmp_path):
    lines = [
        json.dumps(GOOD),
        "{not json",
        json.dumps({**GOOD, "stage_id": "1", "output_tokens": -3}),
        json.dumps({k: v for k, v in GOOD.items() if k != "role"} | {"stage_id": "2"}),
        "[1, 2]",
        json.dumps({**GOOD, "stage_id": "3", "parent_ids": ["0"]}),
    ]
    result = read_traces(write_lines(tmp_path / "t.jsonl", lines))
    assert [s.stage_id for s in result.stages] == ["0", "3"]
    by_line = {e.line: e.reason for e in result.errors}
    assert set(by_line) == {2, 3, 4, 5}
    assert "not valid JSON" in by_line[2]
    assert "output_tokens" in by_line[3]
    assert "'role'" in by_line[4]
    assert "JSON object" in by_line[5]
    assert f"{tmp_path / 't.jsonl'}:3:" in str(result.errors[1])
    assert "4 malformed lines" in result.report()


def test_duplicate_stage_ids_are_reported_not_silently_merged(tmp_path):
    result = read_traces(write_lines(tmp_path / "t.jsonl", [json.dumps(GOOD), json.dumps(GOOD)]))
    assert len(result.stages) == 1 and "duplicate stage_id" in result.errors[0].reason


def test_missing_structure_is_derived_and_unknown_fields_are_kept():
    stages = [
        StageTrace(**{**GOOD, "stage_id": i, "parent_ids": p, "custom": i})
        for i, p in (("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"]))
    ]
    derive_structure(stages)
    assert [s.call_index for s in stages] == [0, 1, 2, 3]
    assert [s.depth for s in stages] == [0, 1, 1, 2]
    assert [s.out_degree for s in stages] == [2, 1, 1, 0]
    assert stages[3].in_degree == 2 and stages[0].model_extra["custom"] == "a"


def test_integer_ids_and_message_prompts_are_accepted():
    stage = StageTrace(
        workflow_id=7,
        stage_id=3,
        role="r",
        parent_ids=[1, 2],
        prompt=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    )
    assert stage.stage_id == "3" and stage.parent_ids == ["1", "2"]
    assert prompt_text(stage.prompt) == "system: be brief\nuser: hi"


def test_parquet_and_jsonl_round_trip(tmp_path):
    stages = [StageTrace(**{**GOOD, "stage_id": str(i)}) for i in range(3)]
    write_jsonl(stages, tmp_path / "t.jsonl")
    pd.DataFrame([s.model_dump(exclude_none=True) for s in stages]).to_parquet(tmp_path / "t.parquet")
    for name in ("t.jsonl", "t.parquet"):
        result = read_traces(tmp_path / name)
        assert [s.stage_id for s in result.stages] == ["0", "1", "2"] and not result.errors


def test_task_id_groups_runs_of_one_task():
    make = lambda wid: StageTrace(**{**GOOD, "workflow_id": wid})
    a = make("chatdev/Gomoku_DefaultOrganization_20231228120934/Gomoku_DefaultOrganization_20231228120934.log")
    b = make("chatdev/Gomoku_DefaultOrganization_20231228121822.log")
    assert task_id(a) == task_id(b) == "chatdev/Gomoku_DefaultOrganization"
    assert task_id(make("autogen0.2/notebook/agentchat_x.ipynb#cell13")) == "autogen0.2/notebook/agentchat_x.ipynb"
    assert task_id(make("synthetic/rag_qa/000123")) == "synthetic/rag_qa/000123"
    assert task_id(StageTrace(**{**GOOD, "task_id": "T9"})) == "T9"
    runs = [
        "bench/airline/task_7_trial3",
        "bench/airline/task_7-run2",
        "bench/airline/task_7/seed1",
        "bench/airline/task_7",
    ]
    assert {task_id(make(w)) for w in runs} == {"bench/airline/task_7"}  # trials, runs and seeds of one task
    assert task_id(make("bench/rerun5/prune")) == "bench/rerun5/prune"  # a word merely ending so is kept


def test_tool_calls_and_tool_names_are_part_of_the_prompt_text():
    messages = [
        {"role": "user", "content": "Book me a flight."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "search_flight", "arguments": '{"to": "SEA"}'}}
            ],
        },
        {"role": "tool", "name": "search_flight", "tool_call_id": "c1", "content": "[]"},
        {"role": "assistant", "content": "Let me check.", "function_call": {"name": "think", "arguments": "{}"}},
    ]
    assert prompt_text(messages).splitlines() == [
        "user: Book me a flight.",
        'assistant: [tool call] search_flight({"to": "SEA"})',
        "tool (search_flight): []",
        "assistant: Let me check. [tool call] think({})",
    ]
    malformed = [{"role": "assistant", "content": None, "tool_calls": [{"function": "search"}, "x"]}]
    assert prompt_text(malformed) == "assistant: [tool call] ()"  # read, not a crash


def test_a_completed_retry_supersedes_the_refused_line_of_the_same_stage(tmp_path):
    refused = {k: v for k, v in GOOD.items() if k not in ("output_tokens", "is_tool_call")}
    refused.update(outcome="refused", error="queue full")
    lines = [
        json.dumps(refused),
        json.dumps({**GOOD, "stage_id": "1"}),
        json.dumps({**GOOD, "outcome": "completed"}),
        json.dumps(refused),
    ]
    result = read_traces(write_lines(tmp_path / "t.jsonl", lines))
    assert [(s.stage_id, s.output_tokens) for s in result.stages] == [("0", 12), ("1", 12)]
    assert result.stages[0].call_index == 0 and not result.errors and result.num_superseded == 2
    assert "2 superseded by a completed line" in result.report()
