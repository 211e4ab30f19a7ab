"""The workflow cap (serving/admission/workflow_cap.py): at most W workflows in progress, oldest first; adaptive W."""
from __future__ import annotations

import asyncio
import time

import pytest

from serving.gateway.config import GatewayConfig
from serving.gateway.core import BATCH_PRIORITY, Gateway
from serving.gateway.dispatch import Dispatcher, Job
from serving.gateway.metadata import StageMeta
from serving.admission import workflow_cap as wip
from serving.admission.cap import CapSignals
from serving.admission.workflow_cap import WorkflowCap
from serving.request import StageRequest
from serving.scheduler import create_scheduler

from .test_gateway_units import make_node


def job_of(workflow: str, arrival: float, stage: str = "s", tokens: int = 128, interactive: bool = False,
           loop=None) -> Job:
    request = StageRequest(workflow, stage, interactive=interactive, workflow_arrival_s=arrival, ready_s=arrival,
                           tokens_pred=tokens, pred_service_s=tokens / 50)
    job = Job(StageMeta(workflow, stage, interactive=interactive), request, reserve_tokens=tokens)
    job.future = loop.create_future()
    request.payload = job
    return job


def capped(cap: WorkflowCap, blocks: int = 16, policy: str = "fcfs") -> tuple[Dispatcher, object]:
    node = make_node("a", blocks=blocks)
    return Dispatcher(create_scheduler(policy), [node], max_queued=64, recheck_s=0, cap=cap), node


@pytest.mark.parametrize("policy", ["fcfs", "maestro", "continuum"])
def test_only_the_oldest_w_live_workflows_are_dispatched_and_a_place_is_kept_idle_s(policy):
    loop = asyncio.new_event_loop()
    cap = WorkflowCap(2, idle_s=60.0)
    dispatcher, _ = capped(cap, policy=policy)
    a, b, c = job_of("a", 2.0, loop=loop), job_of("b", 3.0, loop=loop), job_of("c", 1.0, loop=loop)
    for job in (a, c, b):
        dispatcher.submit(job)
    assert c.future.done() and a.future.done() and not b.future.done()  # room for all three: the cap holds b
    dispatcher.finish(c)
    assert not b.future.done()  # c is between stages: its place is kept for idle_s
    c2 = job_of("c", 1.0, stage="s2", loop=loop)
    dispatcher.submit(c2)
    assert c2.future.done() and not b.future.done()
    urgent = job_of("x", 9.0, interactive=True, loop=loop)
    dispatcher.submit(urgent)
    assert urgent.future.done()  # interactive stages are never held
    cap.idle_s = 0.0
    dispatcher.finish(c2)  # c is done (or in a long tool phase): b gets its place
    assert b.future.done()


def test_an_older_workflow_back_from_a_long_pause_takes_its_place_back():
    loop = asyncio.new_event_loop()
    cap = WorkflowCap(1, idle_s=0.0)
    dispatcher, _ = capped(cap)
    old, young = job_of("old", 1.0, loop=loop), job_of("young", 2.0, loop=loop)
    dispatcher.submit(old)
    dispatcher.submit(young)
    assert old.future.done() and not young.future.done()
    dispatcher.finish(old)  # idle_s 0: "old" is no longer live, "young" goes
    assert young.future.done()
    young2, old2 = job_of("young", 2.0, "s2", loop=loop), job_of("old", 1.0, "s2", loop=loop)
    dispatcher.submit(old2)  # "young" still runs its stage, but "old" is older: it is the one eligible
    assert old2.future.done()
    dispatcher.submit(young2)
    assert not young2.future.done()
    dispatcher.finish(young)
    dispatcher.finish(old2)
    assert young2.future.done()


def test_a_cancelled_or_unplaceable_stage_gives_its_place_back():
    loop = asyncio.new_event_loop()
    cap = WorkflowCap(1, idle_s=0.0)
    dispatcher, node = capped(cap, blocks=2)
    first, second = job_of("a", 1.0, tokens=128 * 2, loop=loop), job_of("b", 2.0, loop=loop)
    dispatcher.submit(first)
    dispatcher.submit(second)
    assert first.future.done() and not second.future.done()
    node.is_healthy = False
    dispatcher.finish(first)  # the node died: "a" is done, "b" can never be placed and fails
    assert isinstance(second.future.exception(), Exception)
    assert all(s.num_active == 0 for s in cap.live.values())
    node.is_healthy = True
    cap.limit = 2
    third, fourth, fifth = (job_of(w, t, tokens=128 * 2, loop=loop) for w, t in (("c", 3.0), ("d", 4.0), ("e", 5.0)))
    for job in (third, fourth, fifth):
        dispatcher.submit(job)
    assert third.future.done() and not fourth.future.done() and not fifth.future.done()  # d waits for KV, e the cap
    fourth.future.cancel()
    dispatcher.withdraw(fourth)  # d's client left while queued: its place goes to e
    dispatcher.finish(third)
    assert fifth.future.done()


