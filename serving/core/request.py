"""What the scheduler orders: one ready stage of a workflow, with what is known about it before it runs.

The gateway and the simulator build it the same way (`stage_request`): a stage's predicted service and its workflow's
attained service are both `ServicePace.service_s` of the stage's tokens, and its workflow's predicted remaining work
`workflow_remaining_s` of the workflow prediction, so every policy reads one unit live and simulated — seconds of a
stage alone on a node (no queueing, no batching slowdown).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from maestro.prediction import NO_SIZE, OutputSize


@dataclass(eq=False, slots=True)
class StageRequest:
    """A stage waiting for (or holding) a GPU slot.

    Times are absolute seconds on the serving clock. `size` is its output as sized for it: tokens_pred its prediction
    capped at max_tokens (`stage_request`), tokens_reserve the reserve from serving/core/admission/sizing.py, not the
    predictor's bound; `tokens_pred` and `tokens_reserve` read it. `pred_service_s` is the predicted time of
    this stage alone (`ServicePace.service_s` of its prompt and predicted output); `workflow_remaining_s` adds what
    the workflow is predicted to need after it. `attained_service_s` is what the workflow has already received, in
    the same unit. `remaining_tool_s` is the tool time its workflow is predicted to wait from this stage on (its own
    tool included): no node's service, but its workflow cannot end before it.
    """

    workflow_id: str
    stage_id: str
    model: str = ""
    interactive: bool = False
    workflow_arrival_s: float = 0.0
    ready_s: float = 0.0
    deadline_s: float = float("inf")
    prompt_tokens: int = 0
    size: OutputSize = NO_SIZE
    max_tokens: int = 4096
    pred_service_s: float = 0.0
    workflow_remaining_s: float = 0.0
    attained_service_s: float = 0.0
    remaining_tool_s: float = 0.0
    remaining_tool_work_s: float = 0.0  # of `remaining_tool_s`, the seconds its tools run on a host CPU
    is_preempted: bool = False
    is_shed: bool = False  # its workflow was triaged out: it cannot make its deadline beside the rest (triage.py)
    is_kv_pinned: bool = False  # the workflow's context is kept on a node for this stage (Continuum ranks it first)
    home_node: str = ""  # the node holding the session's context (prefix cache): the first choice where it may start
    is_home_held: bool = False  # the context is held on `home_node` for this stage: it waits there (dispatch.goes_home)
    home_wait_s: float = float("inf")  # how long after `ready_s` it waits for its held home, then any node may take it
    payload: object = field(default=None, repr=False)  # the caller's own object (the simulator's stage)
    # Scheduler bookkeeping (lazy deletion): the heap entry that is live for this request, -1 if none.
    queue_seq: int = -1

    @property
    def tokens_pred(self) -> int:
        return self.size.tokens_pred

    @property
    def tokens_reserve(self) -> int:
        return self.size.tokens_reserve


class ServicePace(Protocol):
    """How long a stage takes alone on a node: the unit of predicted, attained and remaining service."""

    def service_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """Seconds of a stage with this many prompt and output tokens, alone on the node."""


@dataclass(frozen=True)
class TokenPace:
    """A flat pace: seconds per output token, the same on every node (prefill not counted).

    The gateway orders a stage before it picks its node, and a node's measured pace follows its load, which would
    make a stage's key grow while it waits; a fixed per-token pace keeps the order by predicted work.
    """

    decode_s_per_token: float

    def service_s(self, prompt_tokens: int, output_tokens: int) -> float:
        return output_tokens * self.decode_s_per_token


def workflow_remaining_s(
    pace: ServicePace, prompt_tokens: int, wf_remaining_calls: float, wf_remaining_tokens: float
) -> float:
    """The service a workflow is predicted to need after a stage, from the workflow prediction made when the stage
    became ready (`maestro.prediction.WorkflowRemaining`): each call still to come prefills about this stage's prompt,
    and together they produce the remaining output tokens."""
    return wf_remaining_calls * pace.service_s(prompt_tokens, 0) + pace.service_s(0, round(wf_remaining_tokens))


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """What is known of a stage's workflow when the stage becomes ready."""

    workflow_id: str
    arrival_s: float
    deadline_s: float = math.inf  # the workflow's arrival + its SLO
    interactive: bool = False
    attained_service_s: float = 0.0  # Σ `ServicePace.service_s` of its finished stages
    remaining_s: float = 0.0  # predicted service after this stage (serving/core/scheduler/remaining.py)
    remaining_tool_s: float = 0.0  # predicted tool time from this stage on (`RemainingWork.tool_ahead_s`)
    remaining_tool_work_s: float = 0.0  # of it, the tools' work on a host CPU (`tool_ahead_s(..., work=True)`)


def stage_request(
    workflow: WorkflowInfo,
    stage_id: str,
    *,
    prompt_tokens: int,
    tokens_pred: int,
    tokens_reserve: int,
    max_tokens: int,
    pace: ServicePace,
    ready_s: float,
    model: str = "",
    is_kv_pinned: bool = False,
    home_node: str = "",
    is_home_held: bool = False,
    home_wait_s: float = float("inf"),
    payload: object = None,
) -> StageRequest:
    """A ready stage as the scheduler sees it; its predicted output is capped at `max_tokens`, and its predicted
    service is `pace.service_s` of its prompt and that output."""
    tokens_pred = min(max_tokens, tokens_pred)
    return StageRequest(
        workflow.workflow_id,
        stage_id,
        model,
        workflow.interactive,
        workflow.arrival_s,
        ready_s,
        workflow.deadline_s,
        prompt_tokens,
        OutputSize(tokens_pred=tokens_pred, tokens_reserve=tokens_reserve),
        max_tokens,
        pace.service_s(prompt_tokens, tokens_pred),
        workflow.remaining_s,
        workflow.attained_service_s,
        workflow.remaining_tool_s,
        workflow.remaining_tool_work_s,
        is_kv_pinned=is_kv_pinned,
        home_node=home_node,
        is_home_held=is_home_held,
        home_wait_s=home_wait_s,
        payload=payload,
    )
