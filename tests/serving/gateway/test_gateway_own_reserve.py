"""The gateway sizes an unseen app's reserve from its own finished stages (`maestro.own_reserve.OwnReserveLevels`),
as the simulator and predictor_service do: a `NEW_APP` answer's reserve stands until the app's finished stages give a
level, then shrinks to it; an app the model was calibrated on keeps its reserve; a stage that has not finished (or
failed) scores nothing."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from maestro.own_reserve import unseen_reserve
from maestro.prediction import FallbackLevel, OutputSize, Prediction
from predictor_service.online import OnlineCorrection, coverage_group
from serving.core.admission.sizing import reserve_output_tokens
from serving.core.systems import get_system
from serving.gateway.answers import Source, StageAnswer
from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway
from serving.gateway.metadata import StageMeta
from serving.gateway.outcome import CallResult
from serving.gateway.predict import LocalPredictor
from serving.sim.engine import ClusterConfig, Simulator
from tests.serving.core.test_own_reserve import chain

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


class ServiceRule(ServiceAnswers):
    """The answers as predictor_service serves them: its `OnlineCorrection` rescales a NEW_APP reserve and learns from
    the stages the gateway reports (`observe`), as the service's engine does behind HTTP."""

    def __init__(self):
        super().__init__()
        self.corrections = OnlineCorrection(alpha=ALPHA, clock=lambda: 0.0)

    async def predict(self, stages: list[dict]) -> list[StageAnswer]:
        served = []
        for s, a in zip(stages, await super().predict(stages)):
            p, group = a.prediction, coverage_group(s["app"], s["role"], a.prediction.history)
            is_new = p.fallback_level is FallbackLevel.NEW_APP
            tokens_pred, tokens_reserve, *_ = self.corrections.apply(s["role"], 10, p.tokens_reserve, group, is_new)
            served.append(replace(a, prediction=replace(p, tokens_pred=tokens_pred, tokens_reserve=tokens_reserve)))
        return served

    def observe(self, stage: dict) -> None:
        group, is_new = coverage_group(stage["app"], stage["role"], "full"), stage["app"] == "new"
        self.corrections.update(stage["role"], 10, stage["output_tokens"], ANSWERED_RESERVE_TOKENS, group, is_new)


def simulated_reserves(outputs: list[int]) -> list[int]:
    """The simulator's path: a chain of "new" stages answered the same NEW_APP reserve, each ready once the one before
    has finished with its output; each stage's reserve at readiness (`own_reserve`, fed by `observe_stage`)."""
    workflow = chain("new", len(outputs), 1)
    for stage, out in zip(workflow.stages, outputs):
        stage.output_tokens = out

    def predict(stage) -> None:
        stage.size = OutputSize(tokens_pred=10, tokens_reserve=ANSWERED_RESERVE_TOKENS)
        stage.unseen_reserve = unseen_reserve(FallbackLevel.NEW_APP, ANSWERED_RESERVE_TOKENS, ALPHA)

    sim = Simulator(
        ClusterConfig(num_nodes=1, show_progress=False), get_system("maestro"), [workflow], predict_ready=predict
    )
    seen, make_ready = {}, sim.make_ready

    def recording(stage) -> None:
        make_ready(stage)
        seen[stage.index] = stage.tokens_reserve

    sim.make_ready = recording
    sim.run()
    return [seen[i] for i in range(len(outputs))]


def test_the_service_the_gateway_and_the_simulator_size_an_unseen_app_alike(tmp_path):
    """The same answers and outputs give the same reserves, stage by stage, from the gateway with its in-process
    model, from the gateway on predictor_service's rule (which the gateway leaves as it is) and from the simulator;
    outputs spread so the level is not just the one value."""
    outputs = [30 + 7 * i for i in range(40)]

    async def scenario(predictor):
        gateway = gateway_of(tmp_path, predictor)
        return [await finish(gateway, "new", i, out) for i, out in enumerate(outputs)]

    in_process, service = asyncio.run(scenario(AnswersByApp())), asyncio.run(scenario(ServiceRule()))
    assert in_process == service == simulated_reserves(outputs)
    assert in_process[:22] == [ANSWERED_RESERVE_TOKENS] * 22 and len(set(in_process[22:])) > 1
    assert reserve_output_tokens(10, ANSWERED_RESERVE_TOKENS, MAX_TOKENS, is_calibrated=True) == ANSWERED_RESERVE_TOKENS


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
