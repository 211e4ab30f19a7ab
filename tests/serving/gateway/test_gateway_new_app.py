"""The gateway with an app training never saw: its in-process model flags it, the gateway corrects its reserve from its
own finished stages."""

from __future__ import annotations

import asyncio

from maestro.contract import StageTrace
from pipelines.features import FeaturizerConfig
from pipelines.model import ModelConfig
from pipelines.new_app import NEW_APP
from pipelines.predictor import Predictor
from pipelines.synth import generate
from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway
from serving.gateway.metadata import StageMeta
from serving.gateway.outcome import CallResult
from serving.gateway.predict import LocalPredictor

FAST_MODEL = ModelConfig(
    folds=3,
    classifier=dict(n_estimators=40, learning_rate=0.1),
    regressor=dict(n_estimators=80, learning_rate=0.1),
    quantile=dict(n_estimators=80, learning_rate=0.1, num_leaves=15, min_child_samples=20),
)


def test_a_new_apps_reserve_comes_down_in_the_gateway_as_its_stages_finish(tmp_path):
    """The in-process model answers a new app as it is (one home for the rescaling: the gateway's
    `OwnReserveLevels`, fed by the stages it records), and the gateway's reserve for it comes down."""
    stages = [StageTrace.model_validate(r) for r in generate(1200, seed=11)]
    new = sorted({s.app for s in stages})[0]
    predictor = Predictor.train([s for s in stages if s.app != new], FeaturizerConfig(use_embedding=False), FAST_MODEL)
    body = {"prompt": "answer in one word", "max_tokens": 4096}

    async def scenario():
        local = LocalPredictor(predictor, timeout_s=5)
        config = GatewayConfig(nodes=[{"name": "a", "url": "http://a"}], traces={"dir": str(tmp_path)})
        gateway = Gateway(config, predictor=local)
        await local.start()
        jobs = []
        try:
            for i in range(60):
                job = await gateway.prepare(StageMeta(f"n{i}", "0", role="agent", app=new, final=True), body)
                gateway.record(
                    job, body, CallResult(prompt_tokens=5, output_tokens=3, finish_reason="stop"), None, None
                )
                jobs.append(job)
        finally:
            await local.aclose()
        return jobs

    jobs = asyncio.run(scenario())
    assert {j.prediction.fallback_level for j in jobs} == {NEW_APP}
    assert len({j.prediction.tokens_reserve for j in jobs}) == 1  # the model's answer, not rescaled by the predictor
    first, last = jobs[0].request, jobs[-1].request
    assert last.tokens_reserve < first.tokens_reserve and last.tokens_reserve >= last.tokens_pred
