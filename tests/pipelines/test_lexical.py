import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import kendalltau
from sklearn.linear_model import Ridge
from sklearn.metrics import roc_auc_score

from maestro.contract import StageTrace, task_id
from pipelines.features import Featurizer, FeaturizerConfig
from pipelines.lexical import LEXICAL_COLUMNS, LexicalConfig, LexicalModel, bucket_ids, design_matrix
from pipelines.model import ModelConfig
from pipelines.predictor import Predictor
from pipelines.synth import generate

LEXICAL = FeaturizerConfig(use_embedding=False, lexical=LexicalConfig())
FAST_MODEL = ModelConfig(
    folds=3, classifier=dict(n_estimators=40, learning_rate=0.1), regressor=dict(n_estimators=80, learning_rate=0.1)
)


@pytest.fixture(scope="module")
def stages() -> list[StageTrace]:
    return [StageTrace.model_validate(s) for s in generate(1200, seed=11)]


def columns(stages: list[StageTrace]):
    texts = [s.prompt_text() for s in stages]
    tokens = np.array([s.output_tokens for s in stages])
    is_tool = np.array([bool(s.is_tool_call) for s in stages])
    return texts, tokens, is_tool, np.array([task_id(s) for s in stages])


def test_the_scores_rank_lengths_and_tool_calls_out_of_fold_on_synthetic_traces(stages):
    texts, tokens, is_tool, groups = columns(stages)
    model = LexicalModel().fit(texts, tokens, is_tool, groups)
    assert kendalltau(model.oof_[:, 0], tokens).statistic > 0.25
    assert roc_auc_score(is_tool, model.oof_[:, 1]) > 0.65
    order = np.random.default_rng(0).permutation(len(texts))  # labels no longer those of their texts
    shuffled = LexicalModel().fit(texts, tokens[order], is_tool[order], groups)
    assert abs(kendalltau(shuffled.oof_[:, 0], tokens[order]).statistic) < 0.1
    assert abs(roc_auc_score(is_tool[order], shuffled.oof_[:, 1]) - 0.5) < 0.07


def test_a_rows_out_of_fold_score_never_reads_its_own_tasks_labels(stages):
    texts, tokens, is_tool, groups = columns(stages)
    model = LexicalModel().fit(texts, tokens, is_tool, groups)
    task = groups == groups[0]
    changed = LexicalModel().fit(texts, np.where(task, tokens * 20, tokens), np.where(task, ~is_tool, is_tool), groups)
    np.testing.assert_array_equal(changed.oof_[task], model.oof_[task])
    assert not np.allclose(changed.oof_[~task], model.oof_[~task])  # the other folds' models did read them
    in_fold = model.score(texts)
    assert not np.allclose(in_fold[task], changed.score([t for t, m in zip(texts, task) if m]))
    assert np.mean(np.abs(in_fold[:, 0] - np.log1p(tokens))) < np.mean(np.abs(model.oof_[:, 0] - np.log1p(tokens)))


def test_a_score_is_its_design_rows_product_with_the_weights(stages):
    texts, tokens, is_tool, groups = columns(stages[:400])
    config = LexicalConfig(word_ngrams=2, num_buckets=2**12)
    model = LexicalModel(config).fit(texts, tokens, is_tool, groups)
    X = design_matrix(texts + ["", "ab"], config)
    np.testing.assert_allclose(model.score(texts + ["", "ab"]), X @ model.weights_ + model.bias_, rtol=1e-4, atol=1e-4)


def test_the_buckets_are_the_same_in_every_process():
    text = 'Tool result: {"status": "ok"} — résumé\nPlease answer in JSON.'
    code = (
        "from pipelines.lexical import LexicalConfig, bucket_ids; "
        f"print(bucket_ids({text!r}, LexicalConfig(word_ngrams=2)).tolist())"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    ]
    assert runs[0] == runs[1] == f"{bucket_ids(text, LexicalConfig(word_ngrams=2)).tolist()}\n"


def test_the_featurizer_gives_training_stages_their_out_of_fold_scores_and_others_the_full_fit(stages):
    train, test = stages[:900], stages[900:]
    featurizer = Featurizer(LEXICAL).fit(train)
    labelled = [s for s in train if s.is_labelled and s.is_tool_call is not None]
    frame = featurizer.transform(labelled)
    np.testing.assert_array_equal(frame[list(LEXICAL_COLUMNS)].to_numpy(np.float32), featurizer.lexical_.oof_)
    in_fold = featurizer.lexical_.score([s.prompt_text() for s in labelled])
    assert not np.allclose(frame[list(LEXICAL_COLUMNS)].to_numpy(np.float32), in_fold, atol=1e-3)
    expected = featurizer.lexical_.score([s.prompt_text() for s in test])
    np.testing.assert_array_equal(featurizer.transform(test)[list(LEXICAL_COLUMNS)].to_numpy(np.float32), expected)
    matrix, _ = featurizer.matrix(test[:5], list(LEXICAL_COLUMNS))
    np.testing.assert_allclose(matrix, expected[:5], rtol=1e-6)
    loaded = Featurizer.from_state(pickle.loads(pickle.dumps(featurizer.state())))
    reloaded = loaded.transform(labelled)[list(LEXICAL_COLUMNS)].to_numpy(np.float32)
    np.testing.assert_array_equal(reloaded, in_fold)  # the out-of-fold scores stay with the training run


def test_a_lexical_predictor_answers_the_same_after_save_and_load(stages, tmp_path):
    predictor = Predictor.train(stages[:900], LEXICAL, FAST_MODEL)
    assert set(LEXICAL_COLUMNS) <= set(predictor.model.feature_names)
    loaded = Predictor.load(predictor.save(tmp_path / "p"))
    assert loaded.predict(stages[900:940]) == predictor.predict(stages[900:940])


