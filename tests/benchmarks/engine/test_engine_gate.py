"""The gateway's batch-cost gate in the engine replay (`gateway+gate+ARM`, benchmarks/engine/gateway_arm.py), and the
measures that read a gateway arm's outcome (benchmarks/engine/report.py, measures.py).

The gate's wiring is checked on the arm itself, driven as the replay loop drives it (no engine: the steps' prices are
given): a stage of a batch workflow that would push a running stage past its deadline on a congested node waits in the
gateway, an interactive one never does, and the held one goes once the running stage has ended. On a real vLLM-CPU
engine (sixty tau2-retail workflows at 400 per 1,000 steps on the referee's default engine, fitted clock) the gated arm
holds stages, none interactive (the workload has none), and every held stage of a workflow not turned away runs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.engine.arms import engine_arm
from benchmarks.engine.gateway_arm import GatewayArm
from benchmarks.engine.report import run_figures
from benchmarks.referee.engine import pairs, summarize_rate
from serving.sim.costmodel import StepLoad

PREFILL, DECODE = StepLoad(4, 400, 256, 0.0, 1), StepLoad(4, 400)


def price(load: StepLoad) -> float:
    """A step with a prefill chunk costs three decode steps: the node's pace is stretched 3× (congested)."""
    return 3.0 if load.prefill_tokens else 1.0


def test_the_gated_arms_parse_and_pair_with_the_ungated_one():
    arm = engine_arm("gateway+gate+vllm-priority-deadline")
    assert arm.is_gateway and arm.is_gated and arm.priority is None and arm.source == "model"
    assert not engine_arm("gateway+vllm-priority-deadline").is_gated
    assert engine_arm("gateway+gate+maestro[prior]").is_gated
    with pytest.raises(ValueError, match="unknown engine arm"):
        engine_arm("gateway+gate+vllm-fcfs")
    names = ["vllm-fcfs", "gateway+vllm-priority-deadline", "gateway+gate+vllm-priority-deadline"]
    assert ("gateway+gate+vllm-priority-deadline", "gateway+vllm-priority-deadline") in pairs(names)
    assert ("gateway+gate+vllm-priority-deadline", "vllm-fcfs") in pairs(names)


def ready(arm: GatewayArm, name: str, step: float, slo_steps: int, tokens: int, interactive: bool = False):
    workflow = {"id": name, "arrival_step": step, "slo_steps": slo_steps, "interactive": interactive}
    told = {"tokens_pred": tokens, "tokens_reserve": tokens, "workflow_remaining_s": 0.0}
    spec = {"id": "0", "gateway": told, "prompt_tokens": 16, "max_tokens": 64}
    request = arm.request(workflow, spec, [], step, 0.0)
    assert not arm.turns_away(request, step)
    return request


def send(arm: GatewayArm, request, step: float) -> list:
    """The replay's path for a ready stage: queued (with the gate), then what `releases` lets go now, sent."""
    sent = [request] if arm.passes(request, request, step) else arm.releases(step)
    for stage in sent:
        arm.sent(stage, step)
    return sent


def test_the_gate_holds_a_batch_stage_that_would_push_a_running_one_past_its_deadline_never_an_interactive_one():
    arm = GatewayArm(0.2, SimpleNamespace(waiting=[]), batch_cost=True)
    warm = ready(arm, "warm", 0.0, 1000, 20)
    assert send(arm, warm, 0.0) == [warm]  # nothing runs: the gate admits
    arm.after_step([SimpleNamespace(triaged=warm, num_output_tokens=1)], price, PREFILL, 4.0)  # first token at 4
    for step in range(5, 40):
        arm.after_step([], price, PREFILL if step % 2 else DECODE, float(step))
    arm.served(warm, 16, 20, 40.0)  # the node's first-token delay is measured: 4 steps
    running = ready(arm, "running", 40.0, 45, 20)  # 20 tokens at the measured pace 2 leave 1 step of slack
    assert send(arm, running, 40.0) == [running]
    batch = ready(arm, "batch", 41.0, 1000, 10)
    assert send(arm, batch, 41.0) == [] and arm.is_backlogged()  # held: its prefill stalls the running one past
    person = ready(arm, "person", 41.0, 1000, 10, interactive=True)
    assert send(arm, person, 41.0) == [person]  # an interactive stage goes past the held one
    assert arm.releases(42.0) == []
    arm.served(running, 16, 20, 80.0)
    arm.served(person, 16, 10, 80.0)
    assert arm.releases(80.0) == [batch]  # nothing left to endanger: the held stage goes
    gate = arm.snapshot()["batch_cost"]
    assert gate["num_refused"] >= 2 and gate["num_held"] == 1 and gate["num_queued"] == 0
    assert gate["held"] == [{"workflow": "batch", "interactive": False, "waited": 39.0}]


