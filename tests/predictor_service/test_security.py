"""The service under hostile callers: admin gate, reload confinement, tampered artifacts, API keys, body limits,
and schema-driven fuzzing with zero 5xx."""

import json
import pickle
import shutil
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from maestro.keys import key_id
from pipelines.predictor import ArtifactMismatch, Predictor
from predictor_service import loading
from predictor_service.client import to_wire as unlabelled
from predictor_service.config import ServiceConfig
from predictor_service.guard import Guard, refusal


class WritesAMarker:
    """A pickle that, once loaded, creates a file: what an attacker would plant as predictor.joblib."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_admin_reload_needs_the_admin_token(api, admin, model_dir):
    body = {"model": str(model_dir)}
    assert api.post("/admin/reload", json=body, headers={"Authorization": ""}).status_code == 401
    assert (
        api.post("/admin/reload", json=body, headers={"Authorization": "Bearer wrong-token-wrong"}).status_code == 401
    )
    assert api.post("/admin/reload", json=body).status_code == 401  # an API key is not the admin token


def test_admin_endpoints_are_off_without_a_token_unless_opened_explicitly():
    off = ServiceConfig(model="m")
    assert refusal(off, "/admin/reload", None)[0] == 403
    assert refusal(off, "/admin/reload", "Bearer anything")[0] == 403
    assert refusal(ServiceConfig(model="m", admin_open=True), "/admin/reload", None) is None
    assert refusal(ServiceConfig(model="m", admin_token="t" * 20), "/admin/reload", "Bearer " + "t" * 20) is None


def test_the_admin_token_reads_stats_but_does_not_predict(admin, api):
    assert api.get("/stats", headers=admin).status_code == 200  # `maestro deploy` verifies nodes this way
    assert api.post("/predict", json={"stages": []}, headers=admin).status_code == 401


@pytest.mark.parametrize("location", ["/etc", "../../../../etc", "models:/other-model/1", "runs:/abc/model"])
def test_reload_loads_only_the_registry_or_the_model_root_and_never_echoes_the_path(api, admin, location):
    before = api.get("/stats").json()["model_version"]
    response = api.post("/admin/reload", json={"model": location}, headers=admin)
    assert response.status_code == 403, response.text
    assert "etc" not in response.text
    assert api.get("/stats").json()["model_version"] == before


def test_a_tampered_predictor_is_refused_before_it_is_unpickled(api, admin, model_dir, tmp_path_factory):
    before = api.get("/stats").json()["model_version"]
    tampered = tmp_path_factory.mktemp("tampered") / "predictor"
    shutil.copytree(model_dir, tampered)
    marker = tampered.parent / "code-ran"
    (tampered / "predictor.joblib").write_bytes(pickle.dumps(WritesAMarker(marker)))
    response = api.post("/admin/reload", json={"model": str(tampered)}, headers=admin)
    assert response.status_code == 422 and "checksum" in response.text, response.text
    assert not marker.exists()
    assert api.get("/stats").json()["model_version"] == before
    with pytest.raises(ArtifactMismatch):
        Predictor.load(tampered)
    assert not marker.exists()


def test_a_predictor_without_a_recorded_checksum_is_refused(model_dir, tmp_path):
    unchecked = tmp_path / "predictor"
    shutil.copytree(model_dir, unchecked)
    meta = json.loads((unchecked / "meta.json").read_text())
    (unchecked / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "artifact_sha256"}))
    with pytest.raises(ArtifactMismatch, match="no recorded checksum"):
        loading.load(loading.resolve(str(unchecked)))


def test_a_registered_version_is_checked_against_the_registry_checksum(model_dir, tmp_path):
    import mlflow
    from mlflow import MlflowClient

    from pipelines.registry import CHECKSUM_TAG, MODEL_NAME, register_predictor, use_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    previous = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    use_store(uri, str(tmp_path / "artifacts"))
    try:
        with mlflow.start_run():
            version = register_predictor(model_dir, ["lightgbm"])
        source = loading.resolve(f"models:/{MODEL_NAME}/{version}", uri)
        assert loading.load(source, uri).model is not None
        MlflowClient().set_model_version_tag(MODEL_NAME, version, CHECKSUM_TAG, "0" * 64)
        with pytest.raises(ArtifactMismatch, match="checksum given"):
            loading.load(source, uri)
        MlflowClient().delete_model_version_tag(MODEL_NAME, version, CHECKSUM_TAG)
        with pytest.raises(ArtifactMismatch, match="registered without a checksum"):
            loading.load(source, uri)
    finally:
        mlflow.set_tracking_uri(previous[0])
        mlflow.set_registry_uri(previous[1])


@pytest.mark.parametrize("path", ["/predict", "/predict_unbatched", "/route_hints", "/observe", "/history", "/stats"])
def test_api_key_is_required_where_configured(api, path, sample_records):
    for authorization in ("", "Bearer not-a-configured-key-at-all", "Basic abc"):
        if path == "/stats":
            response = api.get(path, headers={"Authorization": authorization})
        else:
            response = api.post(
                path, json={"stages": [unlabelled(sample_records[0])]}, headers={"Authorization": authorization}
            )
        assert response.status_code == 401 and "API key" in response.text
        assert response.headers["www-authenticate"] == "Bearer"
    assert api.get("/livez", headers={"Authorization": ""}).status_code == 200  # probes stay open


def test_observed_traces_carry_the_key_id_not_the_key(api, api_key, sample_records, service_env):
    finished = {**sample_records[3], "workflow_id": "keyed-workflow"}
    assert api.post("/observe", json={"stages": [finished]}).status_code == 200
    lines = [
        json.loads(line)
        for path in sorted((service_env / "observed").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    (line,) = [line for line in lines if line["workflow_id"] == "keyed-workflow"]
    assert line["api_key_id"] == key_id(api_key)
    assert api_key not in json.dumps(lines)


def _echo_app(limit: int) -> TestClient:
    async def echo(request):
        return PlainTextResponse(str(len(await request.body())))

    app = Starlette(routes=[Route("/predict", echo, methods=["POST"])])
    return TestClient(Guard(app, ServiceConfig(model="m", max_body_bytes=limit)))


def test_bodies_over_the_limit_get_413_declared_or_chunked():
    client = _echo_app(limit=100)
    assert client.post("/predict", content=b"x" * 100).text == "100"
    assert client.post("/predict", content=b"x" * 101).status_code == 413
    assert client.post("/predict", content=iter([b"x" * 60, b"x" * 60])).status_code == 413  # chunked
    assert client.post("/predict", content=iter([b"x" * 30, b"x" * 30])).text == "60"
    bad_length = client.post("/predict", content=b"x", headers={"content-length": "lots"})
    assert bad_length.status_code == 400


def test_the_service_refuses_a_body_over_its_limit(api):
    response = api.post(
        "/predict", content=b"x" * (ServiceConfig.max_body_bytes + 1), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413 and "MAESTRO_MAX_BODY_BYTES" in response.text


def test_fuzzed_calls_to_every_endpoint_never_get_a_5xx(api, admin):
    """Schemathesis draws valid and invalid bodies from the service's own OpenAPI schema."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    schema = schemathesis.openapi.from_dict(api.get("/docs.json").json())
    operations = [op.ok() for op in schema.get_all_operations() if op.ok().method == "post"]
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    strategy = st.one_of([op.as_strategy(generation_mode=mode) for op in operations for mode in modes])

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def call(case):
        headers = admin if case.path.startswith("/admin/") else {}
        body = None if isinstance(case.body, schemathesis.core.NotSet) else case.body
        content = body if isinstance(body, bytes) else json.dumps(body).encode()  # NaN and all, as a caller may
        headers = {**headers, "content-type": case.media_type or "application/json"}
        response = api.request(case.method, case.formatted_path, content=content, headers=headers)
        assert response.status_code < 500, (case.path, body, response.text[:300])

    call()
