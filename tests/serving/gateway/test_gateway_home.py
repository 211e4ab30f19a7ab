"""A session's next stage waits for the node holding its context while the gateway holds it there (its tool-call hold
was on when the call arrived: `Sessions.arrive`'s `Home.is_held`, carried as `StageRequest.is_home_held`), and goes
there only if that node may start it now once the hold is gone (serving/core/dispatch.py `goes_home`)."""

from __future__ import annotations

import asyncio

from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway
from serving.gateway.metadata import StageMeta
from serving.gateway.sessions import Home, Sessions

from .test_gateway_sessions import job_of
from .test_gateway_units import make_node

NODES = [{"name": "a", "url": "http://a"}, {"name": "b", "url": "http://b"}]
BODY = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 50}


def test_sessions_say_whether_the_context_was_held_when_the_next_call_arrived():
    node = make_node("a", blocks=64)
    sessions = Sessions("keep-always", idle_s=10.0)
    assert sessions.arrive("w", 0.0) == Home()
    sessions.stage_ended("w", node, 500, is_tool_call=True, tool_key="t", is_final=False, now=1.0)
    assert sessions.arrive("w", 2.0) == Home("a", is_held=True) and not node.kv.held  # the hold goes with the call
    sessions.stage_ended("w", node, 500, is_tool_call=False, tool_key="t", is_final=False, now=3.0)
    assert sessions.arrive("w", 4.0) == Home("a", is_held=False)  # no tool call: nothing held
    pinning = Sessions("continuum", idle_s=60.0)  # a fixed 2 s hold
    pinning.stage_ended("w", node, 500, is_tool_call=True, tool_key="t", is_final=False, now=0.0)
    pinning.expire(3.0, busy=set())  # the hold's TTL passed: what vLLM's cache keeps of it is unknown
    assert not node.kv.held and pinning.arrive("w", 4.0) == Home("a", is_held=False)
    evicting = Sessions("evict-always")
    evicting.stage_ended("w", node, 500, is_tool_call=True, tool_key="t", is_final=False, now=0.0)
    assert evicting.arrive("w", 1.0) == Home("a", is_held=False)
    node.is_healthy = False
    assert Sessions("keep-always").arrive("w", 0.0) == Home()


def test_a_prepared_stage_carries_its_held_home():
    gateway = Gateway(GatewayConfig(nodes=NODES, system={"name": "mars", "tool_kv": "keep-always"}))
    gateway.nodes[:] = [make_node("a", blocks=64), make_node("b", blocks=64)]
    first = asyncio.run(gateway.prepare(StageMeta("w", "s1", app="x"), BODY))
    assert (first.request.home_node, first.request.is_home_held) == ("", False)
    gateway.sessions.stage_ended("w", gateway.nodes[1], 500, is_tool_call=True, tool_key="t", is_final=False, now=0.0)
    second = asyncio.run(gateway.prepare(StageMeta("w", "s2", app="x"), BODY))
    assert (second.request.home_node, second.request.is_home_held) == ("b", True)
    # it waits for home at most what re-prefilling its prompt elsewhere would take
    prefill_s = second.request.prompt_tokens * gateway.sessions.prefill_s_per_token
    assert second.request.home_wait_s == prefill_s > 0
    assert not gateway.nodes[1].kv.held  # its arrival let the hold go: the stage may take those blocks at home


def test_a_stage_held_at_home_waits_for_it_and_one_not_held_starts_elsewhere():
    loop = asyncio.new_event_loop()
    gateway = Gateway(GatewayConfig(nodes=NODES, system={"name": "fcfs"}))
    other, home = make_node("a", blocks=64, usage=0.5), make_node("b", blocks=64, usage=0.6)
    gateway.nodes[:] = gateway.dispatcher.nodes[:] = [other, home]
    held = job_of("w", 0.0, stage="s2", tokens=128 * 26, loop=loop)  # more than home has free now
    held.request.home_node, held.request.is_home_held = "b", True
    gateway.dispatcher.submit(held)
    assert held.node is None and gateway.dispatcher.is_backlogged()  # not re-prefilled on the other node
    loose = job_of("v", 0.0, stage="s2", tokens=128 * 26, loop=loop)
    loose.request.home_node = "b"
    gateway.dispatcher.submit(loose)
    assert loose.node is other  # not held: home cannot start it now, so the fittest that can (backfilled past it)
    home.kv.kv_usage = 0.0  # home's running stages ended
    gateway.dispatcher.pump()
    assert held.node is home
