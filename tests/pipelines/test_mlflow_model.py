"""What `dvc repro` registers, as MLflow's users expect it: a models-from-code pyfunc with a signature, an input
example and its code; the whole recipe as parameters; the traces as dataset inputs; metrics on the logged model;
and `mlflow models serve -m models:/stage-length@champion` answering /invocations."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from pipelines.registry import INPUT_EXAMPLE
from predictor_service.local_server import free_port

pytestmark = pytest.mark.slow
CHAMPION = "models:/stage-length@champion"


def store(clone: Path) -> str:
    return f"sqlite:///{clone}/mlruns/mlflow.db"


@pytest.fixture(scope="module")
def client(reproduced):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=store(reproduced), registry_uri=store(reproduced))


@pytest.fixture(scope="module")
def champion(client):
    return client.get_model_version_by_alias("stage-length", "champion")


def test_the_run_logs_every_parameter_and_the_traces_as_datasets(client, champion):
    run = client.get_run(champion.run_id)
    params = run.data.params
    assert params["train.loss"] == "pinball" and params["train.calibration"] == "sigmoid"
    assert params["train.reserve_method"] == "conformal" and params["featurize.embedding"] == "static"
    assert params["featurize.use_embedding"] == "True" and params["collect.source"] == "data/traces/sample.jsonl"
    assert params["train.folds"] == "3" and params["register.promote"] == "auto"
    inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"traces", "traces-test"}
    contexts = {name: {t.key: t.value for t in d.tags}["mlflow.data.context"] for name, d in inputs.items()}
    assert contexts == {"traces": "training", "traces-test": "evaluation"}
    profile = {name: json.loads(d.dataset.profile)["num_rows"] for name, d in inputs.items()}
    assert 0 < profile["traces-test"] < profile["traces"]
    assert json.loads(inputs["traces"].dataset.source)["uri"].endswith("data/traces/sample.jsonl")


def test_the_metrics_belong_to_the_logged_model_and_its_test_data(client, champion):
    model = client.get_logged_model(champion.source.removeprefix("models:/"))  # MLflow 3: models:/<model_id>
    metrics = {m.key: m for m in model.metrics}
    assert metrics["model.auc"].value > 0.8 and metrics["model.auc"].dataset_name == "traces-test"
    assert metrics["workflow.without_history.tau_calls"].value > 0.3  # the workflow model's figures beside them
    assert model.params["train.loss"] == "pinball"


def test_the_model_is_code_with_a_signature_and_an_example(client, champion):
    from mlflow.models import Model

    logged = client.get_logged_model(champion.source.removeprefix("models:/"))
    info = Model.load(str(Path(urlsplit(logged.artifact_location).path) / "MLmodel"))  # file store: no global URI
    flavor = info.flavors["python_function"]
    assert flavor["loader_module"] == "mlflow.pyfunc.loaders.code_model" and flavor["code"] == "code"
    assert info.signature.inputs.input_names()[:4] == ["workflow_id", "stage_id", "role", "prompt"]
    assert {"tokens_reserve", "wf_remaining_tokens_upper"} <= set(info.signature.outputs.input_names())
    assert info.saved_input_example_info["type"] == "dataframe"


LOAD_WITHOUT_THE_REPO = """
import sys
sys.meta_path = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.path = [p for p in sys.path if p not in ("", {repo!r})]
import json, mlflow, pandas as pd
model = mlflow.pyfunc.load_model({uri!r})
answers = model.predict(pd.DataFrame(json.loads({example!r})))
print(answers["tokens_pred"].tolist())
print(json.dumps(answers["wf_fallback_level"].tolist()))
print(sys.modules["pipelines"].__file__)
"""


def test_the_model_loads_where_the_repository_is_not_installed(reproduced, tmp_path):
    """The editable install's finder and the repository taken off the import path: pipelines/ comes from the
    model's own code (code_paths)."""
    example = INPUT_EXAMPLE.to_json(orient="records")
    script = LOAD_WITHOUT_THE_REPO.format(repo=str(Path(__file__).resolve().parents[2]), uri=CHAMPION, example=example)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": store(reproduced),
        "MLFLOW_REGISTRY_URI": store(reproduced),
        "PYTHONPATH": "",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    predictions, levels, module = done.stdout.strip().splitlines()[-3:]
    assert len(json.loads(predictions)) == len(INPUT_EXAMPLE)
    assert json.loads(levels) == ["app"] * len(INPUT_EXAMPLE)  # the logged artifact holds the workflow model
    assert "/code/pipelines/" in module, module


def test_mlflow_models_serve_answers_invocations(reproduced, tmp_path):
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": store(reproduced),
        "MLFLOW_REGISTRY_URI": store(reproduced),
        "PATH": f"{mlflow.parent}:{os.environ['PATH']}",
    }  # it starts `uvicorn` from PATH, as in an active venv
    with open(tmp_path / "serve.log", "wb") as log:
        server = subprocess.Popen(
            [
                str(mlflow),
                "models",
                "serve",
                "-m",
                CHAMPION,
                "--env-manager",
                "local",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until_up(f"http://127.0.0.1:{port}/ping", server, tmp_path / "serve.log")
        sparse = {"workflow_id": "w-2", "stage_id": "fix", "role": "coder", "prompt": "Fix the failing test."}
        records = json.loads(INPUT_EXAMPLE.to_json(orient="records")) + [sparse]  # optional fields left out
        answer = httpx.post(f"http://127.0.0.1:{port}/invocations", json={"dataframe_records": records}, timeout=60)
        assert answer.status_code == 200, answer.text
        predictions = answer.json()["predictions"]
        assert [p["stage_id"] for p in predictions] == ["plan", "flights", "fix"]
        assert all(p["tokens_reserve"] >= p["tokens_pred"] > 0 for p in predictions)
        missing = httpx.post(
            f"http://127.0.0.1:{port}/invocations",
            json={"dataframe_records": [{"workflow_id": "w", "stage_id": "s"}]},
            timeout=60,
        )
        assert missing.status_code == 400 and "role" in missing.text  # the signature names what is missing
    finally:
        stop(server)


def stop(server: subprocess.Popen) -> None:
    """SIGTERM the server's process group (its workers too), SIGKILL what is left after 30 s."""
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)


def wait_until_up(url: str, server: subprocess.Popen, log: Path, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, f"mlflow models serve exited: {log.read_text()[-3000:]}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not up after {timeout_s} s: {log.read_text()[-3000:]}")
