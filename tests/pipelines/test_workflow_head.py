"""The workflow model's head signal (pipelines.workflow_head): what of a prompt it reads, that it reads the stage's
own prompt only (no later stage, no true output), and that the option survives save / load and the live path."""

from __future__ import annotations

import pickle
import shutil

import numpy as np
import pytest

from maestro.contract import StageTrace, parse_record, task_id
from maestro.structure import derive_structure
from pipelines.features import FeaturizerConfig, StageHistory
from pipelines.history import without_labels
from pipelines.model import ModelConfig
from pipelines.predictor import Predictor
from pipelines.synth import generate
from pipelines.workflow_head import OPENING_MESSAGES, HeadSignal, head_counts, head_text
from pipelines.workflow_remaining import WorkflowConfig, WorkflowRemainingModel

CONFIG = WorkflowConfig(
    folds=3, head_chars=512, booster=dict(n_estimators=40, learning_rate=0.1, num_leaves=7, min_child_samples=20)
)


@pytest.fixture(scope="module")
def split():
    stages = derive_structure([parse_record(r) for r in generate(900, 5)])
    held = {t for i, t in enumerate(sorted({task_id(s) for s in stages})) if i % 3 == 0}
    return [s for s in stages if task_id(s) not in held], [s for s in stages if task_id(s) in held]


@pytest.fixture(scope="module")
def model(split):
    return WorkflowRemainingModel(CONFIG).fit(split[0])


def test_head_text_reads_a_texts_start_and_a_conversations_system_tail_and_opening():
    assert head_text("Here is a new customer's task: a game, with a grid." + "x" * 900, 30) == (
        "Here is a new customer's task:"
    )
    messages = [
        {"role": "system", "content": "policy " * 50 + "<scenario>call about a bill</scenario>"},
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "My phone has no service, and no data."},
        {"role": "assistant", "content": "later turn, not read"},
    ]
    head = head_text(messages, 40)
    assert head.startswith(messages[0]["content"][-40:] + "\n") and "later turn" not in head
    assert "user: My phone" not in head  # the opening is cut at 40 characters too
    assert "user: My phone has no service" in head_text(messages, 200)
    assert OPENING_MESSAGES == 2 and head_text(messages[1:], 200) == (
        "assistant: Hi! How can I help you today?\nuser: My phone has no service, and no data."
    )
    np.testing.assert_array_equal(head_counts(["a, b\nc", ""]), [[6, 1, 1], [0, 0, 0]])
    with pytest.raises(ValueError, match="chars"):
        HeadSignal(0)


def test_head_reads_only_the_stages_own_prompt(model, split):
    """Changing a later stage of the workflow (its prompt, its output) or the stage's own true output leaves the
    stage's head columns, and the model's answers for it and the stages before it, unchanged."""
    workflow = [s for s in split[1] if s.workflow_id == split[1][0].workflow_id]
    assert len(workflow) >= 4
    cut = len(workflow) // 2
    changed = workflow[:cut] + [
        s.model_copy(update={"output_tokens": s.output_tokens * 5 + 1, "prompt": "a wholly different task, " * 40})
        for s in workflow[cut:]
    ]
    own = [s.model_copy(update={"output_tokens": 1, "is_tool_call": not s.is_tool_call}) for s in workflow[:cut]]
    columns = [model.head_.columns([s.prompt for s in w[:cut]]) for w in (workflow, changed, own)]
    np.testing.assert_array_equal(columns[0], columns[1])
    np.testing.assert_array_equal(columns[0], columns[2])
    answers = [model.predict([s.model_copy() for s in w])[:cut] for w in (workflow, changed)]
    assert answers[0] == answers[1]
    stage = workflow[cut - 1]
    for true_tokens in (1, 10_000):  # the stage alone, its ancestors finished: its own output is never read
        history = StageHistory()
        history.add([s.model_copy() for s in workflow[: cut - 1]])
        alone = stage.model_copy(update={"output_tokens": true_tokens})
        assert model.predict([alone], history)[0] == answers[0][-1]


def test_the_head_moves_the_answers_and_the_live_path_matches_the_batch(model, split):
    assert model.boosters_["calls"][0].num_feature() == len(model.encoder_.columns_) + 2 + 2 + 3
    workflow = [s for s in split[1] if s.workflow_id == split[1][5].workflow_id]
    history = StageHistory()
    history.add(workflow[:-1])
    alone = workflow[-1].model_copy(update={"output_tokens": None, "is_tool_call": None})
    assert model.predict([alone], history)[0] == model.predict(workflow)[-1]


def test_the_head_option_round_trips_save_and_load(model, split, tmp_path):
    model.save(tmp_path)
    loaded = WorkflowRemainingModel.load(tmp_path)
    assert loaded.config.head_chars == 512 and loaded.config.head_counts
    assert loaded.predict(split[1][:60]) == model.predict(split[1][:60])
    prompts = [s.prompt for s in split[1][:60]]
    np.testing.assert_array_equal(
        pickle.loads(pickle.dumps(model)).head_.columns(prompts), model.head_.columns(prompts)
    )
    off = WorkflowRemainingModel(WorkflowConfig(folds=3, booster=CONFIG.booster)).fit(split[0])
    assert off.head_ is None and off.boosters_["calls"][0].num_feature() == len(off.encoder_.columns_) + 2


def test_centred_targets_fit_within_each_app_and_position(split):
    stages = split[0]
    targets = np.log1p(np.column_stack([np.arange(len(stages)) % 7, np.arange(len(stages)) % 5])).astype(float)
    signal = HeadSignal(256, counts=False, folds=3, centred=True)
    oof = signal.fit(
        [s.prompt for s in stages],
        targets,
        np.array([task_id(s) for s in stages]),
        [s.app for s in stages],
        [s.call_index for s in stages],
    )
    assert oof.shape == (len(stages), 2) and np.isfinite(oof).all()
    assert signal.columns([s.prompt for s in stages[:5]]).shape == (5, 2)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build the row walker with")
def test_a_predictor_with_the_head_answers_the_same_saved_and_one_stage_at_a_time(tmp_path):
    """The predictor's path: the workflow model reads StageInputs (predict_inputs), its boosters walked one row at a
    time after load (pipelines.row_walker), the head's columns after the tail scores'."""
    stages = [StageTrace.model_validate(s) for s in generate(700, seed=8)]
    model = ModelConfig(
        folds=3,
        regressor_bags=1,
        classifier=dict(n_estimators=20, learning_rate=0.1),
        regressor=dict(n_estimators=30, learning_rate=0.1),
        quantile=dict(n_estimators=20, learning_rate=0.1),
    )
    trained = Predictor.train(stages[:500], FeaturizerConfig(use_embedding=False), model, workflow_config=CONFIG)
    assert trained.workflow.head_ is not None
    loaded = Predictor.load(trained.save(tmp_path))
    answers = lambda predictor, batch: [a.to_dict() for a in predictor.predict(batch)]
    test = [s.model_copy() for s in stages[500:]]
    for batch in (test, [without_labels(s) for s in test]):
        assert answers(loaded, batch) == answers(trained, batch)
        assert [answers(loaded, [s]) for s in batch[:80]] == [answers(trained, [s]) for s in batch[:80]]
