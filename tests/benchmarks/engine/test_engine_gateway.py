"""The gateway's arms of the engine replay (`gateway+ARM`, benchmarks/engine/gateway_arm.py) on a real vLLM-CPU engine.

Overload: ten tau2-retail workflows arriving within ten steps on the leak test's small engine (a 32-token prefill chunk,
a 49-block pool): the gateway turns some away, they miss their SLO and never reach vLLM past the stage it refused, and
every stage it sends carries `deadline_priority` of its deadline. Light load: six workflows far apart on a 512-token
chunk: nothing waits, nothing is turned away. The gateway reads nothing of a stage but what the plan tells it (the
source's answer at readiness, the stage's prompt and cap, the workflow's arrival, SLO and class); a planted read of the
recorded length is caught; the tool steps a stage is told are learnt from the run's ended workflows, as the gateway
learns them (benchmarks/engine/tool_ahead.py). The source is the oracle (no trained model in the tests): the arm's
source, not its logic.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from benchmarks.engine.arms import engine_arm
from benchmarks.engine.config import EngineConfig
from benchmarks.engine.replay import EngineWorkload
from benchmarks.engine.report import run_figures
from benchmarks.referee.engine import ensure_llm, pairs
from driver.testbed.engines import has_vllm
from maestro.contract import read_traces
from serving.core.scheduler.remaining import RemainingWork
from serving.gateway.vllm_priority import BATCH_PRIORITY, deadline_priority
from tests.benchmarks.engine.test_engine_leaks import check_final, check_max_tokens, check_reads, probe

DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
TRAIN, TEST = DATA / "dev-traces" / "dev_traces.jsonl", DATA / "agent-traces" / "tau2_retail.jsonl"
OVERLOAD = EngineConfig(1600, 0.05, 1.0, 32, 32, 1536, "triage")
LIGHT = dataclasses.replace(OVERLOAD, max_num_batched_tokens=512)
# what the gateway may read of a stage's plan entry and of its workflow's as it triages the stage
TOLD = {"spec.gateway", "spec.id", "spec.prompt_tokens", "spec.max_tokens"}
TOLD |= {"workflow.id", "workflow.arrival_step", "workflow.slo_steps", "workflow.interactive"}


def test_the_gateway_arms_parse():
    arm = engine_arm("gateway+vllm-priority-deadline")
    assert (arm.scheduler, arm.policy, arm.source, arm.priority, arm.is_gateway) == (
        "vllm",
        "priority",
        "model",
        None,
        True,
    )
    arm = engine_arm("gateway+maestro[prior/preempt]")
    assert (arm.scheduler, arm.source, arm.variant, arm.is_gateway) == ("maestro", "prior", "preempt", True)
    assert not engine_arm("maestro[prior]").is_gateway
    for bad in ("gateway+vllm-fcfs", "gateway+maestro[bogus]", "gateway+"):
        with pytest.raises(ValueError, match="unknown engine arm"):
            engine_arm(bad)


def test_pairs_set_the_gateway_against_every_stock_arm_and_its_engine_side():
    names = ["vllm-fcfs", "vllm-priority", "vllm-priority-deadline", "maestro[model]", "gateway+maestro[model]"]
    names.append("gateway+vllm-priority-deadline")
    found = set(pairs(names))
    for gateway in ("gateway+maestro[model]", "gateway+vllm-priority-deadline"):
        assert {(gateway, b) for b in names[:3]} <= found
    assert ("gateway+maestro[model]", "maestro[model]") in found


def plan(config: EngineConfig, arm_name: str, rate: float, count: int, tmp_path: Path) -> dict:
    if not has_vllm():
        pytest.skip(".venv-vllm is missing: run scripts/setup-vllm.sh to enable the vLLM tests")
    if not TRAIN.exists() or not TEST.exists():
        pytest.skip(f"{TRAIN} or {TEST} is missing (../shared/data)")
    workload = EngineWorkload(read_traces(TRAIN).stages, read_traces(TEST).stages, None, config)
    arm = dataclasses.replace(engine_arm(arm_name), source="oracle")
    llm = str(ensure_llm(tmp_path / "tiny", config.max_model_len))
    return workload.plans([arm], rate, 0, count, llm)[arm.name]


def all_measured(plan: dict) -> dict:
    return {**plan, "measured": [0, len(plan["workflows"])]}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("arm", ["gateway+vllm-priority-deadline", "gateway+maestro[none]"])
def test_under_overload_the_gateway_turns_away_and_sends_the_deadline(arm, tmp_path):
    overloaded = all_measured(plan(OVERLOAD, arm, 1000.0, 10, tmp_path))
    out = probe(overloaded, tmp_path / "run")
    gateway, log = out["gateway"], out["log"]
    turned_away = set(gateway["rejected"])
    assert turned_away and gateway["num_rejected"] == len(turned_away)
    figures = run_figures(overloaded, out)
    assert figures["counters"]["num_rejected"] == len(turned_away)
    for workflow, records, met in zip(overloaded["workflows"], out["stages"], figures["met"]):
        rejected = [r["is_rejected"] for r in records]
        assert any(rejected) == (workflow["id"] in turned_away)
        assert not (any(rejected) and met), "a turned-away workflow counts as missed"
        assert all(r["finish_step"] < 0 for r, is_rejected in zip(records, rejected) if is_rejected)
    # every stage sent carries the deadline as the gateway encodes it
    step_s = overloaded["arm"]["gateway"]["step_s"]
    for w, i, priority in log["priorities"]:
        workflow, told = overloaded["workflows"][w], overloaded["workflows"][w]["stages"][i]["gateway"]
        deadline_s = (workflow["arrival_step"] + workflow["slo_steps"]) * step_s
        rank = min(9999, told["tokens_pred"])
        assert priority == deadline_priority(workflow["interactive"], deadline_s, 0.0, rank)
        assert (priority >= BATCH_PRIORITY) == (not workflow["interactive"])
    # the gateway reads what the plan tells it, nothing of later stages or recorded lengths
    assert set(log["gateway_reads"]) <= TOLD and "spec.gateway" in log["gateway_reads"]
    if arm.startswith("gateway+maestro"):  # the plugin behind the gateway reads nothing early either
        check_final(overloaded, out)
        check_reads(out)
    check_max_tokens(out)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_leak_check_catches_a_gateway_reading_the_recorded_length(tmp_path):
    planted = plan(OVERLOAD, "gateway+vllm-priority-deadline", 1000.0, 4, tmp_path)
    out = probe(planted, tmp_path / "run", "--plant", "gateway-reads-length")
    assert "spec.output_tokens" in set(out["log"]["gateway_reads"]) - TOLD


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_at_light_load_nothing_is_turned_away(tmp_path):
    light = all_measured(plan(LIGHT, "gateway+vllm-priority-deadline", 5.0, 6, tmp_path))
    out = probe(light, tmp_path / "run")
    assert out["gateway"]["num_rejected"] == 0 and len(out["gateway"]["triaged"]) > len(light["workflows"])
    assert not any(r["is_rejected"] for records in out["stages"] for r in records)
    assert all(r["finish_step"] >= 0 for records in out["stages"] for r in records)
    # the tool steps ahead, as the gateway predicts them: from the run's ended workflows only, once enough had ended
    ended = [max(r["finish_step"] for r in records) for records in out["stages"]]
    told = [t for t in out["gateway"]["triaged"] if t["remaining_tool_s"] > 0]
    assert told, "no stage was told the tool time its workflow waits ahead"
    assert all(sum(e <= t["step"] for e in ended) >= RemainingWork().min_count for t in told)
    by_stage = {
        (w["id"], s["id"]): r for w, rs in zip(light["workflows"], out["stages"]) for s, r in zip(w["stages"], rs)
    }
    assert all(by_stage[t["workflow"], t["stage"]]["tool_ahead_steps"] == round(t["remaining_tool_s"], 4) for t in told)
