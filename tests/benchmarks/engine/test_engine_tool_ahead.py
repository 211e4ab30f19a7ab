"""The tool time the engine replay tells a ready stage (benchmarks/engine/tool_ahead.py): the gateway's
`RemainingWork.tool_ahead_s`, fed as the gateway feeds it, from the run's ended workflows only; and the gateway arm
(benchmarks/engine/gateway_arm.py) triages on it as the gateway does; the plans say which stages are told it (not
under the `none` source, as in the simulator) and never the number. Driven as the replay loop drives them (no
engine); tests/benchmarks/engine/test_engine_gateway.py checks it on a real vLLM-CPU engine."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.engine.arms import engine_arm
from benchmarks.engine.config import EngineConfig
from benchmarks.engine.gateway_arm import GatewayArm
from benchmarks.engine.replay import EngineWorkload
from benchmarks.engine.tool_ahead import ToolAhead
from maestro.contract import read_traces
from serving.core.scheduler.remaining import RemainingWork

CALL_STEPS = 10  # each call ends this many steps after it arrives
DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
TRAIN, TEST = DATA / "dev-traces" / "dev_traces.jsonl", DATA / "agent-traces" / "tau2_retail.jsonl"


def play(ahead: ToolAhead, workflow: str, gaps: list[float | None], start: float, app: str = "a") -> list[float]:
    """A chain workflow as the replay runs it: stage k arrives, its call ends, its tool (`gaps[k]` steps; None: no
    tool call) runs, the next stage arrives; it ends with its last call. The tool steps each stage was told."""
    step, told = start, []
    for gap in gaps:
        told.append(ahead.arrived(workflow, app, step))
        step += CALL_STEPS
        ahead.ended(workflow, app, 16, CALL_STEPS, gap is not None, step)
        step += gap or 0
    ahead.end(workflow)
    return told


def trained() -> ToolAhead:
    ahead = ToolAhead()
    for i, gaps in enumerate([[4, 6, None], [8, 2, None], [6, 4, None]]):
        assert play(ahead, f"w{i}", gaps, 100.0 * i) == [0.0, 0.0, 0.0]  # fewer than 3 ended before it
    return ahead


def test_a_stage_is_told_the_tool_steps_the_apps_ended_workflows_waited_from_its_position_on():
    assert play(trained(), "w3", [5, 5, None], 400.0) == [pytest.approx(10.0), pytest.approx(4.0), 0.0]
    assert play(trained(), "other", [5, None], 400.0, app="b") == [pytest.approx(10.0), pytest.approx(4.0)]  # all apps'


def test_nothing_of_the_workflows_own_tool_calls_or_later_stages_reaches_what_it_is_told():
    told = play(trained(), "w3", [5, 5, None], 400.0)
    assert play(trained(), "w3", [500, 1, 9], 400.0) == told
    assert play(trained(), "w3", [5], 400.0) == told[:1]


def test_the_tool_phase_is_measured_to_the_next_arrival_and_a_turned_away_workflow_is_forgotten():
    history = RemainingWork(min_count=1)
    ahead = ToolAhead(history)
    play(ahead, "w0", [3], 0.0)  # a last call ending in a tool call: no next call ends its phase (the gateway's way)
    assert ahead.arrived("w1", "a", 50.0) == 0.0
    ahead.ended("w1", "a", 16, 10, True, 60.0)
    assert ahead.arrived("w1", "a", 67.5) == 0.0  # w1 is still open: nothing of it is read
    ahead.end("w1", completed=False)  # turned away
    ahead.ended("w1", "a", 16, 10, True, 80.0)  # a call in flight when it was turned away ends after: not fed
    ahead.end("w1")
    assert ahead.arrived("w2", "a", 90.0) == 0.0
    play(ahead, "w3", [7.5, None], 100.0)
    # min_count 1: w0 (its last tool never ended: 0) and w3; w1, fed after it was turned away, would make it 2.5
    assert ahead.arrived("w4", "a", 200.0) == pytest.approx(3.75)
    assert history.tool_ahead_s("a", 1) == 0.0


def gateway_arm(backlogged: bool) -> GatewayArm:
    arm = GatewayArm(1.0, SimpleNamespace(waiting=[]))
    arm.is_engine_backlogged = backlogged
    return arm


def triage(arm: GatewayArm, remaining_tool_s: float, name: str = "w3") -> tuple[object, bool]:
    """A first stage of 8 predicted steps, 15 steps to its deadline, as the replay loop triages it."""
    workflow = {"id": name, "arrival_step": 400.0, "slo_steps": 15, "interactive": False}
    told = {"tokens_pred": 8, "tokens_reserve": 8, "workflow_remaining_s": 0.0}
    spec = {"id": "0", "gateway": told, "prompt_tokens": 16, "max_tokens": 64}
    request = arm.request(workflow, spec, [], 400.0, remaining_tool_s)
    return request, arm.turns_away(request, 400.0)


def test_the_gateway_arm_triages_on_the_tool_steps_ahead_of_a_workflow_with_tool_calls():
    tool_steps = trained().arrived("w3", "a", 400.0)
    assert tool_steps == pytest.approx(10.0)
    request, is_turned_away = triage(gateway_arm(backlogged=True), tool_steps)
    assert request.remaining_tool_s == pytest.approx(10.0) and is_turned_away  # 8 + 10 steps > 15 left
    request, is_turned_away = triage(gateway_arm(backlogged=True), 0.0)
    assert request.remaining_tool_s == 0.0 and not is_turned_away  # 8 steps alone fit
    arm = gateway_arm(backlogged=False)
    assert not triage(arm, tool_steps)[1]  # nothing waits: nobody is shed
    assert arm.log[-1]["remaining_tool_s"] == pytest.approx(10.0)


def test_the_plans_tell_the_tool_time_ahead_to_every_source_but_none_as_the_simulator_does():
    if not TRAIN.exists() or not TEST.exists():
        pytest.skip(f"{TRAIN} or {TEST} is missing (../shared/data)")
    workload = EngineWorkload(read_traces(TRAIN).stages, read_traces(TEST).stages, None, EngineConfig())
    expected = {
        "gateway+vllm-priority-deadline": {True},  # its source made the oracle: no trained model in the tests
        "maestro[oracle]": {True},
        "maestro[none]": {False},
        "gateway+maestro[none]": {False},
        "vllm-fcfs": {None},  # told nothing
    }
    arms = [engine_arm(name) for name in expected]
    arms[0] = dataclasses.replace(arms[0], source="oracle")
    plans = workload.plans(arms, 20.0, 0, 4, "")
    for name, plan in plans.items():
        stages = [s for w in plan["workflows"] for s in w["stages"]]
        assert {s.get("is_told_tool_ahead") for s in stages} == expected[name], name
        assert not any("remaining_tool_s" in (s.get("hints") or {}) for s in stages)  # learnt live, not planned
