"""Workflow triage live: a stage's remaining work from its workflow prediction, a shed workflow answered 503 with its
id and why (and so every later stage of it), the counts on /metrics, and the capacity's "work waited at this finish"
read before the freed room is handed on. (That the gateway and the simulator shed the same workflows:
tests/serving/core/test_shared_dispatch.py.)"""

from __future__ import annotations

import asyncio
import json

import pytest

from maestro.prediction import FallbackLevel, Prediction, WorkflowFallbackLevel
from serving.core.request import workflow_remaining_s
from serving.core.scheduler import create_scheduler
from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway
from serving.gateway.jobs import Dispatcher
from serving.gateway.triage import GatewayTriage
from serving.gateway.workflows import SERVICE_PACE

from .conftest import run_app
from .test_gateway_metrics import samples
from .test_gateway_units import make_job, make_node

USER = [{"role": "user", "content": "hi"}]


def stage_headers(workflow: str, stage: str, slo_s: float | None = None) -> dict:
    return {
        "X-Maestro-Workflow": workflow,
        "X-Maestro-Stage": stage,
        "X-Maestro-Role": "agent",
        **({"X-Maestro-Slo-S": str(slo_s)} if slo_s else {}),
    }


def late_workflow(tmp_path, system: dict):
    """Workflow "late" (SLO 0.5 s, on each call) sends s1; once its deadline has passed, while "busy-1" runs on the one
    node (one call at a time, each answered 0.5 s after it came) and "busy-2" waits, it sends s2 and s3; then "other"
    (no SLO) sends one stage."""

    async def post(client, workflow: str, stage: str, slo_s: float | None = None):
        return await client.post(
            "/v1/chat/completions",
            json={"messages": USER, "max_tokens": 4},
            headers=stage_headers(workflow, stage, slo_s),
        )

    async def calls(client, gateway):
        answers = [await post(client, "late", "s1", 0.5)]
        busy = [asyncio.create_task(post(client, f"busy-{i}", "s1")) for i in (1, 2)]
        while not len(gateway.dispatcher.core):  # busy-2 waits for the node: work waits for the pool
            await asyncio.sleep(0.01)
        answers += [await post(client, "late", stage, 0.5) for stage in ("s2", "s3")]
        answers += [*await asyncio.gather(*busy), await post(client, "other", "s1")]
        return answers, samples((await client.get("/metrics")).text), (await client.get("/maestro/status")).json()

    answers, values, status = asyncio.run(
        run_app(
            tmp_path,
            {"a": True},
            calls,
            node_kw={"tail_delay_s": 0.5},
            system=system,
            limits={"max_inflight_per_node": 1},
        )
    )
    lines = [json.loads(line) for path in sorted(tmp_path.glob("*.jsonl")) for line in path.read_text().splitlines()]
    return answers, values, status, {line["stage_id"] + "@" + line["workflow_id"]: line for line in lines}


def test_a_shed_workflow_is_answered_503_naming_it_and_so_are_its_later_stages(tmp_path):
    answers, values, status, lines = late_workflow(tmp_path, {"name": "maestro"})
    assert [a.status_code for a in answers] == [200, 503, 503, 200, 200, 200]
    for refused in answers[1:3]:
        error = refused.json()["error"]
        assert (error["type"], error["reason"], error["workflow_id"], error["code"]) == (
            "workflow_rejected",
            "deadline_infeasible",
            "late",
            503,
        )
        assert "cannot meet its deadline" in error["message"] and "new workflow" in error["message"]
        assert "retry-after" not in refused.headers  # retrying the same workflow does not help
    assert values[("maestro_gateway_workflows_rejected_total", ())] == 1
    assert values[("maestro_gateway_workflows_shed_total", ())] == 1
    assert values[("maestro_gateway_calls_total", (("kind", "rejected_shed"),))] == 2
    assert status["triage"]["rejected_workflows"] == 1 and status["rejected_shed"] == 2
    assert lines["s2@late"]["outcome"] == lines["s3@late"]["outcome"] == "refused"
    assert lines["s2@late"]["error"].startswith("refused: workflow 'late' was turned away")
    assert "tokens_pred" in lines["s2@late"] and "tokens_pred" not in lines["s3@late"]  # not predicted again


