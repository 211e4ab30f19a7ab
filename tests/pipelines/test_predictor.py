import hashlib
import json
import shutil

import numpy as np
import pytest

from maestro.cli import main as maestro
from maestro.contract import StageTrace, read_traces, write_jsonl
from maestro.prediction import WORKFLOW_FIELDS, WORKFLOW_PRIOR
from maestro.progressive import TABLE_FILE
from pipelines.artifact import ArtifactMismatch
from pipelines.features import FeaturizerConfig, StageHistory
from pipelines.model import ModelConfig
from pipelines.predictor import MIN_STAGES_FOR_MODEL, Predictor
from pipelines.synth import generate

FAST_MODEL = ModelConfig(
    folds=3, classifier=dict(n_estimators=40, learning_rate=0.1), regressor=dict(n_estimators=80, learning_rate=0.1)
)
NO_EMBEDDING = FeaturizerConfig(use_embedding=False)


@pytest.fixture(scope="module")
def sample_stages():
    return [StageTrace.model_validate(s) for s in generate(1500, seed=5)]


@pytest.fixture(scope="module")
def predictor(sample_stages):
    return Predictor.train(sample_stages, NO_EMBEDDING, FAST_MODEL)


def test_a_stage_predicted_alone_sees_its_finished_ancestors_through_the_history(predictor, sample_stages):
    """Live, a stage comes alone after its parents finished: with their outcomes in a StageHistory it
    gets exactly the features (parent outputs, role history, depth, call index) a trace file gives it."""
    by_workflow = {}
    for stage in sample_stages:
        by_workflow.setdefault(stage.workflow_id, []).append(stage)
    workflow = max(by_workflow.values(), key=len)
    fresh = lambda s: s.model_copy(update={"depth": None, "call_index": None})
    unlabelled = lambda s: fresh(s).model_copy(update={"output_tokens": None, "is_tool_call": None})
    columns = predictor.model.feature_names
    in_file, _ = predictor.featurizer.matrix([fresh(s) for s in workflow[:-1]] + [unlabelled(workflow[-1])], columns)
    history = StageHistory()
    history.add([fresh(s) for s in workflow[:-1]])
    alone, _ = predictor.featurizer.matrix([unlabelled(workflow[-1])], columns, history)
    np.testing.assert_array_equal(alone[0], in_file[-1])
    without, _ = predictor.featurizer.matrix([unlabelled(workflow[-1])], columns)
    assert not np.array_equal(without[0], in_file[-1], equal_nan=True)
    batch = predictor.predict([fresh(s) for s in workflow[:-1]] + [unlabelled(workflow[-1])])
    assert predictor.predict([unlabelled(workflow[-1])], history) == [batch[-1]]


def test_known_role_answers_from_the_model(predictor, sample_stages):
    predictions = predictor.predict(sample_stages[:50])
    assert {p.fallback_level for p in predictions} == {"role"}
    assert all(0 <= p.p_tool <= 1 and p.tokens_reserve >= p.tokens_pred >= 0 for p in predictions)
    assert [p.stage_id for p in predictions] == [s.stage_id for s in sample_stages[:50]]


def test_unseen_role_falls_back_to_the_global_model(predictor, sample_stages):
    stranger = sample_stages[0].model_copy(update={"role": "a role nobody has seen", "workflow_id": "new"})
    (prediction,) = predictor.predict([stranger])
    assert prediction.fallback_level == "global" and prediction.tokens_reserve > 0


def test_too_little_data_answers_from_priors(sample_stages):
    tiny = Predictor.train(sample_stages[: MIN_STAGES_FOR_MODEL - 1], NO_EMBEDDING, FAST_MODEL)
    assert tiny.model is None
    (known, unknown) = tiny.predict([sample_stages[0], sample_stages[0].model_copy(update={"role": "zzz"})])
    assert known.fallback_level == unknown.fallback_level == "prior"
    assert known.tokens_pred == int(round(tiny.priors[sample_stages[0].role].tokens_median))
    assert unknown.tokens_pred == int(round(tiny.priors[""].tokens_median))


def test_unlabelled_training_data_is_refused(sample_stages):
    bare = [s.model_copy(update={"output_tokens": None}) for s in sample_stages[:10]]
    with pytest.raises(ValueError, match="no labelled stages"):
        Predictor.train(bare)


