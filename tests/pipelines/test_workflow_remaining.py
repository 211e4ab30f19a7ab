"""The workflow-level predictor: no future leak, the upper bound's coverage on held-out tasks, save/load, the
new-app fallback, errors that name the field. Synthetic workflows (pipelines.synth), a few seconds a fit."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from maestro.contract import parse_record, task_id
from maestro.prediction import WORKFLOW_PRIOR
from maestro.structure import derive_structure
from pipelines.batch_features import StageInputs
from pipelines.features import StageHistory
from pipelines.lexical import LexicalConfig, design_matrix
from pipelines.synth import generate
from pipelines.workflow_features import TailScores, known_history, remaining_targets, so_far_columns, workflow_rows
from pipelines.workflow_remaining import WorkflowConfig, WorkflowRemainingModel

CONFIG = WorkflowConfig(
    folds=3, booster=dict(n_estimators=120, learning_rate=0.08, num_leaves=15, min_child_samples=20)
)


def synthetic(num_stages: int, seed: int) -> list:
    stages = [parse_record(r) for r in generate(num_stages, seed)]
    return derive_structure(stages)


@pytest.fixture(scope="module")
def split():
    stages = synthetic(2400, 11)
    held = {t for i, t in enumerate(sorted({task_id(s) for s in stages})) if i % 3 == 0}
    train = [s for s in stages if task_id(s) not in held]
    test = [s for s in stages if task_id(s) in held]
    return train, test


@pytest.fixture(scope="module")
def model(split):
    return WorkflowRemainingModel(CONFIG).fit(split[0])


def test_targets_count_later_calls_of_any_role():
    stages = synthetic(60, 1)
    calls, tokens = remaining_targets(stages)
    first = [i for i, s in enumerate(stages) if s.workflow_id == stages[0].workflow_id]
    assert calls[first[0]] == len(first) - 1
    assert tokens[first[0]] == sum(stages[i].output_tokens for i in first[1:])
    assert calls[first[-1]] == 0 and tokens[first[-1]] == 0


def test_history_is_ancestors_and_stages_that_ended_before():
    rows = [
        dict(stage_id="0", parent_ids=[], arrival_s=0.0, e2e_s=1.0),
        dict(stage_id="1", parent_ids=["0"], arrival_s=1.0, e2e_s=5.0),  # a branch still running at 2.0
        dict(stage_id="2", parent_ids=["0"], arrival_s=2.0, e2e_s=1.0),
        dict(stage_id="3", parent_ids=["2"], arrival_s=7.0, e2e_s=1.0),
    ]  # stage 1 ended at 6.0: known
    stages = derive_structure(
        [
            parse_record(
                {"workflow_id": "w", "role": "r", "prompt": "p", "output_tokens": 5, "is_tool_call": False, **r}
            )
            for r in rows
        ]
    )
    ids = {(s.workflow_id, s.stage_id): s for s in stages}
    assert [s.stage_id for s in known_history(stages[2], ids)] == ["0"]
    assert [s.stage_id for s in known_history(stages[3], ids)] == ["0", "1", "2"]
    untimed = [s.model_copy(update={"arrival_s": None}) for s in stages]
    ids = {(s.workflow_id, s.stage_id): s for s in untimed}
    assert [s.stage_id for s in known_history(untimed[3], ids)] == ["0", "2"]


def test_no_future_leak(model, split):
    workflow = [s for s in split[1] if s.workflow_id == split[1][0].workflow_id]
    cut = len(workflow) // 2
    changed = workflow[:cut] + [
        s.model_copy(
            update={"output_tokens": s.output_tokens * 7 + 3, "is_tool_call": not s.is_tool_call, "e2e_s": None}
        )
        for s in workflow[cut:]
    ]
    copies = [[s.model_copy() for s in w] for w in (workflow, changed)]
    rows = [workflow_rows(c)[:cut] for c in copies]
    assert [list(map(str, r.values())) for r in rows[0]] == [list(map(str, r.values())) for r in rows[1]]
    answers = [model.predict(c)[:cut] for c in copies]
    assert answers[0] == answers[1]


def test_upper_bound_covers_held_out_tasks(model, split):
    test = split[1]
    calls, tokens = remaining_targets(test)
    answers = model.predict(test)
    over_calls = np.mean(calls > np.array([a.wf_remaining_calls_upper for a in answers]))
    over_tokens = np.mean(tokens > np.array([a.wf_remaining_tokens_upper for a in answers]))
    assert {a.wf_fallback_level for a in answers} == {"app"}
    assert over_calls <= CONFIG.alpha + 0.03 and over_tokens <= CONFIG.alpha + 0.03


def test_live_path_matches_batch(model, split):
    workflow = [s for s in split[1] if s.workflow_id == split[1][5].workflow_id]
    stage = workflow[-1]
    history = StageHistory()
    history.add(workflow[:-1])
    alone = stage.model_copy(update={"output_tokens": None, "is_tool_call": None})
    assert model.predict([alone], history)[0] == model.predict(workflow)[-1]


def test_the_columns_the_stage_model_shares_encode_as_the_rows_fitted_on(model, split):
    """The live path reads StageInputs' columns (the stage model's) and the so-far columns: the same matrix as the
    feature rows the boosters were fitted on, for a batch and for a stage alone beside its finished stages."""
    test = split[1][:80]
    inputs = StageInputs([s.model_copy() for s in test])
    columns = {**inputs.columns, **so_far_columns(inputs.stages, inputs.ids)}
    np.testing.assert_array_equal(
        model.encoder_.columns_matrix(columns, len(test)),
        model.encoder_.matrix(workflow_rows([s.model_copy() for s in test])),
    )
    workflow = [s for s in test if s.workflow_id == test[-1].workflow_id]
    history = StageHistory()
    history.add([s.model_copy() for s in workflow[:-1]])
    alone = StageInputs([workflow[-1].model_copy()], history)
    columns = {**alone.columns, **so_far_columns(alone.stages, alone.ids)}
    rows = workflow_rows([workflow[-1].model_copy()], history.known(alone.stages))
    np.testing.assert_array_equal(model.encoder_.columns_matrix(columns, 1), model.encoder_.matrix(rows))


def test_tail_scores_are_their_design_rows_product_with_the_weights_at_any_width():
    texts = ["Plan the trip, then call search_flights", "", "ab", "Résumé İstanbul " * 200]
    for width in (2, 3):  # two targets: the complex-pair gather; another width: rows summed
        rng = np.random.default_rng(width)
        scores = TailScores(LexicalConfig(tail_chars=1024))
        scores.weights_ = np.asfortranarray(rng.normal(size=(scores.config.num_buckets, width)), np.float32)
        scores.bias_ = rng.normal(size=width).astype(np.float32)
        expected = design_matrix(texts, scores.config) @ scores.weights_ + scores.bias_
        np.testing.assert_allclose(scores.score(texts), expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(pickle.loads(pickle.dumps(scores)).score(texts), scores.score(texts))


def test_save_load_round_trip(model, split, tmp_path):
    model.save(tmp_path)
    loaded = WorkflowRemainingModel.load(tmp_path)
    assert loaded.predict(split[1][:40]) == model.predict(split[1][:40])
    (tmp_path / "workflow_remaining.joblib").write_bytes(b"changed")
    with pytest.raises(ValueError, match="sha256"):
        WorkflowRemainingModel.load(tmp_path)


def test_new_app_answered_by_position_table(model, split):
    stages = [s.model_copy(update={"app": "never_seen"}) for s in split[1][:30]]
    answers = model.predict(stages)
    assert {a.wf_fallback_level for a in answers} == {"position"}
    assert all(a.wf_remaining_calls_upper >= a.wf_remaining_calls for a in answers)


def test_too_little_data_and_no_data():
    few = synthetic(30, 4)
    model = WorkflowRemainingModel(CONFIG).fit(few)
    assert {a.wf_fallback_level for a in model.predict(few)} == {"position"}
    assert WORKFLOW_PRIOR.wf_fallback_level == "prior"  # what a predictor without a workflow model answers


def test_bad_input_names_the_field(model):
    with pytest.raises(ValueError, match="output_tokens"):
        WorkflowRemainingModel(CONFIG).fit([{"workflow_id": "w", "stage_id": "0", "role": "a", "prompt": "x"}])
    with pytest.raises(ValueError, match="field 'role'"):
        model.predict([{"workflow_id": "w", "stage_id": "0", "prompt": "x"}])
    with pytest.raises(ValueError, match="alpha"):
        WorkflowConfig(alpha=0.7)
    with pytest.raises(RuntimeError, match="not fitted"):
        WorkflowRemainingModel().predict([])