def test_adaptive_cap_grows_when_it_alone_keeps_the_node_idle_and_shrinks_on_waits_and_preemptions(monkeypatch):
    loop = asyncio.new_event_loop()
    cap = WorkflowCap(2, adaptive=True, idle_s=60.0, shrink_wait_s=1.0)
    dispatcher, node = capped(cap, blocks=16)
    jobs = [job_of(f"w{i}", float(i), tokens=128 * 2, loop=loop) for i in range(6)]
    for job in jobs:
        dispatcher.submit(job)
    assert [j.future.done() for j in jobs] == [True, True, False, False, False, False]
    dispatcher.adapt_cap(CapSignals(preemptions={"a": 0}))  # first poll: idle capacity held back once
    assert cap.limit == 2 and not jobs[2].future.done()
    dispatcher.adapt_cap(CapSignals(preemptions={"a": 0}))  # twice in a row: W + 1, and the next workflow goes at once
    assert cap.limit == 3 and jobs[2].future.done() and cap.num_grown == 1
    dispatcher.adapt_cap(CapSignals(preemptions={"a": 2}))  # vLLM preempted: W halved (not below MIN_LIMIT)
    assert cap.limit == wip.MIN_LIMIT and cap.num_halved == 1
    # an eligible stage waiting for KV over shrink_wait_s: the W are enough to fill the node, W - 1
    cap.set_limit(6)
    big = job_of("w0", 0.0, "big", tokens=128 * 16, loop=loop)
    dispatcher.submit(big)
    assert not big.future.done()
    big.enqueued_s -= 1.1
    dispatcher.adapt_cap(CapSignals(preemptions={"a": 2}))
    assert cap.limit == 5 and cap.num_shrunk == 1
    dispatcher.adapt_cap(CapSignals(preemptions={"a": 2}))
    assert cap.limit == 5  # at most once per shrink_wait_s
    cap.shrink_wait_s = 0.0
    cap._last_shrink_s -= 10
    dispatcher.adapt_cap(CapSignals(preemptions={"a": 2}))
    assert cap.limit == 5  # off: no shrink however long it waits
    cap.backoff = 1.0
    dispatcher.adapt_cap(CapSignals(preemptions={"a": 9}))
    assert cap.limit == 5 and cap.num_halved == 1  # backoff 1: preemptions leave W alone


def test_the_adaptive_caps_what_ifs_count_no_refusals():
    loop = asyncio.new_event_loop()
    cap = WorkflowCap(wip.MIN_LIMIT, adaptive=True, idle_s=60.0)
    dispatcher, node = capped(cap, blocks=2 * wip.MIN_LIMIT)
    running = [job_of(f"w{i}", float(i), tokens=128 * 2, loop=loop) for i in range(wip.MIN_LIMIT)]
    held = job_of("late", 9.0, tokens=128, loop=loop)
    for job in (*running, held):
        dispatcher.submit(job)
    assert all(j.future.done() for j in running) and not held.future.done()  # held by the cap, not the node
    assert sum(node.num_refused.values()) == 0
    dispatcher.adapt_cap(CapSignals(preemptions={"a": 0}))  # asks whether the held stage would fit now: the node is full, it would not
    assert dispatcher.cap_state(time.monotonic()) == (False, None) and not node.admit(0, 128, count_refusal=False).is_admitted
    assert sum(node.num_refused.values()) == 0


def test_what_if_fits_count_no_refusals():
    node = make_node("a", blocks=2)
    assert not node.admit(128 * 3, 0, count_refusal=False).is_admitted and sum(node.num_refused.values()) == 0
    assert not node.admit(128 * 3, 0).is_admitted and sum(node.num_refused.values()) == 1


def test_cap_config_is_checked_and_the_cap_sends_workflow_rank_as_vllm_priority():
    nodes = [{"name": "a", "url": "http://a"}]
    with pytest.raises(ValueError, match="workflow_cap"):
        GatewayConfig(nodes=nodes, workflow_cap=-1)
    with pytest.raises(ValueError, match="workflow_cap"):
        GatewayConfig(nodes=nodes, workflow_cap_adaptive=True)
    with pytest.raises(ValueError, match="workflow_cap_backoff"):
        GatewayConfig(nodes=nodes, workflow_cap=2, workflow_cap_backoff=0)
    assert Gateway(GatewayConfig(nodes=nodes)).dispatcher.cap is None
    gateway = Gateway(GatewayConfig(nodes=nodes, workflow_cap=4, workflow_cap_adaptive=True, workflow_idle_s=0.2))
    cap = gateway.dispatcher.cap
    assert (cap.limit, cap.adaptive, cap.idle_s) == (4, True, 0.2)
    assert gateway.status()["workflow_cap"]["limit"] == 4
    loop = asyncio.new_event_loop()
    job = job_of("w", 0.0, tokens=300, loop=loop)
    gateway.workflow("first", 0.0)
    gateway.workflow("w", 1.0)
    assert gateway.vllm_priority(job) == BATCH_PRIORITY + 1  # its arrival rank, not its predicted tokens
