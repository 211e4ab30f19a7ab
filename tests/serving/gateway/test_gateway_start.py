"""`maestro gateway` at its start: its one line (address, nodes, system, predictor and the model's version), a line per
node state change, and `predictor.model` as a registry URI read from `maestro serve`'s default store, or a one-line
error naming the URI and the store, with nothing written."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from maestro.cli import main
from serving.gateway.model_source import ModelNotFound, load_model

from .conftest import run_app
from .test_gateway_local_predictor import train

CHAMPION = "models:/stage-length@champion"


def test_the_gateway_says_where_it_listens_and_what_it_runs_and_each_node_change(tmp_path, caplog):
    async def calls(client, gateway):
        node = gateway.nodes[0]
        node.is_healthy = False  # a call to it failed
        await gateway.poll_once()  # its /metrics answers: up again
        await gateway.poll_once()  # no change: no line

    with caplog.at_level(logging.INFO, logger="maestro.gateway"):
        asyncio.run(run_app(tmp_path, {"node0": True, "node1": False}, calls, system={"name": "maestro", "slo_s": 30}))
    lines = [r.getMessage() for r in caplog.records if r.name == "maestro.gateway"]
    start, *changes = lines
    assert start.startswith("listening on http://127.0.0.1:8000; nodes: node0 http://127.0.0.1:")
    assert "(up), node1 http://127.0.0.1:" in start and "(down); system: maestro, slo_s 30;" in start
    assert "predictor: local priors (ready, timeout_s 0.5); traces: " in start
    assert len(changes) == 2 and "node0" in changes[0] and changes[0].endswith("is down (a call to it failed)")
    assert changes[1].endswith("is up (its /metrics answers)")


@pytest.fixture
def bare_directory(tmp_path, monkeypatch):
    """The gateway started in an empty directory with no MLFLOW_TRACKING_URI: `maestro serve`'s default store is
    ./mlruns/mlflow.db there."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_registry_uri_without_its_store_is_one_line_naming_both_and_writes_nothing(bare_directory, capsys):
    with pytest.raises(ModelNotFound) as refused:
        load_model(CHAMPION)
    message = str(refused.value)
    assert "\n" not in message and CHAMPION in message and "sqlite:///mlruns/mlflow.db does not exist" in message
    config = bare_directory / "gw.json"
    config.write_text(
        json.dumps({"nodes": [{"name": "n", "url": "http://127.0.0.1:9"}], "predictor": {"model": CHAMPION}})
    )
    assert main(["gateway", "--config", str(config)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"maestro gateway: gateway config predictor.model {CHAMPION}: the MLflow store")
    assert sorted(p.name for p in bare_directory.iterdir()) == ["gw.json"]  # no mlflow.db, no mlruns/


@pytest.mark.slow
def test_a_registry_uri_loads_from_maestro_serves_default_store(bare_directory, tmp_path_factory, monkeypatch):
    from tests.predictor_service.servers import registered_store

    directory = train(200, use_embedding=False).save(tmp_path_factory.mktemp("model") / "predictor")
    registered_store(bare_directory / "mlruns", [directory])  # ./mlruns/mlflow.db: the default store from here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # (MLflow sets it when its URI is set)
    predictor, version = load_model(CHAMPION)
    assert version == "1" and predictor.model is not None
    with pytest.raises(ModelNotFound, match="models:/stage-length@nobody: not loadable from the MLflow store sqlite"):
        load_model("models:/stage-length@nobody")
