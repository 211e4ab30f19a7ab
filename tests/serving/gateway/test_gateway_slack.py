"""Maestro live: a workflow's SLO from its calls or the config, its deadline on the stage, and the batch-cost gate on a
node's measured pace."""

import asyncio
import time

import pytest

from maestro.prediction import OutputSize
from serving.core.admission.batch_cost import BatchCostGate
from serving.core.request import StageRequest
from serving.core.scheduler import create_scheduler
from serving.gateway import batch_gate
from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway
from serving.gateway.jobs import Dispatcher, Job
from serving.gateway.metadata import StageMeta, parse_metadata
from serving.gateway.validation import BadRequest, check_headers

from .test_gateway_units import make_node


def test_the_slo_comes_from_a_header_or_the_body_and_bad_values_name_the_header():
    assert parse_metadata({"x-maestro-slo-s": "90"}, {}).slo_s == 90.0
    assert parse_metadata({}, {"metadata": {"workflow_id": "w", "slo_s": 12.5}}).slo_s == 12.5
    assert parse_metadata({}, {}).slo_s is None
    for bad in ("soon", "-3", "0", "inf"):
        with pytest.raises(BadRequest, match="X-Maestro-Slo-S: expected a positive number of seconds"):
            check_headers({"x-maestro-slo-s": bad})


def test_a_stage_deadline_is_its_workflows_first_call_plus_the_slo():
    gateway = Gateway(GatewayConfig(nodes=[{"name": "a", "url": "http://a"}], system={"slo_s": 300}))
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 20}

    async def prepare():
        first = await gateway.prepare(StageMeta("w", "s1"), body)
        second = await gateway.prepare(StageMeta("w", "s2", slo_s=60), body)
        return first, second

    first, second = asyncio.run(prepare())
    start = gateway.workflows["w"].start_s
    assert first.request.deadline_s == pytest.approx(start + 300)  # the config's default
    assert second.request.deadline_s == pytest.approx(start + 60)  # the call's own, from the same first call
    no_slo = Gateway(GatewayConfig(nodes=[{"name": "a", "url": "http://a"}]))
    assert asyncio.run(no_slo.prepare(StageMeta("v", "s1"), body)).request.deadline_s == float("inf")
    with pytest.raises(ValueError, match="slo_s"):
        GatewayConfig(nodes=[{"name": "a", "url": "http://a"}], system={"slo_s": -1})


def running_node(deadline_s: float, tokens_pred: int = 200):
    """A node measured at 20 tokens/s per call (the fastest call 50/s: congested), one stage dispatched 1 s ago."""
    node = make_node("a", blocks=64)
    node.pace.mean_pace, node.pace.recent_paces, node.pace.first_token_delay_s = 20.0, [20.0, 50.0], 0.5
    now = time.monotonic()
    node.running_requests[
        StageRequest(
            "w", "s", size=OutputSize(tokens_pred=tokens_pred, tokens_reserve=tokens_pred), deadline_s=now + deadline_s
        )
    ] = now - 1.0
    return node, now


def test_the_gate_holds_a_stage_back_that_would_push_a_running_one_past_its_deadline():
    gate, candidate = (
        BatchCostGate(),
        StageRequest("v", "s", size=OutputSize(tokens_pred=50, tokens_reserve=0), deadline_s=time.monotonic() + 600),
    )
    # 190 tokens left at 20/s: 9.5 s; a deadline 9.8 s away leaves 0.3 s, less than the 0.5 s the new prefill stalls
    node, now = running_node(deadline_s=9.8)
    assert batch_gate.refusal(gate, node, candidate, now) == "slack"
    node, now = running_node(deadline_s=30)  # plenty of slack
    assert batch_gate.refusal(gate, node, candidate, now) is None
    node, now = running_node(deadline_s=float("inf"))  # no SLO: never endangered
    assert batch_gate.refusal(gate, node, candidate, now) is None
    node.pace.recent_paces.clear()  # nothing measured yet: no evidence to hold anything back on
    assert batch_gate.refusal(gate, node, candidate, now) is None


def test_the_dispatcher_keeps_a_stage_waiting_behind_the_gate_and_starts_it_when_the_running_one_ends():
    node, _ = running_node(deadline_s=9.8)
    dispatcher = Dispatcher(
        create_scheduler("least-slack"), [node], max_queued=8, recheck_s=0, batch_cost=BatchCostGate()
    )
    loop = asyncio.new_event_loop()
    request = StageRequest(
        "v",
        "s",
        size=OutputSize(tokens_pred=50, tokens_reserve=50),
        prompt_tokens=16,
        deadline_s=time.monotonic() + 600,
    )
    job = Job(StageMeta("v", "s"), request, reserve_tokens=66)
    job.future, request.payload = loop.create_future(), job
    dispatcher.submit(job)
    assert not job.future.done() and node.num_refused  # held back by the gate, not by KV
    node.running_requests.clear()  # the running stage ended
    dispatcher.pump()
    assert job.future.done() and job.node is node and request in node.running_requests
    dispatcher.finish(job)
    assert request not in node.running_requests
    loop.close()


def test_the_gate_never_holds_an_interactive_stage_back():
    node, now = running_node(deadline_s=9.8)  # a running stage 0.3 s from missing: a batch stage is held (above)
    size = OutputSize(tokens_pred=50, tokens_reserve=0)
    turn = StageRequest("v", "s", size=size, deadline_s=now + 600, interactive=True)
    assert batch_gate.refusal(BatchCostGate(), node, turn, now) is None
