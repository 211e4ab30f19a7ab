"""Where a simulated session lives: the node holding its context (session affinity), and the cap's place it holds.

A session's next stage goes to the node that holds its context while the context's KV is kept there or is still in
the prefix cache of its model there (one put to sleep has lost it), else only if that node could start it at once:
the gateway's rule (`serving.core.dispatch.goes_home`). A session holds one place in the session cap (MARS: the AIMD
window) of the node it runs on now; moving, ending or being dropped gives that place back.
"""

from __future__ import annotations

from serving.core.dispatch import goes_home
from serving.sim.node import SimNode
from serving.sim.slot import SimSlot, parent_of
from serving.sim.workload import SimStage


def session_home(stage: SimStage, slots: dict[SimNode, SimSlot]) -> SimNode | None:
    """The node holding the session's context, when its next stage should go there (session affinity, the dispatch
    core's `goes_home`): while the context is held there — its KV kept, or still in the node's prefix cache of a model
    still running there (a model put to sleep takes its KV cache with it, as vLLM's sleep mode does) — and once not,
    only if the node could start the stage at once."""
    parent = parent_of(stage)
    node = parent.node if parent is not None else None
    if node is None:
        return None
    is_held = parent in node.pinned or (parent in node.cache and node.residency.runs(stage.model))
    return node if goes_home(is_held, lambda: slots[node].can_start_now(stage.request)) else None


def occupy(node: SimNode, workflow) -> None:
    """A session holds its cap's place on the node it runs on now; moving gives the old node's back."""
    if workflow.session_node is not node:
        leave(workflow)
        workflow.session_node = node
    if node.cap is not None:
        node.cap.started(workflow.workflow_id)


def leave(workflow) -> None:
    """Give back the cap's place a session holds (it moved, ended or was dropped)."""
    node = workflow.session_node
    if node is not None:
        if node.cap is not None:
            node.cap.end(workflow.workflow_id)
        workflow.session_node = None
