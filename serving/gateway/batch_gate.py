"""Maestro's batch-cost gate live (serving/admission/batch_cost.py): a vLLM node's running stages and measured pace.

The simulator reads its cost model; here the node's own measurements stand in: the pace of its finished calls
(output tokens ÷ call time, prefill and queueing in vLLM included) is what a running stage gets now, the fastest of
its recent calls is the bare step, and dispatch → first token is what a new stage's prefill stalls the others for.
A running stage's progress is its time since dispatch at that pace. Without deadlines (no SLO given) no stage is
ever endangered, and without measurements the gate admits: it only holds back work on evidence.
"""
from __future__ import annotations

from serving.admission.batch_cost import BatchCostGate, RunningBatch, candidate_cost, fewest_remaining_tokens
from serving.gateway.nodes import Node
from serving.request import StageRequest


def running_batch(node: Node, now: float) -> RunningBatch | None:
    """The node's running stages as the gate reads them; None until the node has measured its pace."""
    pace = node.pace
    if not node.running_requests or pace.mean_pace <= 0 or not pace.recent_paces:
        return None
    pace_s, step_s = 1.0 / pace.mean_pace, 1.0 / max(pace.recent_paces)
    requests = list(node.running_requests)
    remaining = [fewest_remaining_tokens(r.tokens_pred, r.tokens_reserve,
                                  max(0.0, now - node.running_requests[r] - pace.first_token_delay_s) / pace_s)
                 for r in requests]
    return RunningBatch.of(remaining, [r.deadline_s for r in requests], pace_s, min(step_s, pace_s), now)


def refusal(gate: BatchCostGate, node: Node, request: StageRequest, now: float) -> str | None:
    """"slack" when starting `request` on `node` now would push a running stage past its deadline, else None."""
    batch = running_batch(node, now)
    if batch is None:
        return None
    # Live, a node's added step time is not measured apart from its pace (which the stalls already stretch): 0.
    cost = candidate_cost(request.deadline_s, now, node.pace.first_token_delay_s, 0.0, request.tokens_pred, 0,
                          batch.pace_s_per_token)
    return None if gate.admits(batch, *cost) else "slack"
