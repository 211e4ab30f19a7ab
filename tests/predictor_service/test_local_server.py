"""The local `bentoml serve` helper survives losing its picked port to someone else."""

import socket

import httpx
import pytest

from predictor_service import local_server
from predictor_service.local_server import LocalServer, ServerConfig

pytestmark = pytest.mark.slow


def test_a_port_taken_before_bentoml_binds_it_is_replaced(model_dir, tmp_path, monkeypatch):
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    real_free_port = local_server.free_port
    ports = iter([taken])
    monkeypatch.setattr(local_server, "free_port", lambda: next(ports, None) or real_free_port())
    env = {"MAESTRO_MODEL": str(model_dir), "MAESTRO_TRACE_DIR": str(tmp_path / "observed")}
    try:
        with LocalServer(ServerConfig(env=env, log_path=str(tmp_path / "server.log"))) as server:
            assert server.port != taken
            assert httpx.get(f"{server.url}/readyz", timeout=5).status_code == 200
    finally:
        squatter.close()


def test_the_benchmarks_framework_only_service_is_the_services_bentoml_path_without_a_model(sample_records, tmp_path):
    """benchmarks/service/serve.py measures it as BentoML's share of the service's latency: it must batch
    like /predict, sit behind the same Guard and answer the same schema, one object per stage."""
    from benchmarks.service.framework import FrameworkOnly
    from benchmarks.service.serve import FRAMEWORK_ONLY
    from predictor_service.client import to_wire
    from predictor_service.schemas import PredictionOut
    from predictor_service.service import PredictorService

    ours, theirs = FrameworkOnly.apis["predict"], PredictorService.apis["predict"]
    assert (ours.batchable, ours.max_batch_size, ours.max_latency_ms) == (
        theirs.batchable,
        theirs.max_batch_size,
        theirs.max_latency_ms,
    )
    assert [m for m, _ in FrameworkOnly.middlewares] == [m for m, _ in PredictorService.middlewares]
    stages = [to_wire(r) for r in sample_records[:2]]
    with LocalServer(ServerConfig(target=FRAMEWORK_ONLY, log_path=str(tmp_path / "server.log"))) as server:
        response = httpx.post(f"{server.url}/predict", json={"stages": stages}, timeout=30)
        too_big = httpx.post(f"{server.url}/predict", content=b"x" * (17 << 20), timeout=30)
    assert response.status_code == 200, response.text
    answers = [PredictionOut.model_validate(a) for a in response.json()]
    assert [(a.workflow_id, a.stage_id) for a in answers] == [(s["workflow_id"], s["stage_id"]) for s in stages]
    assert {a.model_version for a in answers} == {"framework-only"}
    assert too_big.status_code == 413  # the Guard's body limit: the same front door as the service
