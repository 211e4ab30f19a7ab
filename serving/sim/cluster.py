"""The simulator's side of dispatch: its nodes shown to the dispatch core, and the clock parts of a stage's life.

Which stage starts, where and when is the dispatch core's (serving/core/dispatch.py), with the gateway's rules: a
stage is routed when it becomes ready (`route`) and each node's core starts its queue in policy order, gated by the
session cap (MARS: the AIMD window), with the gateway's bounded backfill. A `SimSlot` (slot.py) answers the core's
questions for one node: may this stage start here now (a batch slot, the model, free pages for its reserve after
reclaiming idle tool-call KV: `kv_plan`, the admission a start applies), could it ever, and the node's fitness
terms. What stays here belongs to the clock: starting (reservation, chunked prefill), the prefill's end, decode
growth and preemption, finishing, and the tool-KV keep/evict decision. It sees the simulation through `SimContext`:
what it reads, and the events it raises (children ready, a workflow dropped, a tool submitted, a kept context's TTL
armed).
"""

from __future__ import annotations

from serving.core.admission.batch_cost import BatchCostGate
from serving.core.admission.sizing import ReservationMode, headroom_pages, output_tokens_to_map
from serving.core.dispatch import Outcome, Router, choose
from serving.core.kv import Reservation
from serving.core.request import StageRequest
from serving.core.residency import ModelState
from serving.core.routing import GpuDelayFits, HostWaitFits
from serving.core.tool_kv import ToolCallContext
from serving.sim.context import SimContext
from serving.sim.gpu_pace import ModelPace
from serving.sim.node import FINISH, GROW, SimNode, node_dispatch_config
from serving.sim.sessions import occupy, session_home
from serving.sim.slot import SimSlot, cold_slot, parent_of, scaled_out
from serving.sim.workload import SimStage