def test_without_triage_rejects_a_shed_workflow_is_served_behind_the_rest(tmp_path):
    answers, values, status, _ = late_workflow(tmp_path, {"name": "maestro", "triage_rejects": False})
    assert [a.status_code for a in answers] == [200] * 6
    assert values[("maestro_gateway_workflows_shed_total", ())] == 1
    assert values[("maestro_gateway_workflows_rejected_total", ())] == 0
    assert status["rejected_shed"] == 0


def test_the_slack_system_has_no_triage(tmp_path):
    answers, values, status, _ = late_workflow(tmp_path, {"name": "maestro-slack"})
    assert [a.status_code for a in answers] == [200] * 6
    assert ("maestro_gateway_workflows_rejected_total", ()) not in values and "triage" not in status


def prediction(level: WorkflowFallbackLevel) -> Prediction:
    return Prediction(
        "w",
        "s",
        0.1,
        FallbackLevel.ROLE,
        tokens_pred=50,
        tokens_reserve=80,
        wf_remaining_calls=3.0,
        wf_remaining_tokens=420.0,
        wf_fallback_level=level,
    )


def test_a_stages_remaining_work_comes_from_its_workflow_prediction_else_the_history():
    gateway = Gateway(GatewayConfig(nodes=[{"name": "a", "url": "http://a"}]))
    answer = gateway.workflow_remaining_s(prediction(WorkflowFallbackLevel.APP), 300, "live", "app", 0)
    assert answer == workflow_remaining_s(SERVICE_PACE, 300, 3.0, 420.0) == pytest.approx(420 * 0.02)
    for services in ([1.0, 2.0, 4.0], [1.0, 3.0, 5.0], [1.0, 4.0, 6.0]):  # three ended workflows of "app"
        for service_s in services:
            gateway.remaining_work.observe(f"w{services[1]}", "app", service_s)
        gateway.remaining_work.end(f"w{services[1]}")
    assert gateway.workflow_remaining_s(
        prediction(WorkflowFallbackLevel.PRIOR), 300, "live", "app", 0
    ) == pytest.approx(
        (6.0 + 8.0 + 10.0) / 3
    )  # the prior's guess is not used: what the app's workflows needed after position 0


def test_the_capacity_reads_whether_work_waited_before_the_finish_starts_it():
    node = make_node("a", blocks=16)
    dispatcher = Dispatcher(create_scheduler("triage"), [node], max_queued=8, recheck_s=0)
    loop = asyncio.new_event_loop()
    running, waiting = make_job("s1", 12 * 128, loop=loop), make_job("s2", 12 * 128, loop=loop)
    dispatcher.submit(running)
    dispatcher.submit(waiting)
    assert running.node is node and waiting.node is None
    dispatcher.finish(running)
    assert waiting.node is node and running.was_backlogged  # s2 waited when s1 ended, though it starts now
    dispatcher.finish(waiting)
    assert not waiting.was_backlogged
    triage = GatewayTriage(True, dispatcher)
    triage.served(running.request, 2.0, running.was_backlogged)
    assert triage.triage.pools[""].window_backlogged


