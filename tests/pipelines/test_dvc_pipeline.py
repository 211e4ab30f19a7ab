"""The real `dvc repro` and `dvc exp run` on a small synthetic sample, in a clone of this repo."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("repo") / "maestro"
    subprocess.run(["git", "clone", "-q", str(REPO), str(where)], check=True)
    params = yaml.safe_load((where / "params.yaml").read_text())
    params["sample"]["num_stages"] = 700
    params["train"]["folds"] = 3
    (where / "params.yaml").write_text(yaml.safe_dump(params))
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "small sample"], where)
    return where


def test_repro_trains_evaluates_and_registers_a_champion(clone):
    run(["dvc", "repro"], clone)
    metrics = json.loads((clone / "metrics.json").read_text())
    assert set(metrics) == {"with_history", "without_history"}  # the headline: one small table per condition
    for figures in metrics.values():
        assert figures["auc"] > 0.8 and figures["mae_vs_role_median"] < 1.0
    detail = json.loads((clone / "data/eval/metrics_detail.json").read_text())["with_history"]
    assert set(detail["baselines"]) == {"model_rho_reserve", "global_median", "role_median", "role_p90", "role_conformal", "single_stage"}
    registration = json.loads((clone / "data/eval/registration.json").read_text())
    assert str(registration["version"]) == "1" and registration["promoted"]
    for plot in ("calibration.png", "pred_vs_actual.png", "error_by_role.png", "reserve_tradeoff.png", "calibration.csv"):
        assert (clone / "data/eval" / plot).stat().st_size > 0
    assert "without_history.above_reserve" in run(["dvc", "metrics", "show"], clone)


def test_exp_run_changes_a_parameter_and_re_scores_the_champion(clone):
    run(["dvc", "exp", "run", "-S", "train.alpha=0.2"], clone)
    assert yaml.safe_load((clone / "params.yaml").read_text())["train"]["alpha"] == 0.2
    registration = json.loads((clone / "data/eval/registration.json").read_text())
    assert str(registration["version"]) == "2"
    assert registration["champion_metrics_on_this_test"]["n"] > 0  # champion re-scored on this test split
    shown = run(["dvc", "exp", "show", "--no-pager", "--csv"], clone)
    assert "0.2" in shown
