"""GPU tests under tests/serving skip cleanly where there is no NVIDIA GPU or no cuda-python."""

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