def test_without_the_gate_every_stage_goes_at_once():
    arm = GatewayArm(0.2, SimpleNamespace(waiting=[]))
    assert arm.passes(ready(arm, "a", 0.0, 10, 20), None, 0.0) and arm.releases(0.0) == []
    assert arm.snapshot()["batch_cost"] is None


def hand_plan(finish: list[float], rejected: list[bool]) -> tuple[dict, dict]:
    """One single-stage workflow per entry, arriving at step 10·w with a 20-step SLO; -1: unfinished."""
    workflows = [
        {
            "arrival_step": 10 * w,
            "slo_steps": 20,
            "cluster": w,
            "stages": [{"session_parent": -1, "prompt_tokens": 8, "output_tokens": 4}],
        }
        for w in range(len(finish))
    ]
    plan = {"workflows": workflows, "measured": [0, len(finish)], "window": [0, 100], "engine": {"block_size": 16}}
    records = [
        [{"finish_step": f, "num_preemptions": 0, "cached_tokens": 0, "window_tokens": 10 * (w + 1), "is_rejected": r}]
        for w, (f, r) in enumerate(zip(finish, rejected))
    ]
    return plan, {"stages": records, "wall_s": 1.0, "num_engine_steps": 100, "recomputed_tokens": 0, "decisions": None}


def test_served_p95_share_turned_away_and_goodput():
    # in time (took 11), late (took 41), turned away, in time (took 6), still running at the end within its deadline
    plan, steps = hand_plan([10.0, 50.0, -1, 35.0, -1], [False, False, True, False, False])
    steps["stages"][4][0]["window_tokens"] = 50
    plan["workflows"][4]["arrival_step"] = 45  # deadline 65, after the run's end (step 50)
    figures = run_figures(plan, steps)
    assert figures["rejected"].tolist() == [0, 0, 1, 0, 0]
    assert figures["window_good_tokens"].tolist() == [10, 0, 0, 40, 50]
    results, _ = summarize_rate({"a": [figures]}, ["a"], 0.2)
    a = results["a"]
    assert a["workflow_p95_steps"]["mean"] is None  # unfinished ones count as +inf
    assert a["served_workflow_p95_steps"]["mean"] == 41.0  # the p95 of the finished: 11, 41, 6
    assert a["share_turned_away"]["mean"] == pytest.approx(0.2)
    assert a["goodput_tokens_per_step"]["mean"] == pytest.approx(100 / 100)
    assert a["tokens_per_step"]["mean"] == pytest.approx(sum(10 * (w + 1) for w in range(4)) / 100 + 0.5)
    assert np.isfinite(a["slo_attainment"]["mean"])


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_on_a_real_engine_the_gate_holds_batch_stages_and_releases_them(tmp_path):
    from tests.benchmarks.engine.test_engine_gateway import OVERLOAD, all_measured, plan
    from tests.benchmarks.engine.test_engine_leaks import probe

    config = dataclasses.replace(
        OVERLOAD, clock="fitted", step_s=0.2, kv_tokens=800, max_num_batched_tokens=256, max_model_len=768
    )
    gated = all_measured(plan(config, "gateway+gate+vllm-priority-deadline", GATED_RATE, GATED_COUNT, tmp_path))
    out = probe(gated, Path(tmp_path) / "run")
    gate = out["gateway"]["batch_cost"]
    assert gate["num_held"] > 0 and gate["num_queued"] == 0
    assert not any(h["interactive"] for h in gate["held"])
    held = {h["workflow"] for h in gate["held"]}
    turned_away = set(out["gateway"]["rejected"])
    for workflow, records in zip(gated["workflows"], out["stages"]):
        if workflow["id"] in held and workflow["id"] not in turned_away:
            assert all(r["finish_step"] >= 0 for r in records), "a held stage runs once the gate lets it go"


GATED_RATE, GATED_COUNT = 400.0, 60  # heavy enough that the fitted clock congests the engine (held: 25 stages)
