"""The session-affinity benchmark's reading of a run (benchmarks/gateway/affinity_report.py) and its arguments
(benchmarks/gateway/affinity.py); no engine is started."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.gateway import affinity, affinity_report

METRICS = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 5000.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 3200.0
vllm:num_preemptions_total{engine="0",model_name="tiny"} 2.0
"""


def stage(workflow: str, arrival_s: float, node: str, outcome: str = "completed", **kw) -> dict:
    return {"workflow_id": workflow, "arrival_s": arrival_s, "node": node, "outcome": outcome, "queue_s": 0.0, **kw}


def test_prefix_counters_read_vllms_metrics_text_and_sum_the_engines_growth():
    assert affinity_report.prefix_counters(METRICS) == {
        "prefix_cache_queries_total": 5000.0,
        "prefix_cache_hits_total": 3200.0,
        "num_preemptions_total": 2.0,
    }
    assert affinity_report.prefix_counters("")["prefix_cache_hits_total"] == 0.0
    before = [{"a": 1.0, "b": 0.0}, {"a": 10.0, "b": 5.0}]
    after = [{"a": 4.0, "b": 1.0}, {"a": 12.0, "b": 5.0}]
    assert affinity_report.counters_delta(before, after) == {"a": 5.0, "b": 1.0}
    with pytest.raises(ValueError, match="one dict per engine"):
        affinity_report.counters_delta(before, after[:1])


def test_a_stage_is_away_from_home_when_its_sessions_previous_stage_ran_on_another_node():
    traces = [
        stage("w1", 3.0, "node1"),  # out of order: sorted by arrival
        stage("w1", 1.0, "node0"),
        stage("w1", 2.0, "node0"),
        stage("w2", 1.5, "node1"),
        stage("w2", 2.5, "node0"),
        stage("w3", 1.0, "node0"),
        stage("w3", 2.0, "", outcome="failed"),  # not placed: not counted
    ]
    assert affinity_report.placements(traces) == {
        "away_from_home": 2,  # w1's third, w2's second
        "num_with_home": 3,
        "stages_by_node": {"node0": 4, "node1": 2},
    }


def test_summary_reports_the_hit_share_the_tokens_vllm_computed_and_the_gateways_times(tmp_path):
    traces = [
        stage("w1", float(i), f"node{i % 2}", ttft_s=0.1 * (i + 1), e2e_s=0.2 * (i + 1), upstream_s=0.1 * (i % 2 + 1))
        for i in range(4)
    ]
    (tmp_path / "gateway-0.jsonl").write_text("\n".join(json.dumps(t) for t in traces))
    counters = {"prefix_cache_queries_total": 1000.0, "prefix_cache_hits_total": 750.0, "num_preemptions_total": 0.0}
    out = affinity_report.summarize("merged", 0, affinity_report.read_traces(tmp_path), counters, 12.5, 20.0, 300)
    assert out["num_stages"] == 4 and out["away_from_home"] == 3 and out["num_with_home"] == 3
    assert out["prefix_hit_share"] == 0.75 and out["tokens_reprefilled"] == 250
    assert out["ttft_s"]["p50"] == pytest.approx(0.25) and out["e2e_s"]["mean"] == pytest.approx(0.5)
    assert out["by_node"]["node1"] == {"queue_s_mean": 0.0, "upstream_s_mean": 0.2}
    assert (out["wall_s"], out["engine_cpu_s"], out["engine_steps"]) == (12.5, 20.0, 300)
    table = affinity_report.markdown_table([out]).splitlines()
    assert table[0].startswith("| arm | run | num_stages | away_from_home") and table[2].startswith(
        "| merged | 0 | 4 | 3 |"
    )
    twice = affinity_report.arm_means([out, {**out, "run": 1, "away_from_home": 1, "prefix_hit_share": None}])
    assert twice == [{**affinity_report.table_row(out), "run": "mean of 2", "away_from_home": 2.0}]
    assert table[-1].startswith("| merged | mean of 1 | 4.0 | 3.0 |")
    empty = affinity_report.summarize("previous", 1, [], {}, 1.0, 0.0, 0)
    assert empty["prefix_hit_share"] is None and empty["ttft_s"] == {}


def test_engine_steps_count_the_stats_plugins_busy_steps_inside_the_window(tmp_path):
    records = [
        {"kind": "step", "t": 1.0, "running": 1, "waiting": 0},
        {"kind": "step", "t": 2.0, "running": 0, "waiting": 0},  # idle
        {"kind": "step", "t": 3.0, "running": 0, "waiting": 2},
        {"kind": "request", "t": 3.0},
        {"kind": "step", "t": 9.0, "running": 1, "waiting": 0},  # after the window
    ]
    (tmp_path / "vllm-20261205T000000-1-e0.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    assert affinity_report.engine_steps(tmp_path, 0.5, 5.0) == 2


def test_the_sessions_calls_grow_their_context_and_the_arguments_are_checked(tmp_path):
    args = affinity.parse_args(["--arms", "merged", "--stages", "4", "--context-chars", "500"])
    plan = affinity.session_plan("00m0", 3, args, np.random.default_rng(0))
    assert plan["workflow_id"] == "aff-00m0-3" and len(plan["tool_waits_s"]) == 3
    assert all(0.2 <= w <= 0.8 for w in plan["tool_waits_s"])
    assert plan["messages"][0]["content"].startswith("Run 00m0, conversation 3.")
    with pytest.raises(SystemExit):
        affinity.parse_args(["--arms", "merged,newest"])
    with pytest.raises(SystemExit):
        affinity.parse_args(["--arms", "previous", "--old-repo", str(tmp_path)])
    with pytest.raises(SystemExit):
        affinity.parse_args(["--arms", "merged", "--bind-cores", "0-1"])  # one engine's cores only
