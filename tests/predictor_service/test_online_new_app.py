"""Online reserve of an app training never saw, in the service: the app's own level (`maestro.own_reserve`, the rule
the gateway and the simulator apply) once its observed stages stand behind one; seen apps' state does not move."""

import math

import numpy as np
import pytest

from maestro.contract import StageTrace
from pipelines.new_app import NEW_APP
from predictor_service.online import CorrectionConfig, OnlineCorrection, coverage_group

ALPHA = 0.045  # at this miss rate a finite split-conformal level needs 22 scores
NEW_GROUP, SEEN_GROUP = coverage_group("new", "agent", "full"), coverage_group("seen", "agent", "full")


def serve(corrections: OnlineCorrection, actual_tokens: float, group=NEW_GROUP, reserve_tokens: int = 1000) -> int:
    """One new-app stage answered (point 10, the model's reserve `reserve_tokens`), then observed; its served
    reserve."""
    served = corrections.apply(group[1], 10, reserve_tokens, group, is_new_app=True)
    corrections.update(group[1], 10, actual_tokens, reserve_tokens, group, is_new_app=True)
    return served[1]


def test_a_new_app_keeps_the_models_reserve_until_its_own_stages_give_a_finite_level():
    corrections = OnlineCorrection(alpha=ALPHA, clock=lambda: 0.0)
    served = [serve(corrections, 300) for _ in range(23)]
    assert served[:22] == [1000] * 22  # 21 scores: no finite rank at α = 0.045
    assert served[22] == 300  # every stage ended at 300: the level maps the model's 1000 to exactly that
    level = corrections.new_apps.level("new", ALPHA)
    assert level == pytest.approx(math.log1p(300) - math.log1p(1000))
    assert corrections.apply("agent", 500, 1000, NEW_GROUP, is_new_app=True)[:2] == (500, 500)  # never below the point


def test_the_level_is_the_conformal_quantile_of_the_apps_last_stages_and_holds_on_stages_to_come():
    rng = np.random.default_rng(0)
    corrections = OnlineCorrection(CorrectionConfig(new_app_max_scores=200), alpha=ALPHA, clock=lambda: 0.0)
    for value in rng.lognormal(3, 0.5, 400).astype(int):  # served a reserve of 1000 tokens: far too wide for this app
        serve(corrections, value)
    assert corrections.new_apps.num_scores("new") == 200
    reserve = corrections.apply("agent", 10, 1000, NEW_GROUP, is_new_app=True)[1]
    assert reserve < 200
    fresh = rng.lognormal(3, 0.5, 4000).astype(int)
    assert np.mean(fresh > reserve) <= ALPHA + 0.02  # the promise holds on stages still to come


def test_an_apps_roles_share_its_level_and_apps_are_kept_apart():
    corrections = OnlineCorrection(alpha=ALPHA, clock=lambda: 0.0)
    for _ in range(30):
        serve(corrections, 3000, reserve_tokens=100)  # the model's reserve far too small: the level lifts it
    user = coverage_group("new", "user", "full")
    assert corrections.apply("user", 10, 100, user, is_new_app=True)[1] == 3000
    assert corrections.apply("agent", 10, 100, coverage_group("other", "agent", "full"), is_new_app=True)[1] == 100


def test_a_new_apps_outcomes_never_move_a_seen_apps_correction():
    corrections = OnlineCorrection(alpha=ALPHA, clock=lambda: 0.0)
    before = corrections.apply("agent", 100, 200, SEEN_GROUP)
    served = [serve(corrections, 20, reserve_tokens=200) for _ in range(100)]
    assert corrections.apply("agent", 100, 200, SEEN_GROUP) == before
    assert corrections.snapshot() == {}  # no role state was touched
    assert served[-1] == 20  # down to the app's own level; its prediction is left alone
    assert corrections.apply("agent", 10, 200, NEW_GROUP, is_new_app=True)[0] == 10
    coverage = corrections.coverage()[NEW_GROUP]
    assert coverage["num_observations"] == 100 and coverage["share_above_reserve"] < ALPHA


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="reserve it was served and its coverage group"):
        OnlineCorrection(alpha=ALPHA).update("agent", 100, 20, None, None, is_new_app=True)
    with pytest.raises(ValueError, match="new_app_max_scores"):
        CorrectionConfig(new_app_max_scores=0)


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
