"""Behaviour on real multi-agent traces (../shared/data/dev-traces): the predictor must beat the
per-role median on workflows it never saw, and react to what the prompt asks for."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from maestro.contract import read_traces
from pipelines.featurize import featurizer_config, grouped_split
from pipelines.history import without_labels
from pipelines.metrics import quality
from pipelines.params import load_params
from pipelines.predictor import Predictor, label_frame
from pipelines.row_walker import RowWalker
from pipelines.train import model_config

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(request):
    """The default recipe (params.yaml) trained on a grouped split of the dev traces: train, test, predictor."""
    path = request.getfixturevalue("dev_traces")
    stages = read_traces(path).stages
    train_idx, test_idx = grouped_split(stages, 0.25, seed=0)
    train, test = [stages[i] for i in train_idx], [stages[i] for i in test_idx]
    params = REPO / "params.yaml"
    predictor = Predictor.train(
        train, featurizer_config(load_params("featurize", params)), model_config(load_params("train", params))
    )
    return train, test, predictor


@pytest.fixture(scope="module")
def held_out(trained):
    train, test, predictor = trained
    frame = label_frame(test).assign(
        **{k: [getattr(p, k) for p in predictor.predict(test)] for k in ("p_tool", "tokens_pred", "tokens_reserve")}
    )
    role_median = label_frame(train).groupby("role")["tokens"].median()
    baseline = frame.assign(tokens_pred=frame["role"].map(role_median).fillna(label_frame(train)["tokens"].median()))
    return test, frame, baseline


def test_beats_the_per_role_median_on_unseen_workflows(held_out):
    _, frame, baseline = held_out
    ours, theirs = quality(frame), quality(baseline.assign(tokens_reserve=baseline["tokens_pred"]))
    assert ours["mae"] < 0.85 * theirs["mae"]
    assert ours["kendall_tau"] > 0.45


def test_tool_calls_are_recognised_and_predicted_short(held_out):
    _, frame, _ = held_out
    assert quality(frame)["auc"] > 0.85
    tool, text = frame[frame["is_tool"]], frame[~frame["is_tool"]]
    assert tool["tokens_pred"].median() < 0.5 * text["tokens_pred"].median()


def test_one_line_instructions_are_predicted_shorter_than_coding_phases(held_out):
    """ChatDev phases that may end with a one-line `<INFO>` answer vs phases that write whole files."""
    test, frame, _ = held_out
    tails = [s.prompt_text()[-400:] for s in test]
    one_line = np.array(["only one line" in t for t in tails])
    coding = np.array(["CODE\n```" in t for t in tails])
    assert one_line.any() and coding.any()
    actual = frame["tokens"][one_line].median() / frame["tokens"][coding].median()
    predicted = frame["tokens_pred"][one_line].median() / frame["tokens_pred"][coding].median()
    assert actual < 0.6 and predicted < 0.6


def test_saved_it_answers_each_stage_alone_as_lightgbm_does(trained, tmp_path):
    """Saved and loaded, the default recipe answers one stage through the row walker (gcc, pipelines.row_walker):
    every test stage's answer is the trained predictor's (LightGBM's single-row API), labels kept and stripped."""
    _, test, predictor = trained
    loaded = Predictor.load(predictor.save(tmp_path / "predictor"))
    walked = isinstance(loaded.model._rows["regressors"][0], RowWalker)
    assert walked or shutil.which("gcc") is None
    for stages in (test, [without_labels(s) for s in test]):
        assert [loaded.predict([s]) for s in stages] == [predictor.predict([s]) for s in stages]
