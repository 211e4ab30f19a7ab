"""An app training never saw: the reserve level from app-held-out scores, the flag, and the own-turn features."""

import numpy as np
import pandas as pd
import pytest

from maestro.contract import StageTrace
from pipelines.features import UNKNOWN, FeaturizerConfig
from pipelines.model import ModelConfig
from pipelines.new_app import NEW_APP, NewAppLevels, as_unseen, levels_of
from pipelines.predictor import Predictor
from pipelines.synth import generate
from pipelines.turn_features import OWN_TURN_COLUMNS, own_turn_features

FAST_MODEL = ModelConfig(
    folds=3,
    classifier=dict(n_estimators=40, learning_rate=0.1),
    regressor=dict(n_estimators=80, learning_rate=0.1),
    quantile=dict(n_estimators=80, learning_rate=0.1, num_leaves=15, min_child_samples=20),
)
NO_EMBEDDING = FeaturizerConfig(use_embedding=False)


@pytest.fixture(scope="module")
def stages():
    return [StageTrace.model_validate(s) for s in generate(1500, seed=5)]


@pytest.fixture(scope="module")
def held_out_app(stages):
    return sorted({s.app for s in stages})[0]


@pytest.fixture(scope="module")
def predictor(stages, held_out_app):
    return Predictor.train([s for s in stages if s.app != held_out_app], NO_EMBEDDING, FAST_MODEL)


def test_the_level_is_the_worst_left_out_apps_in_each_condition(predictor, stages, held_out_app):
    levels = predictor.new_app
    trained_apps = {s.app for s in stages} - {held_out_app}
    assert set(levels.by_app) == trained_apps and levels.num_apps >= 2
    for history, level in levels.levels.items():
        assert level == max(by[history] for by in levels.by_app.values() if history in by)
    assert predictor.meta["new_app"]["levels"].keys() == levels.levels.keys()


def test_an_app_never_seen_is_flagged_and_gets_the_new_app_level(predictor, stages, held_out_app):
    new = [s for s in stages if s.app == held_out_app][:60]
    answers = predictor.predict(new)
    assert {a.fallback_level for a in answers} == {NEW_APP}
    # the same stages named after no app: the model's global answer, without the new-app level
    anonymous = predictor.predict([s.model_copy(update={"app": None}) for s in new])
    names = predictor.model.feature_names
    columns = names + [c for c in predictor.new_app.columns if c not in names]
    matrix, roles = predictor.featurizer.matrix(new, columns)
    out = predictor.model.predict_matrix(matrix[:, : len(names)], roles)
    bounds = predictor.new_app.log_bound(matrix, columns, out["p_tool"])  # the model's columns and the own turns
    assert set(predictor.new_app.columns) == set(columns) and not set(OWN_TURN_COLUMNS) & set(names)
    for answer, plain, bound, history in zip(answers, anonymous, bounds, out["history"]):
        expected = max(np.expm1(bound + predictor.new_app.level(history)), answer.tokens_pred)
        assert answer.tokens_reserve == int(np.ceil(expected))
        assert plain.fallback_level != NEW_APP


def test_seen_apps_keep_their_answers(predictor, stages, held_out_app):
    seen = [s for s in stages if s.app != held_out_app][:40]
    assert NEW_APP not in {a.fallback_level for a in predictor.predict(seen)}


def test_save_and_load_keep_the_level(predictor, stages, held_out_app, tmp_path):
    new = [s for s in stages if s.app == held_out_app][:20]
    loaded = Predictor.load(predictor.save(tmp_path / "p"))
    assert loaded.new_app == predictor.new_app
    assert loaded.predict(new) == predictor.predict(new)


def test_one_app_in_training_gives_no_level_but_the_answer_is_flagged(stages):
    apps = sorted({s.app for s in stages})
    one = Predictor.train([s for s in stages if s.app == apps[1]], NO_EMBEDDING, FAST_MODEL)
    assert one.new_app is None
    stage = next(s for s in stages if s.app == apps[0])
    (answer,) = one.predict([stage])
    (anonymous,) = one.predict([stage.model_copy(update={"app": None})])  # the model's own (global) reserve
    assert answer.fallback_level == NEW_APP and answer.tokens_reserve == anonymous.tokens_reserve


def test_levels_take_the_largest_finite_app_level():
    rng = np.random.default_rng(0)
    scores = pd.DataFrame(
        {
            "app": ["a"] * 100 + ["b"] * 100 + ["c"] * 5,
            "history": "full",
            "score": np.concatenate([rng.normal(0, 0.1, 100), rng.normal(1, 0.1, 100), [9.0] * 5]),
        }
    )
    levels = levels_of(scores, 0.05)
    assert set(levels.by_app) == {"a", "b"}  # five rows give no finite level at α = 0.05
    assert levels.levels["full"] == levels.by_app["b"]["full"] and 1.0 < levels.levels["full"] < 1.5
    assert levels.level("none") == levels.levels["full"]  # a condition no app was scored in: the largest
    assert levels_of(scores[scores.app == "c"], 0.05) is None


def test_unseen_view_marks_new_categories_and_the_app_unknown():
    categories = pd.CategoricalDtype(["a", "b", "r1", "r2", UNKNOWN])
    X = pd.DataFrame(
        {
            "app": pd.Categorical(["b", "b"], dtype=categories),
            "role": pd.Categorical(["r1", "r2"], dtype=categories),
            "n": [1.0, 2.0],
        }
    )
    seen = pd.DataFrame(
        {"app": pd.Categorical(["a"], dtype=categories), "role": pd.Categorical(["r1"], dtype=categories), "n": [0.0]}
    )
    out = as_unseen(X, seen)
    assert list(out["app"]) == [UNKNOWN, UNKNOWN] and list(out["role"]) == ["r1", UNKNOWN]
    assert list(out["n"]) == [1.0, 2.0] and list(X["app"]) == ["b", "b"]


def test_own_turns_are_read_from_a_chat_prompt_and_missing_from_plain_text():
    messages = [
        {"role": "system", "content": "x" * 50},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "a" * 30},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "result"},
        {"role": "assistant", "content": "b" * 90},
    ]
    features = own_turn_features(messages)
    assert features["own_text_turns"] == 2 and features["own_tool_turns"] == 1
    assert features["own_text_chars_last"] == 90 and features["own_text_chars_mean"] == 60
    assert features["own_text_chars_max"] == 90 and features["own_tool_chars_mean"] > 0
    assert all(np.isnan(v) for v in own_turn_features([]).values())


def test_new_app_levels_describe_as_plain_numbers():
    levels = NewAppLevels({"full": 0.123456}, {"a": {"full": 0.123456}})
    assert levels.describe() == {"levels": {"full": 0.1235}, "by_app": {"a": {"full": 0.1235}}}
