"""The gateway's in-process predictor with an app training never saw: flagged, then corrected from its own stages."""

from __future__ import annotations

import asyncio

from maestro.contract import StageTrace
from pipelines.features import FeaturizerConfig
from pipelines.model import ModelConfig
from pipelines.new_app import NEW_APP
from pipelines.predictor import Predictor
from pipelines.synth import generate
from serving.gateway.predict import LocalPredictor

FAST_MODEL = ModelConfig(
    folds=3,
    classifier=dict(n_estimators=40, learning_rate=0.1),
    regressor=dict(n_estimators=80, learning_rate=0.1),
    quantile=dict(n_estimators=80, learning_rate=0.1, num_leaves=15, min_child_samples=20),
)


def test_a_new_apps_reserve_comes_down_as_its_stages_are_observed():
    stages = [StageTrace.model_validate(r) for r in generate(1200, seed=11)]
    new = sorted({s.app for s in stages})[0]
    predictor = Predictor.train([s for s in stages if s.app != new], FeaturizerConfig(use_embedding=False), FAST_MODEL)

    def stage(i: int) -> dict:
        return {
            "workflow_id": f"n{i}",
            "stage_id": "0",
            "role": "agent",
            "prompt": "answer in one word",
            "app": new,
            "parent_ids": [],
        }

    async def scenario():
        local = LocalPredictor(predictor, timeout_s=5)
        await local.start()
        reserves = []
        try:
            for i in range(60):
                [answer] = await local.predict([stage(i)])
                reserves.append(answer.prediction)
                local.observe({**stage(i), "output_tokens": 3, "is_tool_call": False})
        finally:
            await local.aclose()
        return reserves

    answers = asyncio.run(scenario())
    assert {a.fallback_level for a in answers} == {NEW_APP}
    first, last = answers[0], answers[-1]
    assert last.tokens_reserve < first.tokens_reserve and last.tokens_reserve >= last.tokens_pred
