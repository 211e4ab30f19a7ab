"""`maestro retrain` on real parts: gateway-format traces → `dvc exp run` in a clone of this repository → the guard →
a real `bentoml serve` reloaded, whose next answers come from the new version; triggered by coverage drift."""

import json
import time
from pathlib import Path

import httpx
import pytest

from maestro.cli import main as maestro
from maestro.contract import StageTrace
from pipelines.features import FeaturizerConfig
from pipelines.model import ModelConfig
from pipelines.predictor import Predictor
from pipelines.synth import generate
from predictor_service.coverage import coverage_report
from predictor_service.deploy import DeployConfig
from predictor_service.online import CorrectionConfig, OnlineCorrection
from predictor_service.retrain import RetrainConfig, resolve_nodes, stage_traces, why_due
from serving.gateway.traces import TraceWriter
from tests.pipelines.clone import run, small_clone
from tests.predictor_service.servers import champion_server, registered_store

ADMIN_TOKEN = "test-admin-token-retrain"
# The tests' fast recipe (tests/predictor_service/conftest.py FAST_MODEL), without the embedding, as params.yaml
# sections.
FAST_PARAMS = {
    "featurize": {"use_embedding": False},
    "train": {
        "folds": 3,
        "regressor_bags": 1,
        "classifier": {"n_estimators": 40, "learning_rate": 0.1},
        "regressor": {"n_estimators": 80, "learning_rate": 0.1},
    },
}


def write_gateway_traces(directory: Path, records: list[dict], arrival_s: float) -> None:
    """Stages as the gateway writes them (its TraceWriter, rotating files; completed calls carry the labels)."""
    writer = TraceWriter(directory, rotate_lines=200)
    for i, record in enumerate(records):
        writer.write(
            {
                **record,
                "arrival_s": arrival_s + i * 0.01,
                "queue_s": 0.002,
                "node": "vllm-0",
                "outcome": "completed",
                "attempts": 1,
            }
        )
    writer.close()


# ---- the pieces, without servers ------------------------------------------------------------------------------
def test_only_stages_that_arrived_after_the_champion_are_staged(tmp_path):
    since = time.time() - 60
    records = generate(60, seed=1)
    write_gateway_traces(tmp_path / "gw", records[:20], since - 3600)  # before the champion
    write_gateway_traces(tmp_path / "gw", records[20:], since + 1)
    with (tmp_path / "gw" / "gateway-z.jsonl").open("a") as handle:
        handle.write(
            '{"workflow_id": "w", "stage_id": "s", "outcome": "refused", "arrival_s": %f}\nnot json\n' % (since + 2)
        )
    staged = tmp_path / "repo" / "data/traces/retrain"
    assert stage_traces(tmp_path / "gw", since, staged) == len(records) - 20  # refused and broken: not finished
    lines = (staged / "traces.jsonl").read_text().splitlines()
    assert len(lines) == len(records) - 20 + 2  # both still copied: `collect` reports the broken one
    assert stage_traces(tmp_path / "gw", None, staged) == len(records)  # no champion: everything


def test_when_a_retrain_is_due(tmp_path):
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    target = DeployConfig(nodes=("http://127.0.0.1:1",))

    def config(**kwargs) -> RetrainConfig:
        return RetrainConfig(str(tmp_path), target, repo=str(tmp_path), **kwargs)

    assert why_due(config(), 0.5, {}).startswith("started without a trigger")
    assert why_due(config(on_drift=True), 100.0, {}) is None
    assert "drifts on http://n" in why_due(config(on_drift=True), 0.5, {"http://n": ["a/b/none"]})
    assert why_due(config(on_drift=True, max_age_h=24), 23.0, {}) is None
    assert "25.0 h old" in why_due(config(on_drift=True, max_age_h=24), 25.0, {})
    with pytest.raises(FileNotFoundError, match="--repo .* no dvc.yaml"):
        RetrainConfig(str(tmp_path), target, repo=str(tmp_path / "elsewhere"))
    with pytest.raises(ValueError, match="--max-age-h"):
        config(max_age_h=0)


def test_a_headless_service_name_becomes_one_node_per_address():
    assert resolve_nodes(("http://127.0.0.1:3000",)) == ("http://127.0.0.1:3000",)
    assert "http://127.0.0.1:3000" in resolve_nodes(("http://localhost:3000",))


