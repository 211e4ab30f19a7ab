"""The step profile's CSV, the step fit and what a step carried (no engine)."""

from __future__ import annotations

from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.engine.step_fit import (
    CSV_COLUMNS,
    LinearStepModel,
    aggregate,
    fit,
    held_out,
    median_abs_pct_err,
    read_csv,
    write_csv,
)
from benchmarks.engine.step_load import ScheduledStep, scheduled_step
from serving.sim.costmodel import StepLoad

TRUE = LinearStepModel(overhead_s=2e-3, decode_s=6e-5, prefill_token_s=2e-5, context_token_s=1.5e-7, pair_token_s=3e-8)
DEVICE = {"gpu": "cpu-1-thread", "hbm_bytes_per_s": 2e10, "peak_flops": 1.5e11, "model": "tiny"}
DEVICE |= dict(tensor_parallel_size=1, num_layers=2, hidden_size=256, num_q_heads=4, num_kv_heads=2, head_dim=64)
DEVICE |= dict(ffn_dim=512, vocab_size=2048, weight_bytes_per_param=2.0)


def synthetic_steps() -> list[ScheduledStep]:
    """Step contents of every family: decodes at several contexts, lone and mixed prefills, cached prefixes."""
    steps = []
    for decodes in (0, 1, 4, 16, 64):
        for context in (32, 512, 2048):
            for prefill, cached in ((0, 0), (64, 0), (512, 0), (256, 1024)):
                if (decodes or prefill) and (decodes or context == 32):
                    load = StepLoad(decodes, decodes * context, prefill, prefill * (cached + prefill / 2))
                    steps.append(ScheduledStep(load, cached, int(prefill > 0)))
    return steps


def test_the_csv_round_trips(tmp_path):
    steps = synthetic_steps()
    samples = [(step, 3 * TRUE.time_s(step.load), TRUE.time_s(step.load) * f) for step in steps for f in (0.9, 1.1)]
    rows = aggregate(DEVICE, samples)
    assert len(rows) == len(steps) and all(row["num_samples"] == 2 for row in rows)
    write_csv(tmp_path / "steps.csv", rows)
    back = read_csv(tmp_path / "steps.csv")
    assert [list(row) for row in back] == [list(CSV_COLUMNS)] * len(rows)
    for row, got in zip(rows, back):
        for column in CSV_COLUMNS:
            assert got[column] == pytest.approx(row[column]) if column not in ("gpu", "model", "family") else True
    assert {row["family"] for row in back} == {"decode", "prefill", "mixed", "cached"}
    median = [r for r in back if r["family"] == "decode"][0]
    assert median["step_p25_s"] < median["step_s"] < median["step_p75_s"]


def test_a_csv_without_a_column_is_refused_by_name(tmp_path):
    (tmp_path / "bad.csv").write_text("model,num_decodes\ntiny,1\n")
    with pytest.raises(ValueError, match="step_s"):
        read_csv(tmp_path / "bad.csv")


def test_the_fit_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    rows = aggregate(DEVICE, [(s, 0.0, TRUE.time_s(s.load) * rng.uniform(0.99, 1.01)) for s in synthetic_steps()])
    fitted = fit(rows)
    for name, value in asdict(TRUE).items():
        assert getattr(fitted, name) == pytest.approx(value, rel=0.1), name
    assert median_abs_pct_err(fitted, rows) < 1.0
    assert set(held_out(rows)) == {"decode", "prefill", "mixed", "cached"}
    assert max(held_out(rows).values()) < 2.0


def test_too_few_rows_to_fit_is_an_error():
    rows = aggregate(DEVICE, [(s, 0.0, 1e-3) for s in synthetic_steps()[:3]])
    with pytest.raises(ValueError, match="5 coefficients"):
        fit(rows)


def test_a_step_is_read_from_the_scheduled_tokens():
    """After vLLM's schedule(), a request's computed tokens include the ones just scheduled."""
    requests = {
        "decode": SimpleNamespace(num_computed_tokens=101, num_prompt_tokens=90),
        "chunk": SimpleNamespace(num_computed_tokens=300, num_prompt_tokens=400),  # 200 cached, 100 scheduled
        "new": SimpleNamespace(num_computed_tokens=50, num_prompt_tokens=50),
    }
    step = scheduled_step(requests, {"decode": 1, "chunk": 100, "new": 50})
    assert (step.load.num_decodes, step.load.decode_context_tokens) == (1, 100)
    assert step.load.prefill_tokens == 150 and step.prefill_cached_tokens == 200 and step.num_prefills == 2
    assert step.load.prefill_pair_tokens == 100 * (200 + 50) + 50 * 25
