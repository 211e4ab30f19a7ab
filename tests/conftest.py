import os
from pathlib import Path

import pytest

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
