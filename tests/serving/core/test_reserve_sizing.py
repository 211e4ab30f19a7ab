"""One reserve-sizing rule: the gateway's `prepare` and the simulator reserve the same tokens for the same answers,
and the margin rho is applied at most once (a calibrated reserve is used as is)."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest

from maestro.contract import StageTrace
from maestro.prediction import OutputSize
from pipelines.features import FeaturizerConfig
from pipelines.model import ModelConfig
from pipelines.predictor import NO_MODEL_PRIOR, Predictor
from pipelines.synth import generate
from serving.core.admission.sizing import (
    ReservationMode,
    is_calibrated,
    output_tokens_to_map,
    reserve_beside_turns,
    reserve_output_tokens,
)
from serving.core.systems import get_system
from serving.gateway.config import GatewayConfig, NodeConfig
from serving.gateway.core import Gateway
from serving.gateway.metadata import StageMeta
from serving.gateway.predict import LocalPredictor
from serving.sim.cluster import SimDispatcher
from serving.sim.engine import Simulator
from serving.sim.predictions import apply_prediction
from serving.sim.runner import RunConfig, build_workload
from serving.sim.scenarios import get_scenario

MAX_TOKENS = (8, 64, 300, 2000, 4096)
ROLES = ("coder", "planner", "a-role-never-seen")


@pytest.fixture(scope="module")
def trained() -> Predictor:
    """A small predictor without embeddings (trains in seconds): its answers carry a conformal reserve."""
    stages = [StageTrace.model_validate(r) for r in generate(300, seed=11)]
    fast = ModelConfig(
        folds=3, classifier=dict(n_estimators=40, learning_rate=0.1), regressor=dict(n_estimators=80, learning_rate=0.1)
    )
    return Predictor.train(stages, FeaturizerConfig(use_embedding=False), fast)


def gateway_jobs(tmp_path, predictor: Predictor | None, rho: float) -> list:
    """The gateway's `prepare` for each role × max_tokens, with the in-process predictor (model or no-model prior)."""
    config = GatewayConfig(
        nodes=[NodeConfig("a", "http://127.0.0.1:9")], kv={"rho": rho}, traces={"dir": str(tmp_path / "traces")}
    )

    async def prepare_all():
        local = LocalPredictor(predictor, timeout_s=30.0)
        await local.start()
        gateway = Gateway(config, local)
        try:
            return [
                await gateway.prepare(
                    StageMeta(f"w-{role}-{m}", "0", role=role),
                    {"messages": [{"role": "user", "content": f"step: write the parser for {role}"}], "max_tokens": m},
                )
                for role in ROLES
                for m in MAX_TOKENS
            ]
        finally:
            await local.aclose()
            gateway.traces.close()

    return asyncio.run(prepare_all())


def sim_reserves(jobs: list, rho: float) -> list[int]:
    """The simulator's reservation (Maestro: predicted) for the same answers, prompt sizes and max_tokens."""
    scenario = get_scenario("maestro-paper", 1)
    scenario.cluster.show_progress = False
    workflows = build_workload(scenario, RunConfig(policies=("maestro",), num_workflows=1), scenario.regimes[0])
    dispatch = SimDispatcher(Simulator(scenario.cluster, get_system("maestro"), workflows))
    stage = workflows[0].stages[0]
    reserves = []
    for job in jobs:
        stage.prompt_tokens, stage.max_tokens = job.request.prompt_tokens, job.request.max_tokens
        apply_prediction(stage, job.prediction, rho)
        reserves.append(dispatch._reserve_tokens(stage))
    return reserves


@pytest.mark.parametrize("has_model", [True, False], ids=["model", "no-model-prior"])
def test_the_gateway_and_the_simulator_reserve_the_same_tokens(tmp_path, trained, has_model):
    jobs = gateway_jobs(tmp_path, trained if has_model else None, rho=0.2)
    assert {is_calibrated(j.prediction) for j in jobs} == {has_model}
    assert [j.reserve_tokens for j in jobs] == sim_reserves(jobs, rho=0.2)
    capped = [j.request.tokens_reserve == j.request.max_tokens for j in jobs]
    assert any(capped) and not all(capped)  # both sides of the max_tokens cap are compared