def test_coverage_reports_the_groups_past_their_bound():
    corrections = OnlineCorrection(CorrectionConfig(), alpha=0.05)
    group = ("travel", "planner", "none")
    for _ in range(60):  # every stage far above its reserve
        corrections.update("planner", 100, 5000, reserve_tokens=200, group=group)
    corrections.update("coder", 100, 90, reserve_tokens=200, group=("swe", "coder", "full"))
    report = coverage_report("3", corrections)
    assert [(g.app, g.role, g.history) for g in report.drifting] == [group]
    assert report.alpha == 0.05 and len(report.groups) == 2


# ---- end to end -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A tmp MLflow store whose champion (version 1) answers from per-role priors only, fitted when outputs ran four
    times longer: worse than a model of today's traces on every guarded metric, so the guard's verdict is certain."""
    root = tmp_path_factory.mktemp("mlflow")
    stages = [StageTrace.model_validate({**r, "output_tokens": 4 * r["output_tokens"]}) for r in generate(40, seed=11)]
    priors = Predictor.train(stages, FeaturizerConfig(use_embedding=False), ModelConfig())
    return registered_store(root, [priors.save(root / "priors" / "predictor")])


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    with champion_server(store, tmp_path_factory.mktemp("server"), ADMIN_TOKEN) as running:
        yield running


def retrain(capsys, store, server, repo: Path, traces: Path) -> tuple[int, dict]:
    code = maestro(
        [
            "retrain",
            "--traces",
            str(traces),
            "--nodes",
            server.url,
            "--repo",
            str(repo),
            "--on-drift",
            "--min-stages",
            "300",
            "--tracking-uri",
            store,
            "--admin-token",
            ADMIN_TOKEN,
        ]
    )
    captured = capsys.readouterr()
    assert "{" in captured.out, f"exit {code}: {captured.err[-3000:]}"
    return code, json.loads(captured.out[captured.out.index("{") : captured.out.rindex("}") + 1])


def predicted_version(server) -> str:
    stage = {"workflow_id": "probe", "stage_id": "0", "role": "planner", "prompt": "Plan a trip to Porto."}
    answer = httpx.post(f"{server.url}/predict", json={"stages": [stage]}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()[0]["model_version"]


def drive_coverage_drift(server, num_stages: int = 60) -> None:
    """Finished stages of one group, each far above any reserve: the group's share above it passes the bound."""
    stages = [
        {
            "workflow_id": f"drift-{i}",
            "stage_id": "0",
            "role": "planner",
            "app": "travel_planner",
            "prompt": "Plan a week in Japan.",
            "output_tokens": 60_000,
            "is_tool_call": False,
        }
        for i in range(num_stages)
    ]
    response = httpx.post(f"{server.url}/observe", json={"stages": stages}, timeout=60)
    assert response.status_code == 200, response.text


@pytest.mark.slow
def test_drift_retrains_on_gateway_traces_and_the_served_model_moves(store, server, tmp_path, capsys):
    repo = small_clone(tmp_path / "maestro", **FAST_PARAMS)
    traces = tmp_path / "gateway"
    records = generate(700, seed=5)
    write_gateway_traces(traces, records[:50], time.time() - 3 * 86400)  # before the champion: left out
    write_gateway_traces(traces, records[50:], time.time())
    assert predicted_version(server) == "1"

    code, result = retrain(capsys, store, server, repo, traces)
    assert (code, result["status"]) == (0, "not-due") and result["drifting"] == {}

    drive_coverage_drift(server)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert httpx.get(f"{server.url}/coverage", headers=admin).json()["groups"]
    code, result = retrain(capsys, store, server, repo, traces)
    assert code == 0, result
    assert result["status"] == "deployed" and result["version"] == "2" and result["passes_guard"]
    assert result["num_stages"] == len(records) - 50 and list(result["drifting"]) == [server.url]
    assert result["deployed"]["nodes"] == {server.url: "ok"}

    assert httpx.get(f"{server.url}/stats").json()["model_version"] == "2"
    assert predicted_version(server) == "2"  # the next answers come from the new version
    from mlflow import MlflowClient

    assert (
        str(
            MlflowClient(tracking_uri=store, registry_uri=store)
            .get_model_version_by_alias("stage-length", "champion")
            .version
        )
        == "2"
    )
    assert "retrain-" in run(["dvc", "exp", "list", "--name-only"], repo)  # each retrain is a DVC experiment

    code, result = retrain(capsys, store, server, repo, traces)  # the reload started coverage afresh
    assert (code, result["status"]) == (0, "not-due")