def test_save_load_round_trip_gives_the_same_answers(predictor, sample_stages, tmp_path):
    predictor.save(tmp_path / "p")
    assert (tmp_path / "p" / "workflow" / "workflow_remaining.joblib").exists()
    loaded = Predictor.load(tmp_path / "p")
    answers = loaded.predict(sample_stages[:20])
    assert answers == predictor.predict(sample_stages[:20])  # the wf_* fields too: dataclass equality
    assert {a.wf_fallback_level for a in answers} == {"app"}
    with pytest.raises(FileNotFoundError, match="maestro train"):
        Predictor.load(tmp_path)


def test_every_answer_carries_its_workflows_remaining_work(predictor, sample_stages):
    """The model's answers from the workflow model (its remaining calls and tokens, the bound above the median);
    an app training never saw, the error fallback and a predictor too small for a model from its position table."""
    answers = predictor.predict(sample_stages[:60])
    assert {a.wf_fallback_level for a in answers} == {"app"}
    assert all(
        a.wf_remaining_calls_upper >= a.wf_remaining_calls >= 0
        and a.wf_remaining_tokens_upper >= a.wf_remaining_tokens >= 0
        for a in answers
    )
    assert len({a.wf_remaining_tokens for a in answers}) > 10  # read from each stage, not one constant
    expected = predictor.workflow.predict(sample_stages[:60])
    assert [a.remaining_fields() for a in answers] == [w.remaining_fields() for w in expected]
    stranger = sample_stages[0].model_copy(update={"app": "an app nobody trained on", "workflow_id": "new-app"})
    assert predictor.predict([stranger])[0].wf_fallback_level == "position"
    assert predictor.prior(sample_stages[3]).wf_fallback_level == "position"  # where the model failed on a stage
    tiny = Predictor.train(sample_stages[: MIN_STAGES_FOR_MODEL - 1], NO_EMBEDDING, FAST_MODEL)
    assert {(a.fallback_level, a.wf_fallback_level) for a in tiny.predict(sample_stages[:5])} == {("prior", "position")}


def old_format_digest(directory) -> str:
    """The checksum as predictors saved before the workflow model recorded it: over these two files alone."""
    digest = hashlib.sha256()
    for name in ("predictor.joblib", "priors.json"):
        digest.update(name.encode())
        digest.update((directory / name).read_bytes())
    return digest.hexdigest()


def test_a_predictor_saved_without_a_workflow_model_loads_and_answers_the_prior(predictor, sample_stages, tmp_path):
    directory = predictor.save(tmp_path / "old")
    shutil.rmtree(directory / "workflow")
    (directory / TABLE_FILE).unlink()  # saved before predictors had a progressive table either
    meta = json.loads((directory / "meta.json").read_text())
    (directory / "meta.json").write_text(json.dumps({**meta, "artifact_sha256": old_format_digest(directory)}))
    old = Predictor.load(directory, expected_sha256=old_format_digest(directory))
    assert old.workflow is None and old.progressive is None
    answers = old.predict(sample_stages[:10])
    assert {a.fallback_level for a in answers} == {"role"}  # the stage model answers as before
    assert {tuple(a.remaining_fields().items()) for a in answers} == {tuple(WORKFLOW_PRIOR.remaining_fields().items())}
    assert old.prior(sample_stages[0]).wf_fallback_level == "prior"


def test_the_checksum_covers_the_workflow_model(predictor, tmp_path):
    directory = predictor.save(tmp_path / "p")
    shutil.copytree(directory, tmp_path / "changed")
    (tmp_path / "changed" / "workflow" / "workflow_remaining.json").write_text("{}")
    with pytest.raises(ArtifactMismatch, match="checksum recorded in meta.json"):
        Predictor.load(tmp_path / "changed")
    shutil.rmtree(directory / "workflow")  # a saved model's workflow model taken away: not the predictor saved
    with pytest.raises(ArtifactMismatch, match="checksum recorded in meta.json"):
        Predictor.load(directory)


def test_reserve_keeps_its_promise_on_fresh_workflows(predictor):
    fresh = [StageTrace.model_validate(s) for s in generate(1500, seed=99)]
    predictions = predictor.predict(fresh)
    actual = np.array([s.output_tokens for s in fresh])
    reserve = np.array([p.tokens_reserve for p in predictions])
    assert np.mean(actual > reserve) < 0.09  # alpha = 0.05, with slack for a 1.5k-stage calibration


