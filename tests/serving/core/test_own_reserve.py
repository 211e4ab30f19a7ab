"""An unseen app's reserve: the answered NEW_APP reserve until the app's own finished stages stand behind a level,
then that level (`OwnReserveLevels`); the simulator rescales a ready stage's reserve by it and scores its stages."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from benchmarks.referee.arms import read_use, write_use
from maestro.own_reserve import OwnReserveLevels, UnseenReserve
from maestro.prediction import FallbackLevel, OutputSize, Prediction
from serving.core.systems import get_system
from serving.sim.engine import ClusterConfig, Simulator
from serving.sim.ready import ReadyPredictions
from serving.sim.workload import SimStage, SimWorkflow

ALPHA = 0.045  # at this miss rate a finite split-conformal level needs 22 scores
MODEL = "llama-3-8b"
MAX_TOKENS = 4096


def test_the_answered_reserve_stands_until_the_apps_own_stages_give_a_finite_level():
    levels, answer = OwnReserveLevels(), UnseenReserve(reserve_tokens=3800, alpha=ALPHA)
    for _ in range(21):
        levels.observe("new", answer, 300)
    assert levels.level("new", ALPHA) is None
    assert levels.reserve_tokens("new", answer, tokens_pred=100, max_tokens=MAX_TOKENS) == 3800
    levels.observe("new", answer, 300)
    assert levels.level("new", ALPHA) == pytest.approx(math.log1p(300) - math.log1p(3800))
    assert levels.reserve_tokens("new", answer, tokens_pred=100, max_tokens=MAX_TOKENS) == 300
    assert levels.reserve_tokens("new", answer, tokens_pred=500, max_tokens=MAX_TOKENS) == 500  # never below the point
    assert levels.reserve_tokens("other", answer, tokens_pred=100, max_tokens=MAX_TOKENS) == 3800  # apps kept apart


def test_the_own_level_lifts_a_reserve_too_small_and_covers_one_minus_alpha_of_the_apps_stages():
    rng = np.random.default_rng(3)
    levels, answer = OwnReserveLevels(), UnseenReserve(reserve_tokens=200, alpha=ALPHA)
    for tokens in np.minimum(MAX_TOKENS, rng.lognormal(6.0, 0.8, 400)).astype(int):
        levels.observe("new", answer, int(tokens))
    reserve = levels.reserve_tokens("new", answer, tokens_pred=100, max_tokens=MAX_TOKENS)
    assert reserve > 200
    fresh = np.minimum(MAX_TOKENS, rng.lognormal(6.0, 0.8, 4000)).astype(int)
    assert (fresh <= reserve).mean() >= 1 - ALPHA - 0.02


def test_only_the_last_max_scores_stages_count_and_bad_input_is_refused():
    levels, answer = OwnReserveLevels(max_scores=30), UnseenReserve(reserve_tokens=1000, alpha=ALPHA)
    for tokens in [1000] * 30 + [100] * 30:
        levels.observe("new", answer, tokens)
    assert levels.reserve_tokens("new", answer, tokens_pred=10, max_tokens=MAX_TOKENS) == 100
    with pytest.raises(ValueError, match="max_scores"):
        OwnReserveLevels(max_scores=0)
    with pytest.raises(ValueError, match="output_tokens"):
        levels.observe("new", answer, -1)


def chain(app: str, num_stages: int, output_tokens: int) -> SimWorkflow:
    workflow = SimWorkflow(f"{app}-w", app, interactive=False, slo_s=1e6)
    for i in range(num_stages):
        stage = SimStage(
            workflow, i, f"s{i}", "agent", MODEL, [i - 1] if i else [], output_tokens, False, prompt_tokens=100
        )
        stage.max_tokens = MAX_TOKENS
        workflow.stages.append(stage)
    for i in range(num_stages - 1):
        workflow.stages[i].children = [i + 1]
    workflow.num_stages_left = num_stages
    return workflow


def test_the_simulator_rescales_an_unseen_apps_ready_reserve_once_its_finished_stages_stand_behind_a_level():
    """Every stage is answered a 3,800-token NEW_APP reserve and outputs 200: the 23rd and later map 200 (before the
    rule every stage mapped 3,800); a reserve fed from another source keeps its own size."""
    workflow = chain("new", 30, 200)
    seen: dict[int, int] = {}

    def predict(stage: SimStage) -> None:
        stage.size = OutputSize(tokens_pred=150, tokens_reserve=3800)
        stage.unseen_reserve = UnseenReserve(reserve_tokens=3800, alpha=ALPHA)

    cluster = ClusterConfig(num_nodes=1, show_progress=False)
    sim = Simulator(cluster, get_system("maestro"), [workflow], predict_ready=predict)
    make_ready = sim.make_ready

    def recording(stage: SimStage) -> None:
        make_ready(stage)
        seen[stage.index] = stage.tokens_reserve

    sim.make_ready = recording
    sim.run()
    assert workflow.done_s > 0
    assert [seen[i] for i in range(22)] == [3800] * 22
    assert [seen[i] for i in range(22, 30)] == [200] * 8


def test_a_reserve_fed_from_another_source_carries_its_own_basis():
    workflow = chain("new", 1, 200)
    stage = workflow.stages[0]
    stage.size, stage.unseen_reserve = OutputSize(tokens_pred=150, tokens_reserve=700), None
    fed = read_use(stage, "reserve")  # e.g. the none source's reserve, read before the model answers
    stage.size = replace(stage.size, tokens_reserve=3800)
    stage.unseen_reserve = UnseenReserve(reserve_tokens=3800, alpha=ALPHA)
    write_use(stage, "reserve", fed)
    assert (stage.tokens_reserve, stage.unseen_reserve) == (700, None)


class _Answers:
    """A predictor stand-in: answers every stage at `level` with a 3,000-token reserve."""

    def __init__(self, level: FallbackLevel):
        self.level, self.progressive = level, None
        self.model = type("M", (), {"config": type("C", (), {"alpha": ALPHA})()})()

    def predict(self, rows, history):
        size = {"tokens_pred": 150, "tokens_reserve": 3000}
        return [Prediction(r.workflow_id, r.stage_id, 0.0, self.level, **size) for r in rows]


@pytest.mark.parametrize("level", list(FallbackLevel))
def test_only_a_new_app_answer_carries_an_unseen_reserve(level):
    source = ReadyPredictions.__new__(ReadyPredictions)
    source.name, source.rho, source.cache, source.num_calls = "model", 0.2, {}, 0
    source.progressive, source._predictor = None, _Answers(level)
    stage = chain("new", 1, 200).stages[0]
    stage.source = {"workflow_id": "new-w", "stage_id": "s0", "app": "new", "role": "agent", "prompt": "p"}
    source(stage)
    if level is FallbackLevel.NEW_APP:
        assert stage.unseen_reserve == UnseenReserve(reserve_tokens=3000, alpha=ALPHA)
    else:
        assert stage.unseen_reserve is None