def test_a_workflow_shed_for_another_is_counted_when_shed_and_turned_away_at_its_next_stage():
    from serving.core.request import StageRequest

    dispatcher = Dispatcher(create_scheduler("triage"), [make_node("a", blocks=16)], max_queued=8, recheck_s=0)
    clock = {"now": 0.0}
    dispatcher.clock = lambda: clock["now"]
    dispatcher.is_backlogged = lambda: True
    triage = GatewayTriage(True, dispatcher)
    triage.triage.served("m", 0.0, 0.0, backlogged=True)
    triage.triage.served("m", 10.0, 10.0, backlogged=True)  # capacity 1 unloaded second a second

    def stage(workflow: str, deadline_s: float, work_s: float) -> StageRequest:
        return StageRequest(
            workflow, f"{workflow}-s", "m", deadline_s=deadline_s, pred_service_s=1.0, workflow_remaining_s=work_s - 1
        )

    clock["now"] = 10.0
    assert not triage.turns_away(stage("long", 35.0, 18.0))
    assert not triage.turns_away(stage("short-1", 30.0, 5.0))
    assert not triage.turns_away(stage("short-2", 40.0, 10.0))  # 33 s by t=40 with 30 s: "long" is shed for it
    assert triage.num_shed_workflows == 1 and triage.num_rejected_workflows == 0
    assert triage.turns_away(stage("long", 35.0, 17.0))  # its next stage is refused
    assert triage.turns_away(stage("long", 35.0, 16.0))
    assert (triage.num_shed_workflows, triage.num_rejected_workflows) == (1, 1)


def test_the_gateway_feeds_the_history_as_the_simulator_does_service_as_attained_and_tool_wall_time_apart(tmp_path):
    # the simulator's side: tests/serving/sim/test_remaining_source.py
    from serving.gateway.metadata import StageMeta

    async def calls(client, gateway):
        for w in ("w1", "w2", "w3"):  # three workflows of app x: a call ending in a tool call, 0.2 s of tool, a call
            for stage, final, tokens in (("s1", "false", 10), ("s2", "true", 20)):
                headers = {"X-Maestro-Workflow": w, "X-Maestro-Stage": stage, "X-Maestro-App": "x"}
                headers |= {"X-Maestro-Final": final, "X-Maestro-Tool-Call": "true" if stage == "s1" else "false"}
                body = {"messages": USER, "max_tokens": tokens}
                assert (await client.post("/v1/chat/completions", json=body, headers=headers)).status_code == 200
                if stage == "s1":
                    await asyncio.sleep(0.2)
        return await gateway.prepare(StageMeta("w4", "s1", app="x"), {"messages": USER, "max_tokens": 10})

    job = asyncio.run(run_app(tmp_path, {"a": True}, calls))
    # the service after the first stage is the second call's, as attained: no tool time in it
    assert job.request.workflow_remaining_s == pytest.approx(SERVICE_PACE.service_s(0, 20))
    assert 0.1 < job.request.remaining_tool_s < 1.0  # the tool phase's wall time (0.2 s of sleep), apart


def test_the_gateway_turns_away_for_its_callers_tool_workers_while_no_stage_waits_for_a_node():
    from serving.core.request import StageRequest
    from serving.gateway.sessions import Sessions

    dispatcher = Dispatcher(create_scheduler("triage"), [make_node("a", blocks=16)], max_queued=8, recheck_s=0)
    dispatcher.clock = lambda: 0.0
    dispatcher.is_backlogged = lambda: False  # the node has room: only the tool pool can shed
    sessions = Sessions(tool_workers=1)
    triage = GatewayTriage(True, dispatcher, sessions.tool_pool)

    def stage(workflow: str, tool_s: float) -> StageRequest:
        return StageRequest(
            workflow, f"{workflow}-s", "m", deadline_s=20.0, pred_service_s=1.0, remaining_tool_work_s=tool_s
        )

    assert not triage.turns_away(stage("a", 12.0)) and not triage.turns_away(stage("b", 12.0))  # no call waits yet
    for key in ("a", "b"):
        sessions.arrive(key, 0.0)
        sessions.sessions[key].tool_since_s = 0.0  # both in a tool call, one worker
    # 36 s of tool work by 19 s on one worker: of equal work the latest deadline goes first (b: the stable sort puts it
    # after a), then c; c is turned away now, b at its next stage
    assert triage.turns_away(stage("c", 12.0))
    assert triage.num_shed_workflows == 2 and triage.num_rejected_workflows == 1 and not triage.has_rejected("a")
