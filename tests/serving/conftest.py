"""Fixtures of every test under tests/serving: GPU tests skip cleanly without a GPU; no service keys."""

import pytest


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly where there is no NVIDIA GPU or no cuda-python."""
    try:
        import cuda  # noqa: F401
    except ImportError:
        skip = pytest.mark.skip(reason="cuda-python not installed (pip install 'maestro[gpu]')")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_predictor_service_keys(monkeypatch):
    """The predictor service's tests (tests/predictor_service, collected before these) set an API key and an admin
    token in the environment for their whole session; a service these tests start in process, or a `bentoml serve`
    that inherits the environment, must not require them."""
    for name in ("MAESTRO_API_KEYS", "MAESTRO_API_KEYS_FILE", "MAESTRO_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
