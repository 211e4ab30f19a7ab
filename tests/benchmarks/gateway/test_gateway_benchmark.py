"""The pressure benchmark's comparison of gateway halves with the direct halves around them
(benchmarks/gateway/pressure.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from benchmarks.gateway import pressure as bench


def half(mode: str, preemptions: int, wall_s: float, e2e_mean_s: float, step_ms: float | None = 2.5) -> dict:
    return {
        "mode": mode,
        "preemptions": preemptions,
        "wall_s": wall_s,
        "workflow_e2e_s": {"mean": e2e_mean_s},
        "decode_step_ms": step_ms,
        "running_while_busy": 2.0,
    }


def test_a_gateway_half_is_compared_with_the_mean_of_the_directs_around_it():
    out = bench.compare_to_directs(
        [half("direct", 40, 30.0, 24.0), half("gateway", 5, 35.0, 23.0), half("direct", 36, 26.0, 20.0, None)]
    )
    assert out["direct_mean"] == {
        "num_halves": 2,
        "preemptions": 38.0,
        "wall_s": 28.0,
        "workflow_e2e_mean_s": 22.0,
        "decode_step_ms": 2.5,
        "running_while_busy": 2.0,
    }
    g = out["half1_gateway"]
    assert (
        g["workflow_e2e_vs_direct"] == pytest.approx(23 / 22 - 1, abs=1e-4)
        and g["preemption_ratio_direct_over_gateway"] == 7.6
    )
    assert (
        g["both_met"] is False
    )  # 7.6× fewer but slower than the mean of the two directs (faster than the first alone)


def test_both_met_needs_five_times_fewer_preemptions_and_no_slower_workflows():
    out = bench.compare_to_directs(
        [
            half("direct", 40, 30.0, 24.0),
            half("gateway", 8, 30.0, 23.0),
            half("gateway2", 2, 30.0, 23.9),
            half("gateway", 0, 30.0, 24.1),
        ]
    )
    assert out["half1_gateway"]["both_met"] is True  # exactly 5×
    assert out["half2_gateway2"]["both_met"] is True
    assert (
        out["half3_gateway"]["both_met"] is False and out["half3_gateway"]["preemption_ratio_direct_over_gateway"] == 40
    )


def test_an_option_given_once_serves_both_gateways_or_one_value_each():
    assert [bench.per_mode("-10", m) for m in ("gateway", "gateway2")] == ["-10", "-10"]
    assert [bench.per_mode("-10,0", m) for m in ("gateway", "gateway2")] == ["-10", "0"]


LIVE_SPEC = importlib.util.spec_from_file_location(
    "live_compare", Path(__file__).parents[3] / "benchmarks" / "gateway" / "live_compare.py"
)
live = importlib.util.module_from_spec(LIVE_SPEC)
LIVE_SPEC.loader.exec_module(live)


def test_a_workflows_unloaded_time_is_its_longest_path_of_solo_calls_and_tool_waits():
    fit = {"a_s": 0.5, "b_s_per_token": 0.01}
    stages = [
        {"stage_id": "a", "parent_ids": [], "wait_s": 0.0, "max_tokens": 100},  # 1.5
        {"stage_id": "b", "parent_ids": ["a"], "wait_s": 2.0, "max_tokens": 50},  # 1.5 + 2 + 1.0
        {"stage_id": "c", "parent_ids": ["a"], "wait_s": 0.0, "max_tokens": 200},  # 1.5 + 2.5
        {"stage_id": "d", "parent_ids": ["b", "c"], "wait_s": 0.0, "max_tokens": 0},
    ]  # max(4.5, 4.0) + 0.5
    assert live.unloaded_s(stages, fit) == pytest.approx(5.0)


def run(arm: str, slo: float, preemptions: int, reserved: float | None = None) -> dict:
    return {
        "arm": arm,
        "slo_attainment": slo,
        "workflow_s": {"mean": 10.0, "p95": 12.0},
        "vllm_queue_s_mean": 0.1,
        "vllm_blocks_used": {"mean": 30.0},
        "preemptions": preemptions,
        "stages_failed": 0,
        "stages_lost": 0,
        **(
            {
                "gateway": {"kv_reserved_vs_maxlen": reserved, "interactive_queue_s": {}},
                "predictor": {"model_share": 1.0},
            }
            if reserved is not None
            else {}
        ),
    }


def test_the_live_table_gives_each_arm_its_mean_and_spread_over_rounds():
    out = live.table(
        [run("direct", 0.5, 10), run("model", 0.75, 2, 0.4), run("model", 0.25, 4, 0.5), run("direct", 0.7, 12)]
    )
    assert list(out) == ["direct", "model"]
    assert out["model"]["slo_attainment"] == {"mean": 0.5, "min": 0.25, "max": 0.75}
    assert out["model"]["kv_reserved_vs_maxlen"] == {"mean": 0.45, "min": 0.4, "max": 0.5}
    assert out["direct"]["kv_reserved_vs_maxlen"] is None and out["direct"]["preemptions"]["mean"] == 11