def test_rho_leaves_a_calibrated_reserve_unchanged_and_widens_a_prior_once(tmp_path, trained):
    for rho in (0.0, 0.5):
        model_jobs = gateway_jobs(tmp_path / f"m{rho}", trained, rho)
        for job in model_jobs:
            p, m = job.prediction, job.request.max_tokens
            assert job.request.tokens_reserve == max(1, min(m, max(p.tokens_pred, p.tokens_reserve)))
        prior_jobs = gateway_jobs(tmp_path / f"p{rho}", None, rho)
        for job in prior_jobs:
            assert job.prediction.tokens_reserve == math.ceil(NO_MODEL_PRIOR.tokens_upper)
            widened = math.ceil(NO_MODEL_PRIOR.tokens_upper * (1 + rho))
            assert job.request.tokens_reserve == min(job.request.max_tokens, widened)


def test_the_sizing_rule_and_the_reservation_modes():
    assert reserve_output_tokens(100, 500, 4096, is_calibrated=True, rho=0.5) == 500
    assert reserve_output_tokens(100, 500, 4096, is_calibrated=False, rho=0.5) == 750
    assert reserve_output_tokens(100, 500, 600, is_calibrated=False, rho=0.5) == 600  # capped at max_tokens
    assert reserve_output_tokens(300, 200, 4096, is_calibrated=True) == 300  # never below the point estimate
    assert reserve_output_tokens(0, 0, 4096, is_calibrated=True) == 1
    with pytest.raises(ValueError, match="rho"):
        reserve_output_tokens(1, 1, 10, is_calibrated=False, rho=1.5)
    assert output_tokens_to_map(ReservationMode.MAX_LEN, 500, 4096, generated_tokens=96) == 4000
    assert output_tokens_to_map(ReservationMode.PREDICTED, 500, 4096, generated_tokens=96) == 404
    assert output_tokens_to_map(ReservationMode.PROJECTED, 500, 4096) == 500
    assert output_tokens_to_map(ReservationMode.PREDICTED, 500, 4096, generated_tokens=700) == 1  # outran it
    assert output_tokens_to_map(ReservationMode.ON_DEMAND, 500, 4096, chunk_tokens=16) == 16


def test_a_predicted_reserve_maps_its_point_for_a_turn_and_beside_turns():
    assert reserve_beside_turns(100, 500, is_beside_turns=True) == 100
    assert reserve_beside_turns(100, 500, is_beside_turns=False) == 500
    assert reserve_beside_turns(600, 500, is_beside_turns=True) == 500  # never above the reserve
    scenario = get_scenario("maestro-paper", 1)
    scenario.cluster.show_progress = False
    workflows = build_workload(scenario, RunConfig(policies=("maestro",), num_workflows=3), scenario.regimes[0])
    batch, turn = workflows[0].stages[0], workflows[1].stages[0]
    batch.workflow.interactive, turn.workflow.interactive = False, True
    for stage in (batch, turn):
        stage.prompt_tokens, stage.max_tokens, stage.generated_tokens = 1000, 4096, 0
        stage.size = OutputSize(tokens_pred=100, tokens_reserve=500)
    with_turn, batch_only = SimpleNamespace(running=[turn]), SimpleNamespace(running=[batch])
    maestro = get_system("maestro")
    dispatch = SimDispatcher(Simulator(scenario.cluster, maestro, workflows))
    assert dispatch._reserve_tokens(batch, batch_only) == 1500  # no turn to act on: the sized reserve
    assert dispatch._reserve_tokens(batch, with_turn) == 1100  # batch work on a node running turns: its point
    assert dispatch._reserve_tokens(turn, batch_only) == 1100  # a turn: its point
    for system in (maestro.with_overrides(maps_point_beside_turns=False), get_system("maestro-slack")):
        assert SimDispatcher(Simulator(scenario.cluster, system, workflows))._reserve_tokens(turn, with_turn) == 1500
    on_demand = maestro.with_overrides(reservation=ReservationMode.ON_DEMAND)
    chunk = scenario.cluster.grow_chunk_tokens
    assert (
        SimDispatcher(Simulator(scenario.cluster, on_demand, workflows))._reserve_tokens(batch, with_turn)
        == 1000 + chunk
    )
