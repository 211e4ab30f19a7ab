"""Fixtures for gateway tests: a gateway config/app wired to in-process upstreams, and real vLLM engines."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
from aiohttp import web

from driver.testbed.engines import free_port
from serving.gateway.app import create_app
from serving.gateway.config import GatewayConfig, merged
from serving.gateway.core import Gateway

METRICS = """# TYPE vllm:kv_cache_usage_perc gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 1.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} %(usage)s
vllm:num_preemptions_total{engine="0",model_name="tiny"} 3.0
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="%(blocks)s",enable_prefix_caching="True"} 1.0
"""


MAX_FAKE_TOKENS = 256  # a vLLM-like node answers at most this many tokens, whatever max_tokens asks


def metrics_text(blocks: int = 16, usage: float = 0.0) -> str:
    """/metrics of a vLLM whose requests can hold `blocks` blocks: like vLLM v1, it reports one more (the null
    block) in num_gpu_blocks, and `usage` is a share of the usable ones."""
    return METRICS % {"blocks": blocks + 1, "usage": usage}


def vllm_like(
    tail_delay_s: float = 0.0,
    received: list | None = None,
    token_delay_s: float = 0.0,
    tails: list | None = None,
    headers: list | None = None,
) -> web.Application:
    """An app that answers like vLLM: /metrics, JSON completions with usage, SSE streams ending in usage.

    `tail_delay_s`: a JSON answer comes that long after its last token, a stream's `[DONE]` that long after
    its usage chunk (the hand-over of a finished request, slow on a busy CPU); `received` collects the bodies,
    `headers` the request headers;
    `token_delay_s`: time between stream chunks; `tails` gets a True each time a tail delay starts.
    """

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=metrics_text(16))

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if received is not None:
            received.append(body)
        if headers is not None:
            headers.append(dict(request.headers))
        n = min(body.get("max_tokens") or 16, MAX_FAKE_TOKENS)
        is_chat = "messages" in body
        if not body.get("stream"):
            if tails is not None:
                tails.append(True)
            await asyncio.sleep(tail_delay_s)
            choice = {"message": {"role": "assistant", "content": "x " * n}} if is_chat else {"text": "x " * n}
            return web.json_response(
                {
                    "choices": [{"index": 0, **choice, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": n},
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        part = (lambda: {"delta": {"content": "x "}}) if is_chat else (lambda: {"text": "x "})
        chunks = [
            {"id": "c1", "model": "tiny", "choices": [{"index": 0, **part(), "finish_reason": None}]} for _ in range(n)
        ]
        chunks[-1]["choices"][0]["finish_reason"] = "length"
        if (body.get("stream_options") or {}).get("continuous_usage_stats"):
            for i, chunk in enumerate(chunks):
                chunk["usage"] = {"prompt_tokens": 5, "completion_tokens": i + 1}
        chunks.append(
            {"id": "c1", "model": "tiny", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}}
        )
        for chunk in chunks:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if token_delay_s:
                await asyncio.sleep(token_delay_s)
        if tails is not None:
            tails.append(True)
        await asyncio.sleep(tail_delay_s)
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)
    return app


@contextlib.asynccontextmanager
async def fake_nodes(alive: dict[str, bool], **node_kw):
    """{name: url}: a vLLM-like server on 127.0.0.1 per live node; a dead one is a port nobody listens on."""
    runners, urls = [], {}
    try:
        for name, is_alive in alive.items():
            port = free_port()
            urls[name] = f"http://127.0.0.1:{port}"
            if is_alive:
                runner = web.AppRunner(vllm_like(**node_kw))
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", port).start()
                runners.append(runner)
        yield urls
    finally:
        for runner in runners:
            await runner.cleanup()


async def run_app(tmp_path, alive: dict[str, bool], calls, predictor=None, node_kw: dict | None = None, **sections):
    """The gateway app in process over vLLM-like nodes (`alive`: name → up?); `calls(client, gateway)` drives it."""
    async with fake_nodes(alive, **(node_kw or {})) as urls:
        return await serve_app(tmp_path, urls, calls, predictor, **sections)


async def serve_app(tmp_path, urls: dict[str, str], calls, predictor=None, **sections):
    """The gateway app in process over the nodes `urls` (name → url); `calls(client, gateway)` drives it; `sections`
    are GatewayConfig sections laid over the test defaults."""
    config = GatewayConfig(
        nodes=[{"name": n, "url": u} for n, u in urls.items()],
        model="tiny",
        **merged({"traces": {"dir": str(tmp_path)}, "upstream": {"metrics_period_s": 60}}, sections),
    )
    gateway = Gateway(config, predictor=predictor)
    app = create_app(config, gateway)
    await gateway.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            return await calls(client, gateway)
    finally:
        await gateway.stop()
