"""A clone of the repository after a real `dvc repro` on a small synthetic sample: shared by the DVC and MLflow
tests (one repro takes minutes)."""

from pathlib import Path

import pytest

from tests.pipelines.clone import run, small_clone


@pytest.fixture(scope="session")
def reproduced(tmp_path_factory) -> Path:
    clone = small_clone(tmp_path_factory.mktemp("repo") / "maestro", sample={"num_stages": 700}, train={"folds": 3})
    run(["dvc", "repro"], clone)
    return clone
