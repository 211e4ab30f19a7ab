"""The boosters compiled to native code (pipelines.compiled_trees): saved with the predictor when asked, loaded
with it, the same answers as LightGBM's, and LightGBM's answers where a library cannot be used."""

import json
import logging
import shutil
from dataclasses import replace

import numpy as np
import pytest

from maestro.contract import StageTrace
from pipelines import compiled_trees
from pipelines.batch_features import StageInputs
from pipelines.boosters import RowPredictor
from pipelines.features import FeaturizerConfig
from pipelines.history import without_labels
from pipelines.model import ModelConfig
from pipelines.predictor import Predictor
from pipelines.synth import generate
from pipelines.workflow_features import so_far_columns
from pipelines.workflow_remaining import WorkflowConfig

pytest.importorskip("tl2cgen")
if shutil.which("gcc") is None:
    pytest.skip("no gcc to compile the boosters with", allow_module_level=True)

MODEL = ModelConfig(
    folds=3,
    regressor_bags=2,
    compile_trees=True,
    row_walker=False,  # one row through the compiled boosters too (with the walker, they answer batches alone)
    classifier=dict(n_estimators=30, learning_rate=0.1),
    regressor=dict(n_estimators=60, learning_rate=0.1, extra_trees=True),
    quantile=dict(n_estimators=30, learning_rate=0.1),
)
WORKFLOW = WorkflowConfig(folds=3, booster=dict(n_estimators=20, learning_rate=0.1, num_leaves=7))


@pytest.fixture(scope="module")
def stages():
    return [StageTrace.model_validate(s) for s in generate(900, seed=8)]


@pytest.fixture(scope="module")
def saved(stages, tmp_path_factory):
    """A trained predictor (LightGBM's boosters) and the directory it was saved to, compiled."""
    predictor = Predictor.train(stages[:600], FeaturizerConfig(use_embedding=False), MODEL, workflow_config=WORKFLOW)
    return predictor, predictor.save(tmp_path_factory.mktemp("predictor"))


def answers(predictor: Predictor, stages: list[StageTrace]) -> list[dict]:
    return [a.to_dict() for a in predictor.predict(stages)]


def test_the_compiled_boosters_answer_as_lightgbm_does(saved, stages):
    trained, directory = saved
    loaded = Predictor.load(directory)
    assert all(isinstance(r, compiled_trees.CompiledBooster) for r in loaded.model._rows["regressors"])
    assert all(isinstance(r, compiled_trees.CompiledBooster) for pair in loaded.workflow._rows.values() for r in pair)
    assert loaded.meta["compiled_trees"]["compile_s"] > 0
    test = [s.model_copy() for s in stages[600:]]
    for batch in (test, [without_labels(s) for s in test]):
        assert answers(loaded, batch) == answers(trained, batch)
        assert [answers(loaded, [s]) for s in batch[:40]] == [answers(trained, [s]) for s in batch[:40]]


def test_each_compiled_booster_gives_lightgbms_floats_exactly(saved, stages):
    trained, directory = saved
    loaded = Predictor.load(directory)
    matrix, _ = trained.featurizer.matrix(stages[600:], trained.model.feature_names)
    matrix = np.column_stack([matrix, np.linspace(0, 1, len(matrix))])  # p_tool, the regressors' last column
    matrix[::7, 3] = np.nan  # missing values go where LightGBM sends them
    for lightgbm, compiled in zip(trained.model._rows["regressors"], loaded.model._rows["regressors"]):
        np.testing.assert_array_equal(compiled(matrix), lightgbm(matrix))
        for row in matrix[:30]:
            np.testing.assert_array_equal(compiled(row[None, :]), lightgbm(row[None, :]))
    inputs = StageInputs(stages[600:], None)
    columns = {**inputs.columns, **so_far_columns(inputs.stages, inputs.ids)}
    flow = np.column_stack(
        [
            trained.workflow.encoder_.columns_matrix(columns, len(stages) - 600),
            trained.workflow.lexical_.score(inputs.texts),
        ]
    )
    flow[::5, 0] = np.nan
    for name, pair in trained.workflow._rows.items():
        for lightgbm, compiled in zip(pair, loaded.workflow._rows[name]):
            np.testing.assert_array_equal(compiled(flow), lightgbm(flow))
            for row in flow[:30]:
                np.testing.assert_array_equal(compiled(row[None, :]), lightgbm(row[None, :]))


def load_with_warning(directory, caplog) -> Predictor:
    with caplog.at_level(logging.WARNING, logger=compiled_trees.__name__):
        predictor = Predictor.load(directory)
    assert all(isinstance(r, RowPredictor) for r in predictor.model._rows["regressors"])
    assert all(isinstance(r, RowPredictor) for pair in predictor.workflow._rows.values() for r in pair)
    return predictor


def test_a_library_built_on_another_machine_is_not_loaded(saved, stages, tmp_path, caplog):
    trained, directory = saved
    copy = shutil.copytree(directory, tmp_path / "copy")
    manifest = copy / compiled_trees.DIRECTORY / compiled_trees.MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "machine": "riscv64"}))
    predictor = load_with_warning(copy, caplog)
    assert "riscv64" in caplog.text
    assert answers(predictor, stages[600:700]) == answers(trained, stages[600:700])


def test_a_changed_or_missing_library_is_not_loaded(saved, tmp_path, caplog):
    _, directory = saved
    copy = shutil.copytree(directory, tmp_path / "copy")
    (copy / compiled_trees.DIRECTORY / "regressor_1.so").write_bytes(b"not a library")
    load_with_warning(copy, caplog)
    assert "changed after it was built" in caplog.text
    (copy / compiled_trees.DIRECTORY / "regressor_1.so").unlink()
    load_with_warning(copy, caplog)
    assert "missing" in caplog.text


def test_libraries_of_another_predictor_are_not_loaded(saved, stages, tmp_path, caplog):
    trained, directory = saved
    other = Predictor.train(
        stages[:500], FeaturizerConfig(use_embedding=False), replace(MODEL, compile_trees=False)
    ).save(tmp_path / "other")
    assert not (other / compiled_trees.DIRECTORY).exists()
    shutil.copytree(directory / compiled_trees.DIRECTORY, other / compiled_trees.DIRECTORY)
    load_with_warning(other, caplog)
    assert "other predictor files" in caplog.text
