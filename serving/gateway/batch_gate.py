"""Maestro's batch-cost gate live (serving/core/admission/batch_cost.py): a vLLM node described from what its calls
measured.

The simulator reads its clock and cost model; here the node's own measurements stand in: the pace of its finished
calls (output tokens ÷ call time, prefill and queueing in vLLM included) is what a running stage gets now, the fastest
of its recent calls is the bare step, and dispatch → first token is what a new stage's prefill stalls the others for.
The gateway does not count a running stage's tokens, nor time a step apart from the pace: `NodeState`'s defaults
estimate the first from the stage's dispatch, and take no added step time for the second. Without deadlines (no SLO
given) no stage is ever endangered, and without measurements the gate admits: it only holds back work on evidence.
"""

from __future__ import annotations

from serving.core.admission.batch_cost import BatchCostGate, Candidate, NodeState, RunningStage
from serving.core.request import StageRequest
from serving.gateway.nodes import Node


def node_state(node: Node, now: float) -> NodeState:
    """The node as the gate reads it: its running stages (each since its dispatch, with its workflow's class), its
    measured pace."""
    pace = node.pace
    is_measured = pace.mean_pace > 0 and bool(pace.recent_paces)
    running = tuple(
        RunningStage(
            r.deadline_s,
            started_s,
            is_interactive=r.interactive,
            tokens_pred=r.tokens_pred,
            tokens_reserve=r.tokens_reserve,
        )
        for r, started_s in node.running_requests.items()
    )
    return NodeState(
        now,
        running,
        1.0 / pace.mean_pace if is_measured else 0.0,
        1.0 / max(pace.recent_paces) if is_measured else 0.0,
        pace.first_token_delay_s,
    )


def candidate(request: StageRequest) -> Candidate:
    """A queued stage asking to start: its deadline and predicted output (its stall: the node's first-token delay)."""
    return Candidate(
        request.deadline_s,
        is_interactive=request.interactive,
        tokens_pred=request.tokens_pred,
        tokens_reserve=request.tokens_reserve,
    )


def refusal(gate: BatchCostGate, node: Node, request: StageRequest, now: float) -> str | None:
    """ "slack" when starting `request` on `node` now would push a running stage past its deadline, else None."""
    if not node.running_requests:
        return None
    return None if gate.admits_candidate(node_state(node, now), candidate(request)) else "slack"
