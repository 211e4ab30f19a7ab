"""Fixtures for gateway tests: a gateway config/app wired to in-process upstreams, and real vLLM engines."""
from __future__ import annotations

import json

import httpx
import pytest

from serving.gateway.app import create_app
from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway

from .engines import Engine, EngineConfig, has_vllm
from .tiny_model import build_tiny_model

METRICS = """# TYPE vllm:kv_cache_usage_perc gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 1.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} %(usage)s
vllm:num_preemptions_total{engine="0",model_name="tiny"} 3.0
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="%(blocks)s",enable_prefix_caching="True"} 1.0
"""


def metrics_text(blocks: int = 16, usage: float = 0.0) -> str:
    return METRICS % {"blocks": blocks, "usage": usage}


def vllm_like(name: str, fail: bool = False):
    def handler(request: httpx.Request) -> httpx.Response:
        if fail:
            raise httpx.ConnectError(f"{name} is down")
        if request.url.path == "/metrics":
            return httpx.Response(200, text=metrics_text(16))
        body = json.loads(request.content)
        n = body["max_tokens"]
        if body.get("stream"):
            chunks = [{"choices": [{"delta": {"content": "x "}, "finish_reason": None}]} for _ in range(n)]
            chunks.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}})
            text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json={"choices": [{"message": {"content": "x " * n}, "finish_reason": "length"}],
                                         "usage": {"prompt_tokens": 5, "completion_tokens": n}})
    return handler


class Routed(httpx.AsyncBaseTransport):
    def __init__(self, handlers: dict):
        self.handlers = {k: httpx.MockTransport(v) for k, v in handlers.items()}

    async def handle_async_request(self, request):
        return await self.handlers[request.url.host].handle_async_request(request)


async def run_app(tmp_path, handlers: dict, calls, predictor=None):
    """The gateway app in process over vLLM-like `handlers` ({host: handler}); `calls(client, gateway)` drives it."""
    config = GatewayConfig(nodes=[{"name": n, "url": f"http://{n}"} for n in handlers], trace_dir=str(tmp_path),
                           model="tiny", metrics_period_s=60)
    gateway = Gateway(config, predictor=predictor, transport=Routed(handlers))
    app = create_app(config, gateway)
    await gateway.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            return await calls(client, gateway)
    finally:
        await gateway.stop()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def _engine(model_dir, tmp_path_factory, **kw) -> Engine:
    if not has_vllm():
        pytest.skip(".venv-vllm is missing: run scripts/setup-vllm.sh to enable the vLLM tests")
    logs = tmp_path_factory.mktemp("vllm-logs")
    config = EngineConfig(str(model_dir), log_path=str(logs / "vllm.log"),
                          env={"MAESTRO_VLLM_STATS_DIR": str(logs / "stats")}, **kw)
    return Engine(config).start()


@pytest.fixture(scope="session")
def vllm_engine(tiny_model, tmp_path_factory):
    """One real vLLM-CPU engine for the whole session (~30 s to start)."""
    engine = _engine(tiny_model, tmp_path_factory, kv_cache_bytes=32 * 1024 * 1024)
    try:
        yield engine.wait_ready()
    finally:
        engine.stop()


@pytest.fixture
def second_engine(tiny_model, tmp_path_factory):
    """A second engine, only for the failover test (it gets killed there)."""
    engine = _engine(tiny_model, tmp_path_factory, kv_cache_bytes=32 * 1024 * 1024)
    try:
        yield engine.wait_ready()
    finally:
        engine.stop()
