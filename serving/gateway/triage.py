"""Workflow triage at the gateway: the one `WorkflowTriage` of serving/core/scheduler/triage.py, fed as the simulator
feeds it, and the workflows the system turned away.

`turns_away` when a stage becomes ready (its call is predicted and about to queue); `served` when a stage's call
ended, with whether a stage waited in the queue when the stage gave its node back (the dispatcher records it before
the freed room is handed on, as the simulator reads its queues before it fills a node); `end` when a workflow ends,
is turned away or is forgotten. The gateway's nodes serve one model, so its queue is that model's pool: work waits
for the pool when any stage waits in the queue.

With `System.triage_rejects` a shed workflow is turned away (call.py answers 503 and names it), and so is every later
stage of it: the workflow is remembered (the most recent `max_rejected`) and ends at the triage, as the simulator
drops it. Without, its stages queue behind every on-time stage with no deadline (`WorkflowTriage.apply`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from serving.core.request import StageRequest
from serving.core.scheduler.pool_window import ToolPool
from serving.core.scheduler.triage import TriageConfig, WorkflowTriage
from serving.gateway.jobs import Dispatcher

MAX_REJECTED = 100_000  # turned-away workflows remembered, so that their later stages are refused too


class GatewayTriage:
    """The triage and the workflows it turned away, on the dispatcher's clock and queue."""

    def __init__(
        self,
        is_rejecting: bool,
        dispatcher: Dispatcher,
        tool_pool: Callable[[], ToolPool] | None = None,
        config: TriageConfig | None = None,
        max_rejected: int = MAX_REJECTED,
    ):
        self.triage = WorkflowTriage(config)
        self.tool_pool = tool_pool  # the callers' tool workers, as triage reads them (None: not triaged on them)
        self.is_rejecting, self.dispatcher = is_rejecting, dispatcher
        self.rejected: OrderedDict[str, None] = OrderedDict()  # workflow keys turned away, oldest first
        self.max_rejected = max_rejected
        self.num_rejected_workflows = 0  # workflows turned away (a stage of theirs refused)

    @property
    def num_shed_workflows(self) -> int:
        """Workflows the triage shed (turned away, or served behind the rest), counted when shed: a workflow shed
        while another's stage was assessed counts then, not at its own next stage."""
        return self.triage.num_shed

    def has_rejected(self, workflow_id: str) -> bool:
        return workflow_id in self.rejected

    def turns_away(self, request: StageRequest) -> bool:
        """Triage a stage that became ready (a shed workflow's stage is left with no deadline); True where its workflow
        is turned away, now or before."""
        workflow_id = request.workflow_id
        if workflow_id in self.rejected:
            return True
        tools = self.tool_pool() if self.tool_pool is not None else None
        is_shed = self.triage.apply(request, self.dispatcher.clock(), self.dispatcher.is_backlogged(), None, tools)
        if not (is_shed and self.is_rejecting):
            return False
        self.rejected[workflow_id] = None
        self.num_rejected_workflows += 1
        while len(self.rejected) > self.max_rejected:
            self.rejected.popitem(last=False)
        return True

    def served(self, request: StageRequest, work_s: float, was_backlogged: bool, wall_s: float | None = None) -> None:
        """A stage's call ended after `work_s` unloaded seconds (`wall_s` on the clock since it started on its node);
        `was_backlogged`: a stage waited when it ended."""
        self.triage.served(request.model, work_s, self.dispatcher.clock(), was_backlogged, wall_s)

    def end(self, workflow_id: str) -> None:
        self.triage.end(workflow_id)

    def snapshot(self) -> dict:
        capacity = {model: pool.capacity for model, pool in self.triage.pools.items()}
        return {
            "rejects": self.is_rejecting,
            "shed_workflows": self.num_shed_workflows,
            "rejected_workflows": self.num_rejected_workflows,
            "capacity": capacity,
        }
