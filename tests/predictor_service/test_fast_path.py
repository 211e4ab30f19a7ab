"""The service's hot path: TwoStageModel.predict feeds LightGBM one float matrix instead of pandas frames.

It must give exactly what LightGBM's own pandas conversion gives, unseen categories included.
"""

import numpy as np
import pytest

from maestro.contract import StageTrace
from pipelines.boosters import as_matrix, raw_score
from pipelines.predictor import Predictor


def test_matrix_path_equals_lightgbm_pandas_path(model_dir, sample_records):
    predictor = Predictor.load(model_dir)
    stages = [StageTrace.model_validate(r) for r in sample_records[:100]]
    stages += [stages[0].model_copy(update={"role": "unseen", "app": "new-app", "model": "other"})]
    X = predictor.featurizer.transform(stages)[predictor.model.feature_names]  # the columns the model reads
    booster = predictor.model.regressor_.booster
    matrix = as_matrix(X, booster.pandas_categorical)
    classifier = predictor.model.classifier_
    np.testing.assert_array_equal(classifier.predict(matrix), classifier.predict(X))
    X2 = X.assign(p_tool=0.5)
    np.testing.assert_array_equal(booster.predict(np.column_stack([matrix, np.full(len(X), 0.5)])), booster.predict(X2))
    shuffled = X.assign(role=X["role"].cat.reorder_categories(list(reversed(X["role"].cat.categories))))
    np.testing.assert_array_equal(as_matrix(shuffled, booster.pandas_categorical), matrix)


def test_featurizer_matrix_equals_the_frame_path(model_dir, sample_records):
    """Predictor.predict builds its matrix without pandas; it must match transform() → as_matrix,
    unseen categories and a stage with missing structure included, and give the same answers."""
    predictor = Predictor.load(model_dir)
    stages = [StageTrace.model_validate(r) for r in sample_records[:100]]
    stages += [
        stages[0].model_copy(
            update={"role": "unseen", "app": None, "model": "other", "interactive": None, "stage_id": "extra"}
        )
    ]
    model = predictor.model
    X = predictor.featurizer.transform(stages)[model.feature_names]  # the columns the model reads
    matrix, roles = predictor.featurizer.matrix(stages, model.feature_names)
    np.testing.assert_array_equal(matrix, as_matrix(X, model.regressor_.booster.pandas_categorical))
    assert roles == [str(r) for r in X["role"]] and roles[-1] == "unknown"
    by_frame, by_matrix = model.predict(X), model.predict_matrix(matrix, roles)
    for key in by_frame:
        np.testing.assert_array_equal(by_matrix[key], by_frame[key])
    raw = raw_score(model.classifier_, matrix)  # the isotonic step without sklearn's checks: the same
    np.testing.assert_array_equal(by_matrix["p_tool"], model.calibrator_.predict(raw))


def test_matrix_refuses_a_model_from_another_featurizer(model_dir, sample_records):
    predictor = Predictor.load(model_dir)
    stage = StageTrace.model_validate(sample_records[0])
    with pytest.raises(ValueError, match="no_such_feature"):
        predictor.featurizer.matrix([stage], [*predictor.model.feature_names, "no_such_feature"])