@pytest.mark.slow
def test_cli_train_then_predict_on_a_small_file(tmp_path):
    traces = tmp_path / "small.jsonl"
    write_jsonl(generate(400, seed=2), traces)
    with traces.open("a") as handle:
        handle.write("{broken\n")
    assert maestro(["train", "--traces", str(traces), "--out", str(tmp_path / "model")]) == 0
    out = tmp_path / "pred.jsonl"
    assert maestro(["predict", "--model", str(tmp_path / "model"), "--traces", str(traces), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    stages = read_traces(traces).stages
    assert len(rows) == len(stages)
    assert set(rows[0]) == {
        "workflow_id",
        "stage_id",
        "p_tool",
        "tokens_pred",
        "tokens_reserve",
        "fallback_level",
        "history",
        *WORKFLOW_FIELDS,
    }
    assert {r["wf_fallback_level"] for r in rows} == {"app"}  # `maestro train` fitted the workflow model too
    assert all(r["wf_remaining_tokens_upper"] >= r["wf_remaining_tokens"] for r in rows)
    assert [(r["workflow_id"], r["stage_id"]) for r in rows] == [(s.workflow_id, s.stage_id) for s in stages]
    fresh = tmp_path / "fresh.jsonl"
    write_jsonl(generate(200, seed=3), fresh)
    fresh_out, scores = tmp_path / "fresh-pred.jsonl", tmp_path / "scores.json"
    assert (
        maestro(["predict", "--model", str(tmp_path / "model"), "--traces", str(fresh), "--out", str(fresh_out)]) == 0
    )
    assert (
        maestro(
            [
                "score",
                "--predictions",
                str(fresh_out),
                "--traces",
                str(fresh),
                "--train",
                str(traces),
                "--out",
                str(scores),
                "--plots",
                str(tmp_path / "plots"),
            ]
        )
        == 0
    )
    assert {"calibration.png", "pred_vs_actual.png", "reserve_tradeoff.png"} <= {
        p.name for p in (tmp_path / "plots").iterdir()
    }
    scored = json.loads(scores.read_text())
    assert scored["model"]["n"] == len(read_traces(fresh).stages) and scored["unpredicted_stages"] == 0
    assert set(scored["targets"]) == {
        "auc",
        "mae_vs_role_median",
        "kendall_tau",
        "under_rate",
        "over_reservation_vs_role_p90",
    }


def test_a_model_subclass_fitted_by_predictor_fit_can_refit_its_reserve_alone(sample_stages):
    """Predictor.fit(model=...) fits the given TwoStageModel; its fit_reserve is the hook a subclass uses to keep
    the reserve's inputs (benchmarks/predictor/reserve_cv.py), and calling it again with another config moves the
    levels."""
    from dataclasses import replace

    from pipelines.features import Featurizer
    from pipelines.model import TwoStageModel
    from pipelines.predictor import training_frame

    class Recorder(TwoStageModel):
        def fit_reserve(self, *inputs) -> None:
            self.inputs = inputs
            super().fit_reserve(*inputs)

    stages = sample_stages[:600]
    featurizer = Featurizer(NO_EMBEDDING).fit(stages)
    recorder = Recorder(FAST_MODEL)
    fitted = Predictor.fit(featurizer, *training_frame(featurizer, stages), model=recorder)
    assert fitted.model is recorder and len(recorder.inputs) == 5
    level = recorder.global_q_
    recorder.config = replace(FAST_MODEL, alpha=0.2)
    recorder.fit_reserve(*recorder.inputs)
    assert recorder.global_q_ < level  # a looser promise, a lower level


def test_the_progressive_table_is_saved_under_the_checksum_and_optional(predictor, tmp_path):
    """Training fits the progressive table on the stage model's out-of-fold medians; save() writes it under the
    checksum; a predictor without one (saved before it had one) loads with none, and runtimes fall back to the
    parametric bounds."""
    assert predictor.progressive is not None
    assert predictor.meta["progressive"]["first_guesses"].startswith("out-of-fold")
    directory = predictor.save(tmp_path / "p")
    assert Predictor.load(directory).progressive == predictor.progressive
    shutil.copytree(directory, tmp_path / "changed")
    (tmp_path / "changed" / TABLE_FILE).write_text(predictor.progressive.to_json().replace("0.", "1.", 1))
    with pytest.raises(ArtifactMismatch, match="checksum recorded in meta.json"):
        Predictor.load(tmp_path / "changed")
    bare = Predictor(
        predictor.featurizer,
        predictor.model,
        predictor.priors,
        dict(predictor.meta),
        predictor.new_app,
        predictor.workflow,
    )
    assert not (bare.save(tmp_path / "bare") / TABLE_FILE).exists()
    assert Predictor.load(tmp_path / "bare").progressive is None
