"""One row through the boosters in native code (pipelines.row_walker): LightGBM's floats exactly, for every kind of
split it packs, saved and loaded with the predictor by default, and LightGBM's answers where it cannot be used."""

import json
import logging
import shutil
from dataclasses import replace

import lightgbm as lgb
import numpy as np
import pytest

from maestro.contract import StageTrace
from pipelines import row_walker
from pipelines.boosters import RowPredictor
from pipelines.features import FeaturizerConfig
from pipelines.history import without_labels
from pipelines.model import ModelConfig
from pipelines.predictor import Predictor
from pipelines.synth import generate
from pipelines.workflow_remaining import WorkflowConfig

if shutil.which("gcc") is None:
    pytest.skip("no gcc to build the walker with", allow_module_level=True)

MODEL = ModelConfig(
    folds=3,
    regressor_bags=2,
    classifier=dict(n_estimators=30, learning_rate=0.1),
    regressor=dict(n_estimators=60, learning_rate=0.1, extra_trees=True),
    quantile=dict(n_estimators=30, learning_rate=0.1),
)
WORKFLOW = WorkflowConfig(folds=3, booster=dict(n_estimators=20, learning_rate=0.1, num_leaves=7))


def rows_to_try(rng: np.random.Generator) -> np.ndarray:
    """Rows with every kind of value a split treats apart: NaN, zero, within 1e-35 of zero, negative and unseen
    categories, values far outside training's."""
    X = rng.normal(size=(400, 6))
    X[:, 0] = rng.integers(0, 40, len(X))  # categorical: 40 categories, two words of bitset
    X[rng.random(X.shape) < 0.1] = np.nan
    X[rng.random(len(X)) < 0.3, 3] = 0.0
    odd = rng.choice([np.nan, 0.0, 1e-40, -1e-40, -1.0, -3.0, 45.0, 1e9, -1e9], size=(400, 6))
    return np.vstack([X, np.where(rng.random((400, 6)) < 0.3, odd, X)])


@pytest.mark.parametrize(
    "params",
    [
        {"objective": "quantile", "alpha": 0.6},
        {"objective": "regression", "zero_as_missing": True},
        {"objective": "binary", "sigmoid": 0.7},
        {"objective": "binary", "use_missing": False, "num_leaves": 63},
    ],
)
def test_one_row_is_lightgbms_float(params, tmp_path):
    rng = np.random.default_rng(0)
    X = rows_to_try(rng)[:400]
    y = np.nan_to_num(X[:, 1]) + (X[:, 0] % 3 == 0) + rng.normal(scale=0.1, size=len(X))
    y = (y > 0.5).astype(float) if params["objective"] == "binary" else y
    dataset = lgb.Dataset(X, y, categorical_feature=[0], params={"min_data_per_group": 5, "cat_smooth": 1})
    booster = lgb.train({**params, "verbosity": -1, "min_data_in_leaf": 5}, dataset, num_boost_round=37)
    library = row_walker.load_library(row_walker.build_library(tmp_path))
    walker = row_walker.RowWalker(library, row_walker.pack(booster), RowPredictor(booster))
    lightgbm = RowPredictor(booster)
    for row in rows_to_try(np.random.default_rng(1)):
        np.testing.assert_array_equal(walker(row[None, :]), lightgbm(row[None, :]))
    np.testing.assert_array_equal(walker(X[:5]), booster.predict(X[:5]))  # a batch: LightGBM's


def test_a_booster_it_cannot_walk_is_not_packed():
    X, y = np.random.default_rng(0).normal(size=(200, 3)), np.arange(200.0)
    assert row_walker.pack(lgb.train({"objective": "poisson", "verbosity": -1}, lgb.Dataset(X, y), 5)) is None


@pytest.fixture(scope="module")
def stages():
    return [StageTrace.model_validate(s) for s in generate(900, seed=8)]


@pytest.fixture(scope="module")
def saved(stages, tmp_path_factory):
    """A trained predictor (LightGBM's boosters) and the directory it was saved to, with the walker (the default)."""
    predictor = Predictor.train(stages[:600], FeaturizerConfig(use_embedding=False), MODEL, workflow_config=WORKFLOW)
    return predictor, predictor.save(tmp_path_factory.mktemp("predictor"))


def answers(predictor: Predictor, stages: list[StageTrace]) -> list[dict]:
    return [a.to_dict() for a in predictor.predict(stages)]


def walkers(predictor: Predictor) -> list:
    rows = predictor.model._rows
    flow = [r for pair in predictor.workflow._rows.values() for r in pair]
    return [rows["classifier"], rows["upper"], *rows["regressors"], *flow]


def test_the_loaded_predictor_walks_one_row_with_lightgbms_answers(saved, stages):
    trained, directory = saved
    loaded = Predictor.load(directory)
    assert all(isinstance(r, row_walker.RowWalker) for r in walkers(loaded))
    test = [s.model_copy() for s in stages[600:]]
    for batch in (test, [without_labels(s) for s in test]):
        assert answers(loaded, batch) == answers(trained, batch)
        assert [answers(loaded, [s]) for s in batch] == [answers(trained, [s]) for s in batch]


def load_with_warning(directory, caplog) -> Predictor:
    with caplog.at_level(logging.WARNING, logger=row_walker.__name__):
        predictor = Predictor.load(directory)
    assert not any(isinstance(r, row_walker.RowWalker) for r in walkers(predictor))
    return predictor


def test_a_walker_built_elsewhere_changed_or_missing_is_not_loaded(saved, stages, tmp_path, caplog):
    trained, directory = saved
    copy = shutil.copytree(directory, tmp_path / "copy")
    manifest = copy / row_walker.DIRECTORY / row_walker.MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "machine": "riscv64"}))
    assert answers(load_with_warning(copy, caplog), stages[600:700]) == answers(trained, stages[600:700])
    assert "riscv64" in caplog.text
    shutil.copy(directory / row_walker.DIRECTORY / row_walker.MANIFEST, manifest)
    arrays = copy / row_walker.DIRECTORY / row_walker.ARRAYS
    arrays.write_bytes(arrays.read_bytes()[:-10])
    load_with_warning(copy, caplog)
    assert "changed after it was built" in caplog.text
    arrays.unlink()
    load_with_warning(copy, caplog)
    assert "missing" in caplog.text


def test_a_walker_of_another_predictor_is_not_loaded(saved, stages, tmp_path, caplog):
    _, directory = saved
    other = Predictor.train(stages[:500], FeaturizerConfig(use_embedding=False), replace(MODEL, row_walker=False))
    other = other.save(tmp_path / "other")
    assert not (other / row_walker.DIRECTORY).exists()
    shutil.copytree(directory / row_walker.DIRECTORY, other / row_walker.DIRECTORY)
    load_with_warning(other, caplog)
    assert "other predictor files" in caplog.text


def test_without_gcc_the_predictor_saves_and_lightgbm_answers(saved, stages, tmp_path, caplog, monkeypatch):
    trained, _ = saved
    monkeypatch.setattr(row_walker.shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger=row_walker.__name__):
        directory = trained.save(tmp_path / "plain")
    assert "no gcc" in caplog.text and not (directory / row_walker.DIRECTORY).exists()
    loaded = Predictor.load(directory)
    assert isinstance(loaded.model._rows["regressors"][0], RowPredictor)
    assert [answers(loaded, [s]) for s in stages[600:650]] == [answers(trained, [s]) for s in stages[600:650]]
