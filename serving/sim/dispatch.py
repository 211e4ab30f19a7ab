"""Per-node decisions of the simulator: route, admit and start, grow or preempt, finish and keep/evict KV.

These are the serving objects at work: routing (least-loaded or S(N,T) fitness), residency
(activate a model), admission (free pages ≥ reserve, AIMD session window), the allocator
(reserve / grow / release), and the tool-KV policy. The simulator owns only the clock.
"""
from __future__ import annotations

import numpy as np

from serving.admission.sizing import ReservationMode, output_tokens_to_map
from serving.residency import ModelState
from serving.routing import select_node
from serving.sim.node import FINISH, GROW, SimNode
from serving.sim.workload import SimStage
from serving.tool_kv import ToolCallContext


class Dispatcher:
    def __init__(self, sim):
        self.sim = sim
        self.reservation = ReservationMode(sim.system.reservation)
        self.running_on: dict[str, list[SimNode]] = {}

    # --- placement and routing -----------------------------------------------------------------
    def place_models(self) -> None:
        placement = self.sim.cluster.placement
        for node in self.sim.nodes:
            for model in node.residency.state:
                node.residency.place(model, ModelState.DISK)
            for model in placement[node.index % len(placement)]:
                node.residency.activate(model)
        self._index_models()

    def _index_models(self) -> None:
        self.running_on = {}
        for node in self.sim.nodes:
            for model, state in node.residency.state.items():
                if state is ModelState.RUNNING:
                    self.running_on.setdefault(model, []).append(node)

    def route(self, stage: SimStage) -> SimNode:
        home = self._session_home(stage)
        if home is not None:
            return home
        candidates = self.running_on.get(stage.model) or self.sim.nodes
        if len(candidates) == 1:
            return candidates[0]
        if self.sim.system.router == "fitness":
            return self._fittest(stage, candidates)
        return min(candidates, key=lambda n: len(n.sched) + len(n.running))

    def _session_home(self, stage: SimStage) -> SimNode | None:
        """The node holding the session's context, when its next stage should go there (session affinity).

        It does while the context's KV is kept or still in the prefix cache there; once overwritten, only
        if the node could start the stage at once (no queue, a batch slot and free pages for its reserve).
        """
        if stage.session_parent < 0:
            return None
        parent = stage.workflow.stages[stage.session_parent]
        node = parent.node
        if node is None:
            return None
        if parent in node.pinned or parent in node.cache:
            return node
        return node if self._has_room(node, stage) else None

    def _has_room(self, node: SimNode, stage: SimStage) -> bool:
        if len(node.sched) or len(node.running) >= self.sim.cluster.max_batch_seqs:
            return False
        bpt = self.sim.cost.model(stage.model).kv_bytes_per_token
        return node.alloc.pages_for(self._reserve_tokens(stage), bpt) <= node.alloc.num_free_pages

    def _fittest(self, stage: SimStage, candidates: list[SimNode]) -> SimNode:
        model = self.sim.cost.model(stage.model)
        need = candidates[0].alloc.pages_for(stage.prompt_tokens + stage.tokens_reserve, model.kv_bytes_per_token)
        free = np.array([n.alloc.num_free_pages for n in candidates], dtype=float)
        total = candidates[0].alloc.num_physical_pages
        ready = np.array([n.residency.ready_cost_s(stage.model) + n.queued_work_s / self.sim.cluster.max_batch_seqs
                          for n in candidates])
        degradation = np.maximum(0.0, need - free) / max(1, need) + np.array(
            [len(n.sched) for n in candidates]) / self.sim.cluster.max_batch_seqs
        return candidates[select_node(free / total, ready, degradation, self.sim.cluster.fitness)]

    # --- admission and start -------------------------------------------------------------------
    def fill(self, node: SimNode) -> None:
        """Start queued stages in policy order while the head fits (no skipping: the order is the policy)."""
        sim, limit = self.sim, self.sim.cluster.max_batch_seqs
        while len(node.running) < limit:
            request = node.sched.peek(sim.now)
            if request is None:
                return
            stage: SimStage = request.payload
            if self._should_abandon(stage):
                node.sched.pop(sim.now)
                node.queued_work_s -= request.pred_service_s
                sim.recorder.abandoned += 1
                sim.drop(stage.workflow)
                continue
            if not self._window_allows(node, stage) or not self._try_start(node, stage):
                return

    def _should_abandon(self, stage: SimStage) -> bool:
        w, x = stage.workflow, self.sim.cluster.abandon_after_slo_x
        return w.is_dropped or (x is not None and self.sim.now - w.arrival_s > x * w.slo_s)

    def _window_allows(self, node: SimNode, stage: SimStage) -> bool:
        if node.window is None or stage.workflow.workflow_id in node.sessions:
            return True
        return len(node.sessions) < node.window.limit(node.alloc.usage)

    def _reserve_tokens(self, stage: SimStage) -> int:
        """Tokens to map at start: context plus what the reservation mode adds (admission/sizing.py), capped at
        prompt + max_tokens."""
        extra = output_tokens_to_map(self.reservation, stage.tokens_reserve, stage.max_tokens, stage.generated_tokens,
                                     self.sim.cluster.grow_chunk_tokens)
        return min(stage.prompt_tokens + stage.generated_tokens + extra, stage.prompt_tokens + stage.max_tokens)

    def _try_start(self, node: SimNode, stage: SimStage) -> bool:
        sim = self.sim
        model_cost = node.residency.activate(stage.model, node.busy_models())
        if model_cost is None:
            return self._give_up_if_idle(node, stage)
        if model_cost > 0:
            node.advance(sim.now)
            node.stall(sim.now, model_cost)
            self._index_models()
        reservation, cached = self._reserve(node, stage)
        if reservation is None:
            return self._give_up_if_idle(node, stage)
        node.sched.pop(sim.now)
        node.queued_work_s -= stage.request.pred_service_s
        self._start(node, stage, reservation, cached)
        return True

    def _give_up_if_idle(self, node: SimNode, stage: SimStage) -> bool:
        # Nothing runs here and nothing but its own context is kept, so waiting cannot help: it can never fit.
        parent = stage.workflow.stages[stage.session_parent] if stage.session_parent >= 0 else None
        if node.running or any(kept is not parent for kept in node.pinned):
            return False
        node.sched.pop(self.sim.now)
        node.queued_work_s -= stage.request.pred_service_s
        self.sim.recorder.never_fit += 1
        self.sim.drop(stage.workflow)
        return True

    def _reserve(self, node: SimNode, stage: SimStage):
        alloc, model = node.alloc, self.sim.cost.model(stage.model)
        tokens, bpt = self._reserve_tokens(stage), model.kv_bytes_per_token
        headroom = int(self.sim.system.admission_headroom_frac * alloc.num_physical_pages)
        parent = stage.workflow.stages[stage.session_parent] if stage.session_parent >= 0 else None
        kept = node.pinned.get(parent) if parent is not None else None
        have = kept.mapped_pages if kept is not None else 0
        while alloc.pages_for(tokens, bpt) - have + headroom > alloc.num_free_pages:
            victim = next((s for s in node.pinned if s is not parent), None)
            if victim is None:
                return None, 0
            node.release(victim, node.pinned.pop(victim))  # idle KV of a tool call is reclaimable
        if kept is not None:
            node.pinned.pop(parent)
            if alloc.pages_for(stage.prompt_tokens + stage.max_tokens, bpt) <= kept.virtual_pages:
                alloc.grow(kept, tokens)
                node.cache.trim(alloc.num_free_pages)
                return kept, parent.prompt_tokens + parent.output_tokens
            node.release(parent, kept)  # its range is too short for this stage: the prefix cache hands it over
        reservation = alloc.reserve(tokens, stage.prompt_tokens + stage.max_tokens, bpt)
        if reservation is None:
            return None, 0
        cached = self._prefix_hit(node, stage, parent)
        node.cache.trim(alloc.num_free_pages)
        return reservation, cached

    @staticmethod
    def _prefix_hit(node: SimNode, stage: SimStage, parent: SimStage | None) -> int:
        """Tokens whose released KV is still in vLLM's prefix cache: the parent's context, or its own."""
        if parent is not None and node.cache.take(parent):
            return parent.prompt_tokens + parent.output_tokens
        if stage.generated_tokens and node.cache.take(stage):  # restarted after a preemption
            return stage.prompt_tokens + stage.generated_tokens
        return 0

    def _start(self, node: SimNode, stage: SimStage, reservation, cached_tokens: int) -> None:
        sim, model = self.sim, self.sim.cost.model(stage.model)
        if stage.session_parent >= 0 and cached_tokens == 0:
            sim.evicted_wait_ema_s = 0.8 * sim.evicted_wait_ema_s + 0.2 * (sim.now - stage.ready_s)
        stage.queue_wait_s += sim.now - stage.request.ready_s
        if stage.first_start_s < 0:
            stage.first_start_s = sim.now
            stage.maxlen_pages = node.alloc.pages_for(stage.prompt_tokens + stage.max_tokens, model.kv_bytes_per_token)
        stage.reservation, stage.node, stage.start_s = reservation, node, sim.now
        stage.peak_pages = max(stage.peak_pages, reservation.mapped_pages)
        context = stage.prompt_tokens + stage.generated_tokens
        node.advance(sim.now)
        node.stall(sim.now, sim.cost.prefill_s(model, context - cached_tokens, cached_tokens))
        node.add_running(stage, context)
        self._occupy(node, stage.workflow)
        self._arm(node, stage)

    @staticmethod
    def _occupy(node: SimNode, workflow) -> None:
        """A session holds one window slot, on the node it runs on now; moving frees the old node's slot."""
        if workflow.session_node is not node:
            leave(workflow)
            node.sessions.add(workflow.workflow_id)
            workflow.session_node = node

    def _arm(self, node: SimNode, stage: SimStage) -> None:
        left = stage.output_tokens - stage.generated_tokens
        capacity = stage.reservation.capacity_tokens(node.alloc.page_bytes)
        room = capacity - (stage.prompt_tokens + stage.generated_tokens)
        node.at_tokens(stage, left, FINISH)
        if room < left:
            node.at_tokens(stage, max(0, room), GROW)

    # --- decode growth and graceful degradation ------------------------------------------------
    def grow(self, node: SimNode, stage: SimStage) -> None:
        produced = int(node.v - stage.v_start + 1e-6)
        capacity = stage.reservation.capacity_tokens(node.alloc.page_bytes)
        final = stage.prompt_tokens + stage.output_tokens
        target = min(final, capacity + self.sim.cluster.grow_chunk_tokens)
        while not node.alloc.grow(stage.reservation, target):
            if node.pinned:  # idle KV of a tool call goes before any running stage
                node.release(*node.pinned.popitem(last=False))
                continue
            stage.is_oom = True
            victim = next(reversed(node.running))  # the latest started goes first, as vLLM does
            self.preempt(node, victim)
            if victim is stage:
                return
        node.cache.trim(node.alloc.num_free_pages)
        stage.peak_pages = max(stage.peak_pages, stage.reservation.mapped_pages)
        room = stage.reservation.capacity_tokens(node.alloc.page_bytes) - stage.prompt_tokens - stage.generated_tokens
        if room < stage.output_tokens - stage.generated_tokens:
            node.at_tokens(stage, max(produced + 1, room), GROW)

    def preempt(self, node: SimNode, stage: SimStage) -> None:
        sim = self.sim
        stage.generated_tokens += int(node.v - stage.v_start)
        stage.generated_tokens = min(stage.generated_tokens, stage.output_tokens - 1)
        node.remove_running(stage)
        node.release(stage, stage.reservation)
        stage.reservation = None
        sim.recorder.preemptions += 1
        stage.request.is_preempted = True
        stage.request.ready_s = sim.now
        node.sched.add(stage.request, sim.now)
        node.queued_work_s += stage.request.pred_service_s

    # --- the end of a stage ---------------------------------------------------------------------
    def finish(self, node: SimNode, stage: SimStage) -> None:
        sim = self.sim
        node.remove_running(stage)
        service_s = sim.now - stage.start_s
        stage.workflow.attained_service_s += service_s
        sim.stage_ema_s = 0.99 * sim.stage_ema_s + 0.01 * service_s
        sim.recorder.stage_done(stage)
        if stage.is_tool_call:
            self._keep_or_evict(node, stage)
            stage.tool_submit_s = sim.now
            sim.submit_tool(node, stage)
        else:
            node.release(stage, stage.reservation)
            sim.children_ready(stage)
        stage.reservation = None

    def _keep_or_evict(self, node: SimNode, stage: SimStage) -> None:
        sim, model = self.sim, self.sim.cost.model(stage.model)
        context = stage.prompt_tokens + stage.output_tokens
        has_session_child = any(stage.workflow.stages[c].session_parent == stage.index for c in stage.children)
        ttl = 0.0
        if has_session_child:
            ttl = sim.tool_kv.ttl_s(ToolCallContext(
                stage.tool_name, context, sim.cost.prefill_s(model, context), sim.predicted_tool_s(stage.tool_name),
                node.other_context_tokens(), sim.evicted_wait_ema_s))
        if ttl <= 0:
            node.release(stage, stage.reservation)
            return
        node.alloc.shrink(stage.reservation, context)
        node.pinned[stage] = stage.reservation
        sim.arm_ttl(stage, ttl)


def leave(workflow) -> None:
    """Give back the window slot a session holds (it moved, ended or was dropped)."""
    if workflow.session_node is not None:
        workflow.session_node.sessions.discard(workflow.workflow_id)
        workflow.session_node = None
