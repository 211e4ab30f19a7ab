"""Online reserve of an app training never saw: its own groups move toward α, seen apps' state does not."""

import math

import numpy as np
import pytest

from maestro.contract import StageTrace
from pipelines.new_app import NEW_APP
from predictor_service.new_app import NewAppConfig, NewAppCoverage, min_scores
from predictor_service.online import OnlineCorrection, coverage_group

ALPHA = 0.05


def test_a_group_keeps_the_models_level_until_it_has_enough_scores():
    coverage = NewAppCoverage(alpha=ALPHA)
    assert coverage.alpha == NewAppConfig().miss_target and coverage.min_scores == min_scores(coverage.alpha)
    for _ in range(coverage.min_scores - 1):
        coverage.update("new", "agent", 100, 300)
    assert coverage.shift("new", "agent") == 0.0
    coverage.update("new", "agent", 100, 300)
    assert coverage.shift("new", "agent") == pytest.approx(math.log(301 / 101))


def test_the_shift_is_the_conformal_quantile_of_the_groups_own_scores():
    rng = np.random.default_rng(0)
    coverage = NewAppCoverage(NewAppConfig(window=200), alpha=ALPHA)
    actual = rng.lognormal(3, 0.5, 400)
    for value in actual:  # served a reserve of 1000 tokens: far too wide for this app
        coverage.update("new", "agent", 1000, value)
    factor = coverage.factor("new", "agent")
    assert factor < 0.2
    fresh = rng.lognormal(3, 0.5, 4000)
    assert np.mean(fresh + 1 > 1001 * factor) <= ALPHA + 0.02  # the promise holds on stages still to come


def test_a_role_with_few_scores_borrows_its_apps_pooled_level_and_is_bounded():
    coverage = NewAppCoverage(NewAppConfig(bound=math.log(4)), alpha=ALPHA)
    for _ in range(40):
        coverage.update("new", "agent", 10, 1000)
    assert coverage.shift("new", "user") == coverage.shift("new", "agent") == pytest.approx(math.log(4))
    assert coverage.shift("other", "agent") == 0.0
    assert coverage.snapshot()["new/agent"]["num_observations"] == 40


def test_a_new_apps_outcomes_never_move_a_seen_apps_correction():
    corrections = OnlineCorrection(alpha=ALPHA, clock=lambda: 0.0)
    new_group, seen_group = coverage_group("new", "agent", "full"), coverage_group("seen", "agent", "full")
    before = corrections.apply("agent", 100, 200, seen_group)
    for _ in range(100):
        served = corrections.apply("agent", 10, 200, new_group, is_new_app=True)
        corrections.update("agent", 10, 20, 200, new_group, is_new_app=True)
    assert corrections.apply("agent", 100, 200, seen_group) == before
    assert corrections.snapshot() == {}  # no role state was touched
    assert 25 <= served[1] <= 26 and served[0] == 10  # down to the bound (1/8); its prediction is left alone
    assert corrections.coverage()[new_group]["num_observations"] == 100


def test_a_new_apps_observation_needs_its_reserve_and_group():
    with pytest.raises(ValueError, match="reserve it was served and its coverage group"):
        OnlineCorrection(alpha=ALPHA).update("agent", 100, 20, None, None, is_new_app=True)


def test_the_service_engine_serves_a_new_app_at_its_level_then_at_its_own(tmp_path):
    """Through PredictorEngine: a new app's answers are flagged, /observe moves only that app's reserve."""
    from pipelines.features import FeaturizerConfig
    from pipelines.model import ModelConfig
    from pipelines.predictor import Predictor
    from pipelines.synth import generate
    from predictor_service.config import ServiceConfig
    from predictor_service.engine import PredictorEngine

    stages = [StageTrace.model_validate(r) for r in generate(1200, seed=3)]
    new = sorted({s.app for s in stages})[0]
    small = dict(n_estimators=40, learning_rate=0.1)
    model = ModelConfig(folds=3, classifier=small, regressor=small, quantile={**small, "num_leaves": 15})
    predictor = Predictor.train([s for s in stages if s.app != new], FeaturizerConfig(use_embedding=False), model)
    engine = PredictorEngine(ServiceConfig(model=str(predictor.save(tmp_path / "p")), trace=None, warmup=False))
    seen = next(s for s in stages if s.app != new)
    unlabelled = {"output_tokens": None, "is_tool_call": None}
    before = engine.predict([seen.model_copy(update={**unlabelled, "workflow_id": "seen"})])[0]
    reserves = []
    for i, stage in enumerate(s for s in stages if s.app == new and not s.parent_ids):
        if i == 60:
            break
        asked = stage.model_copy(update={**unlabelled, "workflow_id": f"n{i}"})
        (answer,) = engine.predict([asked])
        assert answer.fallback_level == NEW_APP
        reserves.append(answer.reserve_correction)
        engine.observe([stage.model_copy(update={"workflow_id": f"n{i}", "output_tokens": 1})])
    assert reserves[0] == 1.0 and reserves[-1] < 1.0  # its own level took over: one-token answers
    after = engine.predict([seen.model_copy(update={**unlabelled, "workflow_id": "seen2"})])[0]
    assert (after.tokens_reserve, after.reserve_correction) == (before.tokens_reserve, before.reserve_correction)
