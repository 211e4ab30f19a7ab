"""One `StageRequest` builder for the gateway and the simulator: predicted and attained service in one unit."""

from __future__ import annotations

import math

import pytest

from serving.core.request import TokenPace, WorkflowInfo, stage_request
from serving.gateway.workflows import DECODE_S_PER_TOKEN, SERVICE_PACE
from serving.sim.costmodel import CostModel, CostModelConfig
from serving.sim.gpu_pace import ModelPace

COST = CostModel(CostModelConfig())


@pytest.mark.parametrize("pace", [SERVICE_PACE, ModelPace.of(COST, "llama-3-8b")], ids=["live", "simulated"])
def test_predicted_service_is_the_pace_of_the_prompt_and_the_capped_prediction(pace):
    workflow = WorkflowInfo(
        "w", arrival_s=1.0, deadline_s=61.0, interactive=True, attained_service_s=2.5, remaining_s=7.0
    )
    request = stage_request(
        workflow,
        "s",
        prompt_tokens=300,
        tokens_pred=900,
        tokens_reserve=512,
        max_tokens=512,
        pace=pace,
        ready_s=3.0,
        is_kv_pinned=True,
        home_node="a",
    )
    assert request.tokens_pred == 512 and request.pred_service_s == pytest.approx(pace.service_s(300, 512))
    assert (request.workflow_arrival_s, request.deadline_s, request.ready_s) == (1.0, 61.0, 3.0)
    assert (request.attained_service_s, request.workflow_remaining_s) == (2.5, 7.0)
    assert request.interactive and request.is_kv_pinned and request.home_node == "a"


def test_the_live_pace_counts_output_tokens_and_the_simulated_one_the_cost_model():
    assert SERVICE_PACE == TokenPace(DECODE_S_PER_TOKEN) and SERVICE_PACE.service_s(10_000, 100) == pytest.approx(2.0)
    model = COST.model("llama-3-8b")
    simulated = ModelPace.of(COST, "llama-3-8b").service_s(1000, 100)
    assert simulated == pytest.approx(COST.prefill_s(model, 1000) + COST.decode_s(model, 100, 1000))
    assert math.isinf(WorkflowInfo("w", 0.0).deadline_s)  # no SLO: no deadline
