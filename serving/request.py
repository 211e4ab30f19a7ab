"""What the scheduler orders: one ready stage of a workflow, with what is known about it before it runs."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class StageRequest:
    """A stage waiting for (or holding) a GPU slot.

    Times are absolute seconds on the serving clock. `pred_service_s` is the predicted time of
    this stage alone (prefill + predicted decode); `workflow_remaining_s` adds what the workflow is
    predicted to need after it. `attained_service_s` is what the workflow has already received.
    """

    workflow_id: str
    stage_id: str
    model: str = ""
    interactive: bool = False
    workflow_arrival_s: float = 0.0
    ready_s: float = 0.0
    deadline_s: float = float("inf")
    prompt_tokens: int = 0
    tokens_pred: int = 0
    tokens_reserve: int = 0
    max_tokens: int = 4096
    pred_service_s: float = 0.0
    workflow_remaining_s: float = 0.0
    attained_service_s: float = 0.0
    is_preempted: bool = False
    is_kv_pinned: bool = False
    home_node: str = ""  # the node holding the session's context (prefix cache): the first choice where it may start
    payload: object = field(default=None, repr=False)  # the caller's own object (the simulator's stage)
    # Scheduler bookkeeping (lazy deletion): the heap entry that is live for this request, -1 if none.
    queue_seq: int = -1
