"""`maestro score`: predictions of labelled stages against the targets and the per-role baselines."""

import json

import numpy as np
import pandas as pd

from maestro.cli import main as maestro
from pipelines.commands import read_predictions
from pipelines.metrics import score_frames, scoring_frames


def _score(predictions, test, train, rho, alpha):
    return score_frames(scoring_frames(predictions, test, train, rho, alpha))


def _labels(n, seed, tool_share=0.3):
    rng = np.random.default_rng(seed)
    roles = rng.choice(["planner", "coder", "critic"], n)
    scale = pd.Series(roles).map({"planner": 50, "coder": 600, "critic": 200}).to_numpy()
    is_tool = rng.random(n) < tool_share
    tokens = np.where(is_tool, 30, rng.lognormal(np.log(scale), 0.6)).round().astype(int)
    return pd.DataFrame(
        {
            "workflow_id": [f"w{seed}-{i // 5}" for i in range(n)],
            "stage_id": [str(i % 5) for i in range(n)],
            "role": roles,
            "app": np.where(np.arange(n) % 2, "chat", "tools"),
            "tokens": tokens,
            "is_tool": is_tool,
        }
    )


def _predictions(test, tokens_pred, tokens_reserve, p_tool):
    return test[["workflow_id", "stage_id"]].assign(
        p_tool=p_tool, tokens_pred=tokens_pred, tokens_reserve=tokens_reserve
    )


def test_exact_predictions_meet_every_target_and_beat_the_baselines():
    train, test = _labels(600, 1), _labels(300, 2)
    exact = _predictions(test, test["tokens"], test["tokens"], test["is_tool"].astype(float))
    scores = _score(exact, test, train, rho=0.2, alpha=0.05)
    assert (
        scores["model"]["n"] == 300 and scores["model"]["under_rate"] == 0 and scores["model"]["over_reservation"] == 0
    )
    assert scores["ratios"]["mae_vs_role_median"] == 0 and scores["ratios"]["over_reservation_vs_role_p90"] == 0
    assert all(scores["targets"].values())
    assert scores["baselines"]["role_p90"]["under_rate"] > 0.05  # the p90 reserve misses about one in ten
    assert set(scores["by_app"]) == {"chat", "tools"} and scores["by_app"]["chat"]["model"]["n"] == 150


def test_a_reserve_below_the_actuals_misses_the_reserve_target():
    train, test = _labels(600, 1), _labels(300, 2)
    low = _predictions(test, test["tokens"], test["tokens"] * 0.5, test["is_tool"].astype(float))
    scores = _score(low, test, train, rho=0.2, alpha=0.05)
    assert scores["model"]["under_rate"] > 0.9 and scores["targets"]["under_rate"] is False


def test_without_tool_calls_auc_is_not_measurable_rather_than_failed():
    train, test = _labels(600, 1, tool_share=0), _labels(300, 2, tool_share=0)
    exact = _predictions(test, test["tokens"], test["tokens"], 0.01)
    scores = _score(exact, test, train, rho=0.2, alpha=0.05)
    assert scores["model"]["auc"] is None and scores["targets"]["auc"] is None


def test_only_predicted_stages_are_scored_and_baselines_use_the_same_stages():
    train, test = _labels(600, 1), _labels(300, 2)
    half = _predictions(test, test["tokens"], test["tokens"] * 2, 0.5).iloc[:100]
    scores = _score(half, test, train, rho=0.2, alpha=0.05)
    assert scores["model"]["n"] == 100 and scores["baselines"]["role_p90"]["n"] == 100


def test_bad_prediction_lines_are_reported_by_line_and_the_rest_read(tmp_path):
    good = {"workflow_id": "w", "stage_id": "0", "p_tool": 0.1, "tokens_pred": 10, "tokens_reserve": 20}
    lines = [
        json.dumps(good),
        "{broken",
        json.dumps({**good, "stage_id": 1, "tokens_reserve": None}),
        json.dumps(good),
        "[1, 2]",
        "",
        json.dumps({**good, "stage_id": 2, "tokens_pred": "many"}),
        json.dumps({**good, "stage_id": 3}),
    ]
    path = tmp_path / "pred.jsonl"
    path.write_text("\n".join(lines) + "\n")
    frame, errors = read_predictions(str(path))
    assert frame[["workflow_id", "stage_id"]].values.tolist() == [["w", "0"], ["w", "3"]]
    assert [e.split(": ", 1)[0] for e in errors] == [f"{path}:{n}" for n in (2, 3, 4, 5, 7)]
    assert "missing tokens_reserve" in errors[1] and "predicted twice" in errors[2]


def test_a_missing_file_is_named_without_a_traceback(tmp_path, capsys):
    missing = tmp_path / "nowhere.jsonl"
    assert maestro(["score", "--predictions", str(missing), "--traces", str(missing), "--train", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
