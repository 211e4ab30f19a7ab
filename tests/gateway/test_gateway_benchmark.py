"""The pressure benchmark's comparison of gateway halves with the direct halves around them (benchmarks/gateway.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("gateway_benchmark", Path(__file__).parents[2] / "benchmarks" / "gateway.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def half(mode: str, preemptions: int, wall_s: float, e2e_mean_s: float, step_ms: float | None = 2.5) -> dict:
    return {"mode": mode, "preemptions": preemptions, "wall_s": wall_s, "workflow_e2e_s": {"mean": e2e_mean_s},
            "decode_step_ms": step_ms, "running_while_busy": 2.0}


def test_a_gateway_half_is_compared_with_the_mean_of_the_directs_around_it():
    out = bench.compare_to_directs([half("direct", 40, 30.0, 24.0), half("gateway", 5, 35.0, 23.0),
                                    half("direct", 36, 26.0, 20.0, None)])
    assert out["direct_mean"] == {"num_halves": 2, "preemptions": 38.0, "wall_s": 28.0, "workflow_e2e_mean_s": 22.0,
                                  "decode_step_ms": 2.5, "running_while_busy": 2.0}
    g = out["half1_gateway"]
    assert g["workflow_e2e_vs_direct"] == pytest.approx(23 / 22 - 1, abs=1e-4) and g["preemption_ratio_direct_over_gateway"] == 7.6
    assert g["both_met"] is False  # 7.6× fewer but slower than the mean of the two directs (faster than the first alone)


def test_both_met_needs_five_times_fewer_preemptions_and_no_slower_workflows():
    out = bench.compare_to_directs([half("direct", 40, 30.0, 24.0), half("gateway", 8, 30.0, 23.0),
                                    half("gateway2", 2, 30.0, 23.9), half("gateway", 0, 30.0, 24.1)])
    assert out["half1_gateway"]["both_met"] is True  # exactly 5×
    assert out["half2_gateway2"]["both_met"] is True
    assert out["half3_gateway"]["both_met"] is False and out["half3_gateway"]["preemption_ratio_direct_over_gateway"] == 40


def test_an_option_given_once_serves_both_gateways_or_one_value_each():
    assert [bench.per_mode("-10", m) for m in ("gateway", "gateway2")] == ["-10", "-10"]
    assert [bench.per_mode("-10,0", m) for m in ("gateway", "gateway2")] == ["-10", "0"]
