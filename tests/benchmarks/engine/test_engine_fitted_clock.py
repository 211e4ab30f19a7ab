"""The engine replay on the fitted clock, on a real in-process vLLM-CPU engine: each engine step advances the replay's
clock by the fitted price of what it carried, so a run's clock runs ahead of its step count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.engine.config import step_price
from benchmarks.referee.engine import main
from driver.testbed.engines import VLLM_PYTHON, has_vllm
from serving.sim.costmodel import StepLoad

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
TRAIN, TEST = DATA / "dev-traces" / "dev_traces.jsonl", DATA / "agent-traces" / "tau2_retail.jsonl"


def test_a_fitted_run_prices_every_step_by_its_content(tmp_path):
    if not has_vllm():
        pytest.skip(".venv-vllm is missing: run scripts/setup-vllm.sh to enable the vLLM tests")
    if not TRAIN.exists() or not TEST.exists():
        pytest.skip(f"{TRAIN} or {TEST} is missing (../shared/data)")
    argv = ["--train", str(TRAIN), "--test", str(TEST), "--rates", "1000", "--arrival-steps", "10", "--seeds", "1"]
    argv += ["--arms", "vllm-fcfs", "--clock", "fitted", "--llm", str(tmp_path / "tiny")]
    report = main(argv + ["--vllm-python", str(VLLM_PYTHON), "--json", str(tmp_path / "fitted.json")])
    assert report["clock"] == "fitted" and report["engine"]["engine"]["clock"] == "fitted"
    run = tmp_path / "fitted" / "1000-0"
    plan = json.loads((run / "plan_vllm-fcfs.json").read_text())
    steps = json.loads((run / "steps_vllm-fcfs.json").read_text())
    clocks = [record[0] for record in steps["steps"]]  # the replay's clock after each engine step
    price = step_price(plan["clock"])
    assert plan["clock"]["kind"] == "fitted" and price(StepLoad(num_decodes=1)) == pytest.approx(1.0)
    gaps = [b - a for a, b in zip(clocks, clocks[1:])]
    assert min(gaps) >= price(StepLoad()) * 0.999  # no step is free: at least the fixed overhead
    assert sorted(gaps)[len(gaps) // 2] > 1.0  # the median step carried more than a lone decode at no context
