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
