"""A node's health from its /metrics polls: a busy engine that answers them late is not taken out of dispatch,
so overload is answered from the bounded queue (429 + Retry-After), not with 503 "no healthy node"."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
from aiohttp import web

from driver.testbed.engines import free_port
from serving.gateway.app import create_app
from serving.gateway.config import GatewayConfig, NodeConfig
from serving.gateway.core import Gateway
from serving.gateway.nodes import Node
from serving.gateway.upstream import Upstream

from .conftest import vllm_like

POLL_TIMEOUT_S = 0.2


class Engine:
    """What the vLLM-like node below is doing: completions in flight, and whether /metrics is held back."""

    def __init__(self):
        self.num_inflight, self.is_stalled = 0, False


def busy_vllm(engine: Engine, tail_delay_s: float = 0.0) -> web.Application:
    """vLLM-like: /metrics waits while a completion is in flight (an engine too busy to answer it in time), or
    while the engine is stalled."""

    @web.middleware
    async def busy(request: web.Request, handler):
        if request.path == "/metrics":
            while engine.num_inflight or engine.is_stalled:
                await asyncio.sleep(0.02)
            return await handler(request)
        engine.num_inflight += 1
        try:
            return await handler(request)
        finally:
            engine.num_inflight -= 1

    app = vllm_like(tail_delay_s=tail_delay_s)
    app.middlewares.append(busy)
    return app


@contextlib.asynccontextmanager
async def serving(app: web.Application):
    runner, port = web.AppRunner(app), free_port()
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def polls(node: Node, num_polls: int, down_after: int = 3) -> list[bool]:
    return [await node.poll(POLL_TIMEOUT_S, down_after) for _ in range(num_polls)]


def test_a_node_slow_to_answer_metrics_is_down_only_after_failed_polls_in_a_row_and_never_while_busy():
    async def run():
        engine = Engine()
        async with serving(busy_vllm(engine)) as url:
            upstream = Upstream(node_timeout_s=5, connect_timeout_s=1)
            await upstream.start()
            node = Node(NodeConfig("a", url), upstream)
            try:
                assert await polls(node, 1) == [True]
                engine.is_stalled, node.num_inflight = True, 2  # busy: late answers are not failures
                busy = await polls(node, 4)
                counts = (node.vllm.num_failed_polls, node.vllm.num_slow_polls)
                node.num_inflight = 0  # idle and not answering: down at the third miss in a row
                idle = await polls(node, 3)
                engine.is_stalled = False
                return busy, counts, idle, await polls(node, 1), node.vllm.num_failed_polls
            finally:
                await upstream.close()

    busy, counts, idle, back, num_failed = asyncio.run(run())
    assert busy == [True] * 4 and counts == (0, 4)
    assert idle == [True, True, False]
    assert back == [True] and num_failed == 0


def test_a_node_that_refuses_the_connection_is_down_at_once():
    async def run():
        upstream = Upstream(node_timeout_s=5, connect_timeout_s=1)
        await upstream.start()
        node = Node(NodeConfig("a", f"http://127.0.0.1:{free_port()}"), upstream)
        node.is_healthy, node.num_inflight = True, 3
        try:
            return await polls(node, 1)
        finally:
            await upstream.close()

    assert asyncio.run(run()) == [False]


def test_overload_of_a_busy_node_answers_429_with_retry_after_from_the_queue_and_traces_every_stage(tmp_path):
    """One stage's KV at a time, a queue of two, five stages at once, and an engine that answers /metrics only when
    idle: two are refused with 429 + Retry-After at once, the three others run in turn; the node stays healthy."""

    async def run():
        async with serving(busy_vllm(Engine(), tail_delay_s=0.6)) as url:
            config = GatewayConfig(
                nodes=[{"name": "a", "url": url}],
                traces={"dir": str(tmp_path)},
                upstream={"metrics_period_s": 0.05, "connect_timeout_s": POLL_TIMEOUT_S},
                limits={"max_queued": 2},
                kv={"admission": "peak", "overcommit": 1.0},
                model="tiny",
            )
            gateway = Gateway(config)
            await gateway.start()
            try:
                async with httpx.AsyncClient(
                    transport=httpx.ASGITransport(create_app(config, gateway)), base_url="http://gw"
                ) as client:
                    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1500}
                    responses = await asyncio.gather(
                        *(
                            client.post(
                                "/v1/chat/completions",
                                json=body,
                                headers={"X-Maestro-Workflow": "w", "X-Maestro-Stage": f"s{i}"},
                            )
                            for i in range(5)
                        )
                    )
                return responses, gateway.nodes[0]
            finally:
                await gateway.stop()

    responses, node = asyncio.run(run())
    assert sorted(r.status_code for r in responses) == [200, 200, 200, 429, 429]
    assert all(r.headers["Retry-After"] == "1" for r in responses if r.status_code == 429)
    assert node.is_healthy and node.vllm.num_slow_polls > 0 and node.vllm.num_failed_polls == 0
    lines = [json.loads(line) for p in tmp_path.glob("*.jsonl") for line in p.read_text().splitlines()]
    assert sorted(line["stage_id"] for line in lines) == [f"s{i}" for i in range(5)]
    assert sorted(line["outcome"] for line in lines) == ["completed"] * 3 + ["refused"] * 2


def test_a_stage_that_failed_on_every_healthy_node_is_traced_with_the_attempts_reason(tmp_path):
    @web.middleware
    async def failing(request: web.Request, handler):
        return web.Response(status=500, text="engine error") if request.method == "POST" else await handler(request)

    async def run():
        app = vllm_like()
        app.middlewares.append(failing)
        async with serving(app) as url:
            config = GatewayConfig(
                nodes=[{"name": "a", "url": url}],
                traces={"dir": str(tmp_path)},
                upstream={"metrics_period_s": 60},
                model="tiny",
            )
            gateway = Gateway(config)
            await gateway.start()
            try:
                async with httpx.AsyncClient(
                    transport=httpx.ASGITransport(create_app(config, gateway)), base_url="http://gw"
                ) as client:
                    return await client.post("/v1/completions", json={"prompt": "p", "max_tokens": 3})
            finally:
                await gateway.stop()

    response = asyncio.run(run())
    [line] = [json.loads(line) for p in tmp_path.glob("*.jsonl") for line in p.read_text().splitlines()]
    assert response.status_code == 503 and "Retry-After" in response.headers
    assert line["outcome"] == "failed" and "failed on ['a']; last: a: HTTP 500: engine error" in line["error"]


def test_stages_past_a_nodes_inflight_cap_wait_in_the_bounded_queue_and_overflow_with_429(tmp_path):
    """Plenty of KV, but at most one stage on the node: of three at once one runs, one waits in the gateway's queue
    of one and the third gets 429 + Retry-After, instead of all three going to vLLM's own queue."""

    async def run():
        engine = Engine()
        async with serving(busy_vllm(engine, tail_delay_s=0.3)) as url:
            config = GatewayConfig(
                nodes=[{"name": "a", "url": url}],
                traces={"dir": str(tmp_path)},
                upstream={"metrics_period_s": 60},
                limits={"max_queued": 1, "max_inflight_per_node": 1},
                model="tiny",
            )
            gateway = Gateway(config)
            await gateway.start()
            try:
                async with httpx.AsyncClient(
                    transport=httpx.ASGITransport(create_app(config, gateway)), base_url="http://gw"
                ) as client:
                    responses = await asyncio.gather(
                        *(
                            client.post(
                                "/v1/completions",
                                json={"prompt": "p", "max_tokens": 3},
                                headers={"X-Maestro-Stage": f"s{i}"},
                            )
                            for i in range(3)
                        )
                    )
                return responses, gateway.nodes[0].num_refused["inflight"]
            finally:
                await gateway.stop()

    responses, num_refused_inflight = asyncio.run(run())
    assert sorted(r.status_code for r in responses) == [200, 200, 429] and num_refused_inflight > 0
    assert next(r for r in responses if r.status_code == 429).headers["Retry-After"] == "1"
