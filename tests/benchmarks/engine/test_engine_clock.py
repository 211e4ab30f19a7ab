"""The engine replay's clock: `step` counts every step one, `fitted` prices a step by what it carried (no engine)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import pytest

from benchmarks.engine.config import MODEL, STEP_FIT, UNIT_LOAD, EngineConfig, step_price
from benchmarks.engine.step_fit import FittedStepCost, LinearStepModel
from benchmarks.engine.vs_sim import section
from benchmarks.referee.engine import parse_args
from serving.sim.costmodel import StepLoad

FIT = LinearStepModel(overhead_s=2e-3, decode_s=6e-5, prefill_token_s=2e-5, context_token_s=1.5e-7, pair_token_s=3e-8)


@pytest.fixture
def fitted(tmp_path) -> EngineConfig:
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"models": {"tiny": {"fit": asdict(FIT)}}}))
    return EngineConfig(step_s=0.2, max_num_batched_tokens=256, clock="fitted", step_fit_path=str(path))


def test_the_fitted_clock_prices_a_step_with_a_prefill_chunk_above_one_without(fitted):
    price = step_price(fitted.clock_plan()["clock"])
    decodes = StepLoad(num_decodes=4, decode_context_tokens=400)
    with_chunk = StepLoad(4, 400, prefill_tokens=128, prefill_pair_tokens=128 * 64)
    assert price(UNIT_LOAD) == pytest.approx(1.0)  # the unit: a lone decode at no context counts one step
    assert 1.0 < price(decodes) < price(with_chunk)
    assert price(with_chunk) - price(decodes) == pytest.approx((128 * 2e-5 + 128 * 64 * 3e-8) / FIT.time_s(UNIT_LOAD))


def test_the_step_clock_counts_every_step_one():
    config = EngineConfig()
    assert config.clock_plan() == {}  # step-clock plans are as they were
    price = step_price(None)
    assert price(StepLoad(64, 6400, 256, 1e5)) == price(StepLoad()) == 1.0
    assert config.maestro()["prefill_s_per_token"] == 1.0 / config.max_num_batched_tokens


def test_the_fitted_cost_model_prices_slos_on_the_same_clock(fitted):
    cost = fitted.cost()
    assert isinstance(cost, FittedStepCost)
    model = cost.model(MODEL)
    assert cost.decode_s(model, 1, 0) == pytest.approx(0.2)  # step_s seconds: one unit
    lone = cost.step_time_s({MODEL: StepLoad(prefill_tokens=256, prefill_pair_tokens=256 * 128)})
    assert cost.prefill_s(model, 256) == pytest.approx(lone)
    assert cost.prefill_s(model, 512) > 2 * lone  # the second chunk's attention reads the first
    assert fitted.maestro()["prefill_s_per_token"] == pytest.approx(lone / 256 / 0.2)


def test_a_bad_clock_or_fit_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="clock 'wall'"):
        EngineConfig(clock="wall")
    with pytest.raises(ValueError, match="step_fit_path"):
        EngineConfig(clock="fitted", step_fit_path=str(tmp_path / "none.json")).cost()


def test_the_shipped_fit_loads():
    fit = EngineConfig(clock="fitted", step_fit_path=str(STEP_FIT)).step_fit()
    assert fit.time_s(UNIT_LOAD) == pytest.approx(EngineConfig().step_s)


def test_the_referee_takes_the_clock():
    base = ["--vllm-python", sys.executable, "--arms", "vllm-fcfs"]
    assert parse_args(base).config.clock == "fitted"
    assert parse_args(base + ["--clock", "step"]).config.clock == "step"
    with pytest.raises(SystemExit):
        parse_args(base + ["--clock", "wall"])


def figures(slo: float, p95: float) -> dict:
    return {"slo_attainment": slo, "preemptions": 0, "workflow_latency_steps": {"mean": p95 / 2, "p95": p95}}


def test_engine_vs_sim_ranks_and_gaps():
    engine = {"vllm-fcfs": figures(0.80, 100), "maestro[model]": figures(0.90, 90), "maestro[none]": figures(0.85, 95)}
    close = {"vllm-fcfs": figures(0.81, 105), "maestro[model]": figures(0.89, 92), "maestro[none]": figures(0.85, 99)}
    result = section({"engine": engine, "sim": close}, "100-0", "fitted")
    assert result["rank_agree"] and result["done"]
    assert result["max_slo_gap_pp"] == pytest.approx(1.0) and result["max_p95_gap_pct"] == pytest.approx(5.0)
    assert result["arms"]["maestro[model]"]["sim"]["workflow_p95_steps"] == 92
    swapped = dict(close, **{"maestro[none]": figures(0.95, 99)})
    result = section({"engine": engine, "sim": swapped}, "100-0", "fitted")
    assert not result["rank_agree"] and not result["done"]
    assert result["discordant_pairs"] == [("maestro[model]", "maestro[none]")]
    assert result["max_slo_gap_pp"] == pytest.approx(10.0)
