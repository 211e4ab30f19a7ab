"""A call made a `Job` (`Gateway.prepare`): the stage predicted, its prompt and output sized, its KV reserve chosen,
and its `StageRequest` built through `serving.core.request.stage_request`, as the simulator builds it. An unseen app's
reserve is rescaled by its own level (`Gateway.own_reserves`, `maestro.own_reserve.OwnReserveLevels`), as the simulator
and predictor_service do.

The request carries the workflow's arrival, deadline and attained service, its predicted remaining work
(`Gateway.workflow_remaining_s`), the node holding its session's context and whether it is held for it there
(`Sessions.arrive`).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from maestro.contract import prompt_text
from maestro.own_reserve import unseen_reserve
from serving.core.admission.sizing import is_calibrated, output_tokens_to_map, reserve_output_tokens
from serving.core.request import WorkflowInfo, stage_request
from serving.gateway.jobs import Arrival, Job
from serving.gateway.metadata import StageMeta

if TYPE_CHECKING:
    from serving.gateway.core import Gateway


def predictor_stage(meta: StageMeta, prompt: str | list) -> dict:
    """The stage as the predictor reads it."""
    return {
        "workflow_id": meta.workflow_id,
        "stage_id": meta.stage_id,
        "role": meta.role,
        "prompt": prompt,
        "app": meta.app,
        "parent_ids": list(meta.parent_ids),
        "interactive": meta.interactive,
    }


async def prepare_job(gateway: Gateway, meta: StageMeta, body: dict, arrival: Arrival | None = None) -> Job:
    """Predict the stage and size its KV reserve; the Job is ready for `dispatcher.submit`. `arrival`: when its
    call was read (now if not given); the workflow's first arrival and the stage's ready time are taken from it.

    `predict_s` is the predictor's wait: up to its answer's `answered_s` where it says (a local model's finish, or
    the deadline where the prior answered), so it stays within `predictor.timeout_s` however late the event loop
    gets back to the call."""
    arrival = arrival or Arrival.now()
    prompt = body.get("messages") if "messages" in body else str(body.get("prompt", ""))
    started = time.monotonic()
    answer = (await gateway.predictor.predict([predictor_stage(meta, prompt)]))[0]
    prediction, predict_s = answer.prediction, (answer.answered_s or time.monotonic()) - started
    num_chars, num_messages = len(prompt_text(prompt)), len(prompt) if isinstance(prompt, list) else 0
    prompt_tokens = gateway.sizer.estimate(num_chars, num_messages)
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or gateway.output_cap(prompt_tokens))
    sized = reserve_output_tokens(
        prediction.tokens_pred,
        prediction.tokens_reserve,
        max_tokens,
        is_calibrated=is_calibrated(prediction),
        rho=gateway.config.kv.rho,
    )
    # an unseen app's answer: rescaled by the app's own level once its finished stages give one, as in the simulator
    unseen = unseen_reserve(prediction.fallback_level, sized, gateway.predictor.new_app_alpha)
    if unseen is not None:
        sized = gateway.own_reserves.reserve_tokens(meta.app or "", unseen, prediction.tokens_pred, max_tokens)
    reserve = output_tokens_to_map(gateway.system.reservation, sized, max_tokens)
    now = time.monotonic()
    workflow = gateway.workflow(meta.workflow_key, arrival.monotonic_s)
    # Continuum ranks a stage whose context is kept for it first: held on a node during its tool call (sessions.py),
    # until this call's arrival lets the hold go.
    is_kv_pinned = any(meta.workflow_key in n.kv.held for n in gateway.nodes)
    home = gateway.sessions.arrive(meta.workflow_key, now)
    slo_s = meta.slo_s or gateway.config.system.slo_s
    position = workflow.next_position()
    remaining_s = gateway.workflow_remaining_s(prediction, prompt_tokens, meta.workflow_key, meta.app or "", position)
    info = WorkflowInfo(
        meta.workflow_key,
        workflow.start_s,
        workflow.start_s + slo_s if slo_s else math.inf,
        meta.interactive,
        workflow.attained_s,
        remaining_s,
        gateway.remaining_work.tool_ahead_s(meta.app or "", position),
        gateway.remaining_work.tool_ahead_s(meta.app or "", position, work=True),  # the same: walls are all it sees
    )
    request = stage_request(
        info,
        meta.stage_id,
        prompt_tokens=prompt_tokens,
        tokens_pred=prediction.tokens_pred,
        tokens_reserve=reserve,
        max_tokens=max_tokens,
        pace=gateway.pace,
        ready_s=arrival.monotonic_s,
        is_kv_pinned=is_kv_pinned,
        home_node=home.node,
        is_home_held=home.is_held,
        # it waits for its home at most what re-prefilling its context elsewhere would take (then any node may)
        home_wait_s=prompt_tokens * gateway.sessions.prefill_s_per_token,
    )
    job = Job(
        meta=meta,
        request=request,
        reserve_tokens=prompt_tokens + reserve,
        prediction=prediction,
        prediction_source=answer.source.value,
        predict_s=max(0.0, predict_s),
        arrival=arrival,
        prompt_chars=num_chars,
        num_messages=num_messages,
        unseen_reserve=unseen,
    )
    request.payload = job
    return job
