"""A simulated node as the dispatch core sees it (`admission.dispatch.NodeView`), and the core's rules per node."""
from __future__ import annotations

from typing import TYPE_CHECKING

from serving.admission.dispatch import DispatchConfig
from serving.request import StageRequest
from serving.routing import FitnessConfig
from serving.sim.node import SimNode
from serving.sim.workload import SimStage

if TYPE_CHECKING:
    from serving.sim.dispatch import Dispatcher


class SimSlot:
    """A simulated node as the dispatch core sees it (`admission.dispatch.NodeView`)."""

    def __init__(self, node: SimNode, dispatcher: Dispatcher):
        self.node, self.name, self.dispatcher = node, node.name, dispatcher

    def refusal(self, request: StageRequest) -> str | None:
        node, stage = self.node, request.payload
        if len(node.running) >= self.dispatcher.max_batch_seqs:
            return "batch"
        if not node.residency.can_activate(stage.model, node.busy_models()):
            return "model"
        return None if self.dispatcher.kv_plan(node, stage) is not None else "kv"

    def may_fit_later(self, request: StageRequest) -> bool:
        """Only if something runs here, or KV other than the stage's own context is kept here."""
        parent = parent_of(request.payload)
        return bool(self.node.running) or any(kept is not parent for kept in self.node.pinned)

    def fitness_terms(self, request: StageRequest) -> tuple[float, float, float]:
        """As the gateway's: free KV share; the work on the node (running stages, each a mean stage, and the queued
        stages' predicted work, over the batch width, after the model's load); the KV shortfall and the node's queue
        (the engine's waiting stages)."""
        node, stage, batch = self.node, request.payload, self.dispatcher.max_batch_seqs
        need = node.alloc.pages_for(stage.prompt_tokens + stage.tokens_reserve, self.dispatcher.bytes_per_token(stage))
        free = node.alloc.num_free_pages
        work_s = len(node.running) * self.dispatcher.sim.stage_ema_s + node.queued_work_s
        ready = node.residency.ready_cost_s(stage.model) + work_s / batch
        degradation = max(0, need - free) / max(1, need) + len(node.sched) / batch
        return free / node.alloc.num_physical_pages, ready, degradation

    def load(self) -> float:
        return len(self.node.sched) + len(self.node.running)

    def can_start_now(self, request: StageRequest) -> bool:
        """Nothing queued ahead of it here, and the core would start it."""
        return not len(self.node.sched) and self.refusal(request) is None


def node_dispatch_config(router: str, fitness: FitnessConfig) -> DispatchConfig:
    """The gateway's dispatch rules (backfill included) on one node's queue, and the system's router."""
    return DispatchConfig(router=router, fitness=fitness)


def parent_of(stage: SimStage) -> SimStage | None:
    return stage.workflow.stages[stage.session_parent] if stage.session_parent >= 0 else None