class SimDispatcher:
    """The simulator's dispatch (see the module docstring): routing, each node's fill, a stage's clock parts."""

    def __init__(self, sim: SimContext):
        self.sim = sim
        self.reservation = ReservationMode(sim.system.reservation)
        self.max_batch_seqs = sim.cluster.max_batch_seqs
        self.config = node_dispatch_config(sim.system.router, sim.cluster.fitness)
        self.scales_out = Router(sim.system.router) is Router.FITNESS  # a model may be loaded on another node (route)
        self.batch_gate = BatchCostGate() if sim.system.batch_cost else None
        self.slots = {node: SimSlot(node, self) for node in sim.nodes}
        self.host_fits = HostWaitFits()  # one for the fleet: every node's host wait is charged alike
        self.gpu_fits = GpuDelayFits()  # and every node's GPU work
        for node in sim.nodes:
            node.host.fits = self.host_fits
        self.running_on: dict[str, list[SimNode]] = {}
        self.last_routed: dict[str, float] = {}  # when a stage of each model was last routed (its demand)

    def bytes_per_token(self, stage: SimStage) -> int:
        return self.sim.cost.model(stage.model).kv_bytes_per_token

    def is_live(self, request: StageRequest, now: float) -> bool:
        """False once the stage's workflow was dropped, or has aged past `abandon_after_slo_x` × its SLO."""
        w, x = request.payload.workflow, self.sim.cluster.abandon_after_slo_x
        return not (w.is_dropped or (x is not None and now - w.arrival_s > x * w.slo_s))

    def is_backlogged(self, model: str) -> bool:
        """Whether a stage of `model` waits on a node running it (triage's pool of `model` is short)."""
        return any(node.core.is_waiting(model) for node in self.running_on.get(model, ()))

    # --- placement and routing -----------------------------------------------------------------
    def place_models(self) -> None:
        placement = self.sim.cluster.placement
        for node in self.sim.nodes:
            for model in node.residency.state:
                node.residency.place(model, ModelState.DISK)
            for model in placement[node.index % len(placement)]:
                node.residency.activate(model, is_counted=False)
        self._index_models()

    def _index_models(self) -> None:
        self.running_on = {}
        for node in self.sim.nodes:
            for model in node.residency.running_models():
                self.running_on.setdefault(model, []).append(node)

    def route(self, stage: SimStage) -> SimNode:
        """The node whose queue a ready stage joins: its session's home, else the core's choice among the nodes
        that could start it at once, else among all that run its model; with S(N,T) (`scales_out`) a spare node
        instead where it is predicted to end sooner (`slot.scaled_out`), and a cold model's node by `slot.cold_slot`."""
        self.last_routed[stage.model] = self.sim.now
        home = session_home(stage, self.slots)
        if home is not None:
            return home
        running = self.running_on.get(stage.model)
        slots = [self.slots[n] for n in running or self.sim.nodes]
        if not running and self.scales_out:
            slot = cold_slot(stage, slots, self.config)  # one copy of every model in demand before a second
        else:
            slot = choose(stage.request, [s for s in slots if s.can_start_now(stage.request)] or slots, self.config)
        if running and self.scales_out:
            slot = scaled_out(stage, slot, [self.slots[n] for n in self.sim.nodes if n not in running])
        slot.routed(stage)  # scored against what its LLM and tool calls meet
        return slot.node

    # --- admission and start -------------------------------------------------------------------
    def fill(self, node: SimNode) -> None:
        """Apply the node's dispatch decisions: start stages in policy order while the head may start."""
        sim = self.sim
        for decision in node.core.decisions([self.slots[node]], sim.now):
            stage: SimStage = decision.request.payload
            node.queued_work_s -= decision.request.pred_service_s
            if decision.outcome is Outcome.START:
                sim.recorder.decision("start", sim.now, stage, node.index)
                self._start(node, stage, decision.admission)
                continue
            sim.recorder.decision(decision.outcome.name.lower(), sim.now, stage, node.index)
            if decision.outcome is Outcome.DROPPED:
                sim.recorder.abandoned += 1
            else:
                sim.recorder.never_fit += 1
            sim.drop(stage.workflow)

    def _reserve_tokens(self, stage: SimStage) -> int:
        """Tokens to map at start: context plus what the reservation mode adds (admission/sizing.py), capped at
        prompt + max_tokens."""
        extra = output_tokens_to_map(
            self.reservation,
            stage.tokens_reserve,
            stage.max_tokens,
            stage.generated_tokens,
            self.sim.cluster.grow_chunk_tokens,
        )
        return min(stage.prompt_tokens + stage.generated_tokens + extra, stage.prompt_tokens + stage.max_tokens)

    def kv_plan(self, node: SimNode, stage: SimStage) -> list[SimStage] | None:
        """The kept tool-call KV to reclaim (oldest first) so that the stage's reserve, plus the admission headroom,
        fits in free pages and its range in the virtual space, else None; the session's own is reused, not reclaimed."""
        alloc, bpt = node.alloc, self.bytes_per_token(stage)
        need = alloc.pages_for(self._reserve_tokens(stage), bpt) + headroom_pages(
            self.sim.system.admission_headroom_frac, alloc.num_physical_pages
        )
        parent = parent_of(stage)
        kept = node.pinned.get(parent) if parent is not None else None
        free = alloc.num_free_pages + (kept.mapped_pages if kept is not None else 0)
        virtual = alloc.pages_for(stage.prompt_tokens + stage.max_tokens, bpt)
        if kept is not None and virtual <= kept.virtual_pages:
            virtual = 0  # the kept range grows in place
        free_virtual = (
            alloc.num_virtual_pages_limit
            - alloc.num_virtual_pages
            + (kept.virtual_pages if kept is not None and virtual else 0)
        )
        victims = []
        for victim, reservation in node.pinned.items():
            if need <= free and virtual <= free_virtual:
                break
            if victim is not parent:
                victims.append(victim)
                free += reservation.mapped_pages
                free_virtual += reservation.virtual_pages
        return victims if need <= free and virtual <= free_virtual else None

    def _start(self, node: SimNode, stage: SimStage, victims: list[SimStage]) -> None:
        """Start the stage with the node's admission: the kept KV to reclaim for it (`kv_plan`)."""
        model_cost = node.residency.activate(stage.model, node.busy_models())
        if model_cost:
            node.advance(self.sim.now)
            node.stall(self.sim.now, model_cost)
            self._index_models()
        for victim in victims:
            node.release(victim, node.pinned.pop(victim))  # idle KV of a tool call is reclaimable
        self.sim.recorder.num_kept_reclaimed += len(victims)
        reservation, cached = self._reserve(node, stage)
        self._begin(node, stage, reservation, cached)

    def _reserve(self, node: SimNode, stage: SimStage) -> tuple[Reservation, int]:
        """Map the stage's reserve (growing its session's kept context in place when its range is long enough)."""
        alloc, bpt = node.alloc, self.bytes_per_token(stage)
        tokens, parent = self._reserve_tokens(stage), parent_of(stage)
        kept = node.pinned.pop(parent, None) if parent is not None else None
        if kept is not None:
            if alloc.pages_for(stage.prompt_tokens + stage.max_tokens, bpt) <= kept.virtual_pages:
                alloc.grow(kept, tokens)
                node.cache.trim(alloc.num_free_pages)
                return kept, parent.prompt_tokens + parent.output_tokens
            node.release(parent, kept)  # its range is too short for this stage: the prefix cache hands it over
        reservation = alloc.reserve(tokens, stage.prompt_tokens + stage.max_tokens, bpt)
        if reservation is None:
            raise RuntimeError(f"stage {stage.stage_id}: the reserve the plan admitted did not map on {node.name}")
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

    def _begin(self, node: SimNode, stage: SimStage, reservation, cached_tokens: int) -> None:
        sim, model = self.sim, self.sim.cost.model(stage.model)
        if stage.session_parent >= 0 and cached_tokens == 0:
            sim.evicted_wait_ema_s = 0.8 * sim.evicted_wait_ema_s + 0.2 * (sim.now - stage.ready_s)
            parent = parent_of(stage)
            sim.recorder.num_cold_session_starts += 1
            sim.recorder.num_reprefilled_tokens += parent.prompt_tokens + parent.output_tokens
        stage.queue_wait_s += sim.now - stage.request.ready_s
        if stage.first_start_s < 0:
            stage.first_start_s = sim.now
            stage.maxlen_pages = node.alloc.pages_for(stage.prompt_tokens + stage.max_tokens, model.kv_bytes_per_token)
        stage.reservation, stage.node, stage.start_s = reservation, node, sim.now
        stage.peak_pages = max(stage.peak_pages, reservation.mapped_pages)
        node.advance(sim.now)
        node.add_running(stage, stage.prompt_tokens + stage.generated_tokens, cached_tokens)
        occupy(node, stage.workflow)

    def prefilled(self, node: SimNode, stage: SimStage) -> None:
        """The stage's last prefill chunk ran: it decodes from now (its first token sampled)."""
        if node.end_prefill(stage):
            self._arm(node, stage)

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
                self.sim.recorder.num_kept_reclaimed += 1
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
        stage.generated_tokens += int(node.produced_tokens(stage, node.v) + 1e-6)
        stage.generated_tokens = min(stage.generated_tokens, stage.output_tokens - 1)
        node.remove_running(stage)
        node.release(stage, stage.reservation)
        node.hold_starts()
        stage.reservation = None
        sim.recorder.preemptions += 1
        stage.request.is_preempted = True
        stage.request.ready_s = sim.now
        node.core.add(stage.request, sim.now)
        node.queued_work_s += stage.request.pred_service_s

    # --- the end of a stage ---------------------------------------------------------------------
    def finish(self, node: SimNode, stage: SimStage) -> None:
        sim = self.sim
        node.remove_running(stage)
        stage.finished_s, service_s = sim.now, sim.now - stage.start_s
        work_s = ModelPace.of(sim.cost, stage.model).service_s(stage.prompt_tokens, stage.output_tokens)
        stage.workflow.attained_service_s += work_s
        self.gpu_fits.ended(stage, sim.now, work_s)
        if sim.triage is not None:
            backlogged, is_node_backlogged = self.is_backlogged(stage.model), len(node.core) > 0
            sim.triage.served(stage.model, work_s, sim.now, backlogged, service_s, node.name, is_node_backlogged)
        sim.stage_ema_s = 0.99 * sim.stage_ema_s + 0.01 * service_s
        sim.recorder.stage_done(stage)
        if stage.is_tool_call:
            self._keep_or_evict(node, stage)
            stage.tool_submit_s = sim.now
            sim.submit_tool(node, stage)
        else:
            node.host.ended_without_call(stage)
            node.release(stage, stage.reservation)
            sim.children_ready(stage)
        stage.reservation = None

    def _keep_or_evict(self, node: SimNode, stage: SimStage) -> None:
        sim, model = self.sim, self.sim.cost.model(stage.model)
        context = stage.prompt_tokens + stage.output_tokens
        # A tool call means its session continues with the tool's result: all a live system knows here (not whether
        # the replayed workflow has a next turn of it). Re-prefilled later, the context's chunks would slow each stage
        # running here by what they add to its steps (the node's step builder): `mars-batch` weighs that too.
        stall_s = node.added_prefill_s(stage.model, context, 0, sim.now) * len(node.running)
        reprefill_s, tool_s = sim.cost.prefill_s(model, context), sim.predicted_tool_s(stage.tool_name)
        args = (node.other_context_tokens(), sim.evicted_wait_ema_s, stall_s)
        ttl = sim.tool_kv.ttl_s(ToolCallContext(stage.tool_name, context, reprefill_s, tool_s, *args))
        sim.recorder.decision("keep" if ttl > 0 else "evict", sim.now, stage, node.index)
        if ttl <= 0:
            node.release(stage, stage.reservation)
            return
        node.alloc.shrink(stage.reservation, context)
        node.pinned[stage] = stage.reservation
        sim.arm_ttl(stage, ttl)