def test_a_featurizer_saved_before_the_lexical_scores_loads_and_makes_none(stages):
    config = FeaturizerConfig(use_embedding=False)
    del config.__dict__["lexical"]  # as a FeaturizerConfig pickled before the field existed
    state = Featurizer(config).fit(stages[:300]).state()
    del state["lexical"]
    old = pickle.loads(pickle.dumps(state))
    assert "lexical" not in old["config"].__dict__
    loaded = Featurizer.from_state(old)
    assert loaded.config.lexical is None and not hasattr(loaded, "lexical_")
    assert not set(LEXICAL_COLUMNS) & set(loaded.transform(stages[300:320]).columns)


def test_an_unfitted_lexical_model_says_so():
    with pytest.raises(RuntimeError, match="not fitted"):
        LexicalModel().score(["text"])
    with pytest.raises(ValueError, match="at least 2 tasks"):
        LexicalModel().fit(["a", "b"], np.array([1, 2]), np.array([True, False]), np.array(["t", "t"]))


def test_per_app_buckets_learn_a_phrase_the_apps_read_oppositely():
    rng = np.random.default_rng(3)
    words = ["alpha", "bravo", "delta", "kilo", "lima", "oscar", "tango", "zulu"]
    n = 800
    apps = np.array(["triage", "retail"])[rng.integers(0, 2, n)]
    urgent = rng.random(n) < 0.5
    texts = [" ".join(rng.choice(words, 12)) + (" urgent case" if u else " routine case") for u in urgent]
    long = urgent == (apps == "triage")  # "urgent" means a long answer in one app, a short one in the other
    tokens = np.where(long, 400, 40) * rng.lognormal(0, 0.2, n)
    is_tool, groups = ~long, np.arange(n) // 4
    for per_app, low, high in ((False, -0.1, 0.1), (True, 0.5, 1.0)):
        model = LexicalModel(LexicalConfig(per_app=per_app)).fit(texts, tokens, is_tool, groups, list(apps))
        assert low < kendalltau(model.oof_[:, 0], tokens).statistic < high, per_app


def test_the_teachers_targets_and_the_scores_fitted_to_them_never_read_a_rows_own_task(stages):
    texts, tokens, is_tool, groups = columns(stages[:600])
    # a stand-in for MiniLM's vectors: a fixed random projection of each text's n-grams (a function of the text)
    projection = np.random.default_rng(5).normal(size=(2**10, 24))
    vectors = design_matrix(texts, LexicalConfig(num_buckets=2**10)) @ projection
    config = LexicalConfig(teacher="minilm")
    model = LexicalModel(config).fit(texts, tokens, is_tool, groups, teacher_vectors=vectors)
    assert kendalltau(model.teacher_, tokens).statistic > 0.2  # the teacher reads the lengths from the vectors
    task = groups == groups[0]
    changed = LexicalModel(config).fit(
        texts, np.where(task, tokens * 20, tokens), is_tool, groups, teacher_vectors=vectors
    )
    np.testing.assert_array_equal(changed.teacher_[task], model.teacher_[task])
    assert not np.allclose(changed.teacher_[~task], model.teacher_[~task])
    np.testing.assert_array_equal(changed.oof_[task], model.oof_[task])  # nor, through the teacher, the scores
    # the final fit's length model is the ridge on the mean of the labels and the teacher's predictions
    X = design_matrix(texts, config)
    ridge = np.array([Ridge(alpha=config.ridge).fit(X, y).coef_ for y in (np.log1p(tokens), model.teacher_)])
    np.testing.assert_allclose(model.weights_[:, 0], ridge.mean(axis=0), atol=2e-4)  # the solver's tolerance
    assert not np.allclose(model.weights_[:, 0], ridge[0], atol=2e-3)
    plain = LexicalModel().fit(texts, tokens, is_tool, groups)
    assert not np.allclose(plain.oof_[:, 0], model.oof_[:, 0], atol=1e-3)
    np.testing.assert_array_equal(plain.oof_[:, 1], model.oof_[:, 1])  # the tool-call model reads the labels alone
    with pytest.raises(ValueError, match="teacher vector per text"):
        LexicalModel(config).fit(texts, tokens, is_tool, groups)


class _ProjectionTeacher:
    """Stands in for MiniLM: a fixed random projection of each text's n-grams."""

    def __init__(self):
        self.projection, self.calls = np.random.default_rng(5).normal(size=(2**10, 24)), 0

    def embed(self, texts):
        self.calls += 1
        return design_matrix(texts, LexicalConfig(num_buckets=2**10)) @ self.projection


def test_the_featurizer_fits_the_lexical_scores_to_its_teacher_and_scores_without_it(stages):
    teacher = _ProjectionTeacher()
    config = FeaturizerConfig(use_embedding=False, lexical=LexicalConfig(teacher="minilm"))
    featurizer = Featurizer(config, teacher=teacher).fit(stages[:600])
    assert teacher.calls == 1 and len(featurizer.lexical_.teacher_) == len(featurizer.lexical_.oof_)
    loaded = Featurizer.from_state(pickle.loads(pickle.dumps(featurizer.state())))
    assert loaded.teacher is None  # scoring never needs MiniLM
    np.testing.assert_array_equal(
        loaded.transform(stages[600:700])[list(LEXICAL_COLUMNS)].to_numpy(np.float32),
        featurizer.lexical_.score([s.prompt_text() for s in stages[600:700]]),
    )
