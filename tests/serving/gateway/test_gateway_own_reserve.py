"""The gateway sizes an unseen app's reserve from its own finished stages (`sizing.OwnReserveLevels`), as the
simulator does: a `NEW_APP` answer's reserve stands until the app's finished stages give a level, then shrinks to
it; an app the model was calibrated on keeps its reserve; a stage that has not finished (or failed) scores nothing."""

from __future__ import annotations

import asyncio

from maestro.prediction import FallbackLevel, Prediction
from serving.core.admission.sizing import OwnReserveLevels, UnseenReserve, reserve_output_tokens
from serving.gateway.answers import Source, StageAnswer
from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway
from serving.gateway.metadata import StageMeta
from serving.gateway.outcome import CallResult
from serving.gateway.predict import LocalPredictor

ALPHA = 0.045  # 22 finished stages give a finite (1 − α) rank
ANSWERED_RESERVE_TOKENS, OUTPUT_TOKENS, MAX_TOKENS = 800, 40, 2000
BODY = {"messages": [{"role": "user", "content": "go"}], "max_tokens": MAX_TOKENS}


class AnswersByApp(LocalPredictor):
    """A model that answers app "new" at `NEW_APP` and every other app at `ROLE`, the same reserve for all."""

    def __init__(self):
        super().__init__()
        self.new_app_alpha = ALPHA

    async def predict(self, stages: list[dict]) -> list[StageAnswer]:
        level = {"new": FallbackLevel.NEW_APP}
        return [
            StageAnswer(
                Prediction(
                    s["workflow_id"],
                    s["stage_id"],
                    0.0,
                    level.get(s["app"], FallbackLevel.ROLE),
                    tokens_pred=10,
                    tokens_reserve=ANSWERED_RESERVE_TOKENS,
                ),
                Source.MODEL,
            )
            for s in stages
        ]


class ServiceAnswers(AnswersByApp):
    """The same answers from a predictor that rescales an unseen app's reserve itself (predictor_service)."""

    def __init__(self):
        super().__init__()
        self.new_app_alpha = None


def gateway_of(tmp_path, predictor: LocalPredictor | None = None) -> Gateway:
    config = GatewayConfig(
        nodes=[{"name": "a", "url": "http://a"}], traces={"dir": str(tmp_path)}, system={"name": "maestro"}
    )
    return Gateway(config, predictor=predictor or AnswersByApp())


async def finish(gateway: Gateway, app: str, i: int, output_tokens: int | None = OUTPUT_TOKENS) -> int:
    """A stage of `app` prepared, then ended with `output_tokens` (None: failed, no usage); its reserve."""
    job = await gateway.prepare(StageMeta(f"{app}{i}", "s", role="agent", app=app, final=True), BODY)
    result = CallResult(prompt_tokens=5, output_tokens=output_tokens, finish_reason="stop")
    if output_tokens is None:
        result.error = "upstream failed"
    gateway.record(job, BODY, result, None, None)
    return job.request.tokens_reserve


def test_an_unseen_apps_reserve_shrinks_to_its_own_level_and_a_calibrated_apps_never_changes(tmp_path):
    async def scenario():
        gateway = gateway_of(tmp_path)
        reserves: dict[str, list[int]] = {"new": [], "seen": []}
        for i in range(30):
            for app in reserves:
                reserves[app].append(await finish(gateway, app, i))
        return reserves

    reserves = asyncio.run(scenario())
    assert set(reserves["seen"]) == {ANSWERED_RESERVE_TOKENS}
    # the 22 first stages of "new" are sized before its own level exists; the rest at it: all its stages ended at
    # OUTPUT_TOKENS, so the level maps the answered reserve to exactly that
    assert reserves["new"][:22] == [ANSWERED_RESERVE_TOKENS] * 22
    assert reserves["new"][22:] == [OUTPUT_TOKENS] * 8


def test_the_gateway_and_the_simulator_rescale_alike(tmp_path):
    """The same answers and outputs fed to the gateway and to an `OwnReserveLevels` as the simulator feeds its own
    (`serving.sim.stage_request`) give the same reserves; outputs spread so the level is not just the one value."""
    outputs = [30 + 7 * i for i in range(40)]

    async def scenario():
        gateway = gateway_of(tmp_path)
        return [await finish(gateway, "new", i, out) for i, out in enumerate(outputs)]

    gateway_reserves = asyncio.run(scenario())
    levels, answer = OwnReserveLevels(), UnseenReserve(ANSWERED_RESERVE_TOKENS, ALPHA)
    expected = []
    for out in outputs:
        expected.append(levels.reserve_tokens("new", answer, 10, MAX_TOKENS))
        levels.observe("new", answer, out)
    assert gateway_reserves == expected and expected[-1] != ANSWERED_RESERVE_TOKENS
    assert reserve_output_tokens(10, ANSWERED_RESERVE_TOKENS, MAX_TOKENS, is_calibrated=True) == answer.reserve_tokens


def test_a_stage_that_failed_scores_nothing(tmp_path):
    async def scenario():
        gateway = gateway_of(tmp_path)
        for i in range(30):
            await finish(gateway, "new", i, output_tokens=None)
        return await finish(gateway, "new", 30), gateway

    reserve, gateway = asyncio.run(scenario())
    assert reserve == ANSWERED_RESERVE_TOKENS
    assert gateway.own_reserves.level("new", ALPHA) is None


def test_answers_a_predictor_rescales_itself_are_left_as_they_are(tmp_path):
    async def scenario():
        gateway = gateway_of(tmp_path, ServiceAnswers())
        return [await finish(gateway, "new", i) for i in range(30)]

    assert asyncio.run(scenario()) == [ANSWERED_RESERVE_TOKENS] * 30
