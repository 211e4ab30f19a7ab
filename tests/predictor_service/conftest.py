"""Fixtures for the predictor service: small fast predictors, a service app on them, a tmp MLflow store."""

from pathlib import Path

import pytest

from maestro.contract import StageTrace
from pipelines.features import FeaturizerConfig
from pipelines.model import ModelConfig
from pipelines.predictor import MIN_STAGES_FOR_MODEL, Predictor
from pipelines.synth import generate

FAST_MODEL = ModelConfig(
    folds=3, classifier=dict(n_estimators=40, learning_rate=0.1), regressor=dict(n_estimators=80, learning_rate=0.1)
)
NO_EMBEDDING = FeaturizerConfig(use_embedding=False)


@pytest.fixture(scope="session")
def sample_records() -> list[dict]:
    return generate(300, seed=11)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, sample_records) -> Path:
    """A two-stage predictor (no embedding, few trees): trains in seconds."""
    stages = [StageTrace.model_validate(r) for r in sample_records]
    return Predictor.train(stages, NO_EMBEDDING, FAST_MODEL).save(tmp_path_factory.mktemp("model") / "predictor")


@pytest.fixture(scope="session")
def priors_dir(tmp_path_factory, sample_records) -> Path:
    """A priors-only predictor (too little data for a model): a visibly different second version."""
    stages = [StageTrace.model_validate(r) for r in sample_records[: MIN_STAGES_FOR_MODEL - 1]]
    return Predictor.train(stages, NO_EMBEDDING, FAST_MODEL).save(tmp_path_factory.mktemp("priors") / "predictor")


API_KEY = "test-api-key-0123456789"
ADMIN_TOKEN = "test-admin-token-0123456789"


@pytest.fixture(scope="session")
def api_key() -> str:
    """The API key service_env configures (the `api` client sends it)."""
    return API_KEY


@pytest.fixture(scope="session")
def admin() -> dict:
    """Headers of the service's admin (the token service_env configures)."""
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="session")
def service_env(model_dir, tmp_path_factory) -> Path:
    """Environment the service reads at start: the fast model, traces under a tmp dir (returned), an API key,
    an admin token, and the tests' tmp root as the model root (reload may load the fixtures' predictors)."""
    root = tmp_path_factory.mktemp("service")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MAESTRO_MODEL", str(model_dir))
        patch.setenv("MAESTRO_TRACE_DIR", str(root / "observed"))
        patch.setenv("MAESTRO_CORRECTION_MIN_OBSERVATIONS", "3")
        patch.setenv("MAESTRO_API_KEYS", API_KEY)
        patch.setenv("MAESTRO_ADMIN_TOKEN", ADMIN_TOKEN)
        patch.setenv("MAESTRO_MODEL_ROOT", str(tmp_path_factory.getbasetemp()))
        yield root


@pytest.fixture(scope="session")
def api(service_env, bentoml_asgi):
    """The service's ASGI app under a test client that sends the API key; one per session (BentoML registers
    its metrics globally)."""
    from starlette.testclient import TestClient

    from predictor_service.service import PredictorService

    with TestClient(bentoml_asgi(PredictorService), headers={"Authorization": f"Bearer {API_KEY}"}) as client:
        yield client
