"""A ready simulated stage as the scheduler sees it: its `StageRequest`, built as the gateway builds it
(`serving.core.request.stage_request`) at the cost model's pace (`ModelPace`).

The request carries the workflow's arrival, deadline and attained service, its predicted remaining work (from the
workflow prediction made at readiness, else the app's ended workflows), the tool time the app's ended workflows waited
from this position on, and whether its context is kept for it.
"""

from __future__ import annotations

from dataclasses import replace

from maestro.own_reserve import OwnReserveLevels
from maestro.prediction import WorkflowFallbackLevel
from serving.core.request import StageRequest, WorkflowInfo, stage_request, workflow_remaining_s
from serving.core.scheduler.remaining import RemainingWork, remaining_after_s
from serving.sim.costmodel import CostModel
from serving.sim.gpu_pace import ModelPace
from serving.sim.ready import NOTHING_LEFT
from serving.sim.workload import SimStage


def ready_request(stage: SimStage, now: float, cost: CostModel, remaining_work: RemainingWork) -> StageRequest:
    """The ready stage as the scheduler sees it, built as the gateway builds it (`serving.core.request`)."""
    w = stage.workflow
    position = w.num_ready
    remaining_s = predicted_remaining_s(stage, cost, remaining_work)
    is_last = stage.remaining is NOTHING_LEFT
    info = WorkflowInfo(
        w.workflow_id,
        w.arrival_s,
        w.arrival_s + w.slo_s,
        w.interactive,
        w.attained_service_s,
        remaining_s,
        0.0 if is_last else remaining_work.tool_ahead_s(w.app, position),
        0.0 if is_last else remaining_work.tool_ahead_s(w.app, position, work=True),
    )
    # Continuum ranks programs whose KV is pinned ahead of the rest (PAPERS.md); fixed at enqueue. A kept context
    # is on the node its stage ran on, where routing sends the session's next stage.
    parent = w.stages[stage.session_parent] if stage.session_parent >= 0 else None
    is_pinned = parent is not None and parent.node is not None and parent in parent.node.pinned
    return stage_request(
        info,
        stage.stage_id,
        prompt_tokens=stage.prompt_tokens,
        tokens_pred=stage.tokens_pred,
        tokens_reserve=stage.tokens_reserve,
        max_tokens=stage.max_tokens,
        pace=ModelPace.of(cost, stage.model),
        ready_s=now,
        model=stage.model,
        is_kv_pinned=is_pinned,
        payload=stage,
    )


def predicted_remaining_s(stage: SimStage, cost: CostModel, remaining_work: RemainingWork) -> float:
    """The work predicted after this stage, by the gateway's rule (`remaining_after_s`): the workflow prediction made
    at readiness (each later call prefills about this stage's prompt) or what the app's ended workflows say (never
    the replay's future); a stage with no prediction goes by the history. An arm that reads no workflow estimate
    (`NOTHING_LEFT`: the `none` source, the no-remaining ablation) keeps its answer, 0 calls and tokens. Counts the
    stage as its workflow's next ready one (its position in `RemainingWork`)."""
    workflow, answer = stage.workflow, stage.remaining
    position, workflow.num_ready = workflow.num_ready, workflow.num_ready + 1

    def predicted_s() -> float:
        return workflow_remaining_s(
            ModelPace.of(cost, stage.model), stage.prompt_tokens, answer.wf_remaining_calls, answer.wf_remaining_tokens
        )

    if answer is NOTHING_LEFT:
        return predicted_s()
    level = WorkflowFallbackLevel.PRIOR if answer is None else answer.wf_fallback_level
    return remaining_after_s(level, predicted_s, remaining_work, workflow.workflow_id, workflow.app, position)


def own_reserve(levels: OwnReserveLevels, stage: SimStage) -> None:
    """A ready stage answered for an unseen app: its reserve rescaled by the app's own level (`OwnReserveLevels`)."""
    answer = stage.unseen_reserve
    if answer is not None:
        tokens = levels.reserve_tokens(stage.workflow.app, answer, stage.tokens_pred, stage.max_tokens)
        stage.size = replace(stage.size, tokens_reserve=tokens)


def observe_stage(
    remaining_work: RemainingWork, stage: SimStage, cost: CostModel, now: float, levels: OwnReserveLevels | None = None
) -> None:
    """A stage's call (and its tool, if any) ended at `now`: the history fed as the gateway feeds it
    (serving/gateway/record.py) — the call's service at the pace its workflow's attained service is counted in, and
    apart from it the tool's wall time, from the call's end to the tool's return; a stage answered for an unseen app
    also scores its answered reserve (`levels`)."""
    w = stage.workflow
    if levels is not None and stage.unseen_reserve is not None:
        levels.observe(w.app, stage.unseen_reserve, stage.output_tokens)
    remaining_work.observe(
        w.workflow_id, w.app, ModelPace.of(cost, stage.model).service_s(stage.prompt_tokens, stage.output_tokens)
    )
    if stage.is_tool_call:
        wall_s = now - stage.finished_s
        remaining_work.observe_tool(w.workflow_id, wall_s, min(wall_s, stage.tool_exec_s))
