"""A real `bentoml serve` on 127.0.0.1: predict, observe, deploy a second registered version under load, roll back."""

import threading
import time

import httpx
import pytest

from maestro.cli import main as maestro
from predictor_service.client import ClientConfig, PredictorClient, to_wire
from tests.predictor_service.servers import champion_server, registered_store

pytestmark = pytest.mark.slow
ADMIN_TOKEN = "test-admin-token"


@pytest.fixture(scope="module")
def store(tmp_path_factory, model_dir, priors_dir):
    """A tmp MLflow store: version 1 = the two-stage model (champion), version 2 = priors only."""
    return registered_store(tmp_path_factory.mktemp("mlflow"), [model_dir, priors_dir])


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    with champion_server(store, root, ADMIN_TOKEN) as running:
        running.trace_dir = root / "observed"
        yield running


class Load:
    """Clients posting /predict back to back on threads; records every status and model version seen."""

    def __init__(self, url: str, stages: list[dict], num_threads: int = 4):
        self.url, self.stages, self.stop = url, stages, threading.Event()
        self.statuses: list[int] = []
        self.versions: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(num_threads)]

    def _run(self, offset: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            i = offset
            while not self.stop.is_set():
                try:
                    response = http.post("/predict", json={"stages": [self.stages[i % len(self.stages)]]})
                    self.statuses.append(response.status_code)
                    if response.status_code == 200:
                        self.versions.append(response.json()[0]["model_version"])
                except httpx.HTTPError:
                    self.statuses.append(-1)
                i += 1

    def __enter__(self) -> "Load":
        for thread in self.threads:
            thread.start()
        time.sleep(1.0)
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(1.0)
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


def deploy(server, store, *flags) -> int:
    return maestro(
        [
            "deploy",
            "--alias",
            "champion",
            "--nodes",
            server.url,
            "--tracking-uri",
            store,
            "--admin-token",
            ADMIN_TOKEN,
            *flags,
        ]
    )


def test_serve_predict_observe_deploy_and_roll_back_without_failed_requests(server, store, sample_records):
    stages = [to_wire(r) for r in sample_records[:50]]
    with PredictorClient(ClientConfig(url=server.url, timeout_s=10)) as client:
        answers = client.predict(stages[:5] + [dict(stages[0], role="never-seen-role")])
        assert [a.model_version for a in answers] == ["1"] * 6 and answers[-1].fallback_level == "global"
        assert {a.wf_fallback_level for a in answers} == {"app"}  # the registered model's workflow/ came with it
        assert client.observe(sample_records[:10])
    assert any(server.trace_dir.glob("*.jsonl"))
    assert "maestro_predictor_stages" in httpx.get(f"{server.url}/metrics").text

    with Load(server.url, stages) as load:
        assert deploy(server, store, "--model-version", "2") == 0
    assert httpx.get(f"{server.url}/stats").json()["model_version"] == "2"
    assert set(load.statuses) == {200}, f"failed requests during deploy: {sorted(set(load.statuses))}"
    assert load.versions[0] == "1" and load.versions[-1] == "2"

    with Load(server.url, stages) as load:
        assert deploy(server, store, "--rollback") == 0
    assert httpx.get(f"{server.url}/stats").json()["model_version"] == "1"
    assert set(load.statuses) == {200} and load.versions[-1] == "1"


def test_deploy_of_a_missing_version_fails_and_leaves_the_node_serving(server, store, capsys):
    before = httpx.get(f"{server.url}/stats").json()["model_version"]
    anonymous = httpx.post(f"{server.url}/admin/reload", json={"model": "models:/stage-length/2"})
    assert anonymous.status_code == 401
    assert deploy(server, store, "--model-version", "99") == 2
    assert "deploy failed" in capsys.readouterr().out
    assert httpx.get(f"{server.url}/stats").json()["model_version"] == before


def serving(server) -> dict:
    return httpx.get(f"{server.url}/stats").json()


def alias_version(store) -> str:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store, registry_uri=store)
    return str(client.get_model_version_by_alias("stage-length", "champion").version)


def test_a_node_that_fails_undoes_the_rollout_and_the_alias_never_moves(server, store, capsys):
    """The first node takes version 2, the second does not answer: the first goes back to 1, the alias stays."""
    from predictor_service.local_server import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    before = serving(server)
    assert before["model_version"] == "1" and alias_version(store) == "1"
    code = maestro(
        [
            "deploy",
            "--alias",
            "champion",
            "--nodes",
            f"{server.url},{dead}",
            "--tracking-uri",
            store,
            "--admin-token",
            ADMIN_TOKEN,
            "--timeout-s",
            "5",
            "--model-version",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1 and f"deploy of version 2 failed: node {dead}: unreachable" in out
    after = serving(server)
    assert after["model_version"] == "1" and after["num_reloads"] == before["num_reloads"] + 2  # to 2, back to 1
    assert alias_version(store) == "1"


def test_an_alias_that_cannot_move_puts_the_nodes_back(server, store, capsys, tmp_path, monkeypatch):
    """Every node verified on version 2, then the registry refuses the alias move (read-only): nodes back on 1."""
    # MLflow makes the parent folders of a SQLite path, and takes an SQLite URI filename (`file:PATH`) for a relative
    # path: it would leave a folder named `file:` in the working directory.
    monkeypatch.chdir(tmp_path)
    read_only = store.replace("sqlite:///", "sqlite:///file:") + "?mode=ro&uri=true"
    before = serving(server)
    code = maestro(
        [
            "deploy",
            "--alias",
            "champion",
            "--nodes",
            server.url,
            "--tracking-uri",
            read_only,
            "--admin-token",
            ADMIN_TOKEN,
            "--model-version",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1 and "alias 'champion' could not be moved to version 2" in out and "readonly" in out
    after = serving(server)
    assert after["model_version"] == "1" and after["num_reloads"] == before["num_reloads"] + 2
    assert alias_version(store) == "1"
