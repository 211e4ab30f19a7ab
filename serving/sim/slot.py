"""A simulated node as the dispatch core sees it (`admission.dispatch.NodeView`)."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from maestro.progressive import UNKNOWN, prefix_class, prefix_num_chars
from serving.core.admission.batch_cost import Candidate, NodeState, RunningStage
from serving.core.dispatch import HELD_BACK, DispatchConfig, choose
from serving.core.request import StageRequest
from serving.core.residency import ModelState
from serving.sim.node import SimNode
from serving.sim.workload import SimStage

if TYPE_CHECKING:
    from serving.sim.cluster import SimDispatcher


class SimSlot:
    """A simulated node as the dispatch core sees it (`admission.dispatch.NodeView`)."""

    def __init__(self, node: SimNode, dispatcher: SimDispatcher):
        self.node, self.name, self.dispatcher = node, node.name, dispatcher
        self._state: tuple[tuple[float, int], NodeState] | None = None  # (when, batch version) → the view

    def admit(self, request: StageRequest) -> list[SimStage] | None:
        """The kept tool-call KV to reclaim so that the stage starts here now (`SimDispatcher.kv_plan`): the
        node's admission, applied when the stage starts; None where it may not start (no batch slot, a step that
        preempted, the model cannot be made resident, no room for its reserve); `HELD_BACK` where it has room but
        Maestro's batch-cost gate holds it back."""
        node, stage = self.node, request.payload
        if len(node.running) >= self.dispatcher.max_batch_seqs or not node.may_start(self.dispatcher.sim.now):
            return None
        if not self.can_load(stage):
            return None
        victims = self.dispatcher.kv_plan(node, stage)
        if victims is None:
            self.dispatcher.sim.recorder.kv_refused.add(id(stage))
            return None
        return victims if self.batch_gate_admits(stage) else HELD_BACK

    def is_spare_for(self, stage: SimStage) -> bool:
        """Whether the stage's model could be loaded here now in the place of models with no work under way: no
        stage of theirs running, no session's context kept over a tool call, no tool call on this host whose session
        comes back to them (`SimNode.models_in_use`)."""
        resident = self.node.residency.running_models()
        return self.can_load(stage) and self.node.models_in_use() & resident <= {stage.model}

    def end_s(self, stage: SimStage) -> float:
        """When the stage would end if routed here now, at the long end of its predicted length: the router's ready
        time (a model's load included: `fitness_terms`) plus its reserve (the calibrated upper bound of its output)
        at this node's pace with it in the batch (the pace its token stream shows now, plus what one more decode of
        its context adds to each step). The bound, not the point: a stage kept on a wide batch that runs long costs
        it and the batch, one moved that runs short costs a load."""
        node, now, tokens = self.node, self.dispatcher.sim.now, stage.tokens_reserve
        context = stage.prompt_tokens + stage.generated_tokens + tokens / 2
        per_token_s = node.pace_s_per_token(now) + node.added_decode_s(stage.model, context)
        return self.fitness_terms(stage.request)[1] + tokens * per_token_s

    def can_load(self, stage: SimStage) -> bool:
        """Whether the stage's model could be made resident here now (the busy models leave room for its weights)."""
        return self.node.residency.can_activate(stage.model, self.node.busy_models())

    def batch_gate_admits(self, stage: SimStage) -> bool:
        """Whether Maestro's batch-cost gate (when on) lets the stage join the running batch now."""
        node, gate = self.node, self.dispatcher.batch_gate
        if gate is None or not node.running:
            return True
        if not gate.may_hold(
            node.pace_s_per_token(self.dispatcher.sim.now), node.decode_step_s(), stage.request.interactive
        ):
            return True  # (the gate's own first test, before the node is described)
        return gate.admits_candidate(self.node_state(), self.candidate(stage))

    def node_state(self) -> NodeState:
        """The node as the gate reads it now, from its clock: each running stage's tokens so far on the step clock,
        the step clock's measured pace, the bare decode step, what the prefills under way still add to the decodes'
        steps (built once per batch change and time)."""
        node, now = self.node, self.dispatcher.sim.now
        version = (now, node.num_batch_changes)
        if self._state is None or self._state[0] != version:
            v = node.v_at(now)
            running = tuple(running_stage(s, s.generated_tokens + node.produced_tokens(s, v)) for s in node.running)
            pace_s, step_s = node.pace_s_per_token(now), node.decode_step_s()
            self._state = (version, NodeState(now, running, pace_s, step_s, backlog_s=node.prefill_backlog_s(now)))
        return self._state[1]

    def candidate(self, stage: SimStage) -> Candidate:
        """Starting `stage` here now, priced by the node's own step builder: what its prefill chunks (less its
        session's cached context) add to the steps they share with the running decodes, then the KV (and weights, for
        a model the steps do not carry yet) its decode adds to each step."""
        node, now = self.node, self.dispatcher.sim.now
        parent = parent_of(stage)
        cached = 0
        if parent is not None and (parent in node.pinned or parent in node.cache):
            cached = min(stage.prompt_tokens, parent.prompt_tokens + parent.output_tokens)
        context = stage.prompt_tokens + stage.generated_tokens
        stall = node.added_prefill_s(stage.model, context, cached, now)
        added = node.added_decode_s(stage.model, context + stage.tokens_pred / 2)
        return Candidate(
            stage.request.deadline_s,
            stage.generated_tokens,
            stall,
            added,
            stage.request.interactive,
            tokens_pred=stage.tokens_pred,
            tokens_reserve=stage.tokens_reserve,
        )

    def may_fit_later(self, request: StageRequest) -> bool:
        """Only if something runs here, or KV other than the stage's own context is kept here."""
        parent = parent_of(request.payload)
        return bool(self.node.running) or any(kept is not parent for kept in self.node.pinned)

    def fitness_terms(self, request: StageRequest) -> tuple[float, float, float]:
        """As the gateway's: free KV share; the ready time: the work on the node (running stages, each a mean stage,
        and the queued stages' predicted work, over the batch width: `gpu_work_s`, times the delay the app's routed
        stages met per second of it, `routing.GpuDelayFit`; after the model's load — and what it costs the models it
        puts to sleep, `displacement_s` — and after the load under way on the node, if one is: a node loading a model
        starts nothing until it is in) plus the wait a tool
        call handed to this node's host CPU now would see (`HostCPU.wait_s`) times the share of it that routed
        stages' calls have met here (`HostCPU.charged_wait_s`, `routing.HostWaitFit`), since a session routed here
        stays here (its kept context) and its tool calls run on this host; the KV shortfall and the node's queue (the
        engine's waiting stages). Free KV is what the stage could map here: free pages plus the sessions' kept
        tool-call KV, which `SimDispatcher.kv_plan` reuses or reclaims for it; counted as taken, an idle node
        holding some ranked below a node already running a stage."""
        node, stage, batch = self.node, request.payload, self.dispatcher.max_batch_seqs
        app = stage.workflow.app
        need = node.alloc.pages_for(stage.prompt_tokens + stage.tokens_reserve, self.dispatcher.bytes_per_token(stage))
        free = node.alloc.num_free_pages + sum(kept.mapped_pages for kept in node.pinned.values())
        gpu_s = self.gpu_work_s() * self.dispatcher.gpu_fits.scale(app)
        now = self.dispatcher.sim.now
        host_s = node.host.charged_wait_s(now, app)
        ready = node.residency.ready_cost_s(stage.model) + self.displacement_s(stage) + gpu_s + host_s
        ready += max(0.0, node.stall_end_s - now)
        degradation = max(0, need - free) / max(1, need) + len(node.sched) / batch
        return free / node.alloc.num_physical_pages, ready, degradation

    def displacement_s(self, stage: SimStage) -> float:
        """What loading the stage's model here costs the models it puts to sleep (`NodeResidency.displaced_by`) that
        run on no other node: each one's next stage reloads it, from the CPU tier (weights over PCIe and the warm-up:
        a sleeping stub is the first thing the next load on the node drops)."""
        residency = self.node.residency
        return sum(residency.ready_cost_s(m, ModelState.CPU) for m in self.sole_copies_displaced(stage))

    def sole_copies_displaced(self, stage: SimStage) -> list[str]:
        """The models that loading the stage's model here now would put to sleep and that run on no other node."""
        running_on = self.dispatcher.running_on
        displaced = self.node.residency.displaced_by(stage.model, self.node.busy_models())
        return [m for m in displaced if len(running_on.get(m, ())) <= 1]

    def displaces_in_demand(self, stage: SimStage, hold_s: float) -> bool:
        """Whether loading the stage's model here would put to sleep a model's only copy that was routed a stage more
        recently than the stage would hold the node (`hold_s`: its end here, `end_s`): that model is likely to be
        wanted while the replica holds the node, and its next stage would then wait the replica out or reload it
        elsewhere, putting another model to sleep there."""
        last, now = self.dispatcher.last_routed, self.dispatcher.sim.now
        return any(now - last.get(m, -math.inf) < hold_s for m in self.sole_copies_displaced(stage))

    def holds_only_replicas(self, stage: SimStage) -> bool:
        """Whether every model running here runs on another node too, and the stage's model fits here once they go."""
        resident, running_on = self.node.residency.running_models(), self.dispatcher.running_on
        fits = self.node.residency.can_activate(stage.model)
        return fits and bool(resident) and all(len(running_on.get(m, ())) > 1 for m in resident)

    def gpu_work_s(self) -> float:
        """The node's work ahead over the batch width: its running stages, each a mean stage, and the queued stages'
        predicted service (at least 0: the queued work's sum drifts by rounding)."""
        node, dispatcher = self.node, self.dispatcher
        return max(0.0, len(node.running) * dispatcher.sim.stage_ema_s + node.queued_work_s) / dispatcher.max_batch_seqs

    def routed(self, stage: SimStage) -> None:
        """The stage was routed here: what its tool call meets on this host and what its LLM call meets on this GPU
        are scored against what the node shows now (`HostCPU.routed`, `GpuDelayFits.routed`); the choice is a
        decision the leak test compares."""
        app, now = stage.workflow.app, self.dispatcher.sim.now
        self.dispatcher.sim.recorder.decision("route", now, stage, self.node.index)
        self.node.host.routed(stage, app, now)
        self.dispatcher.gpu_fits.routed(stage, app, self.gpu_work_s(), now)

    def load(self) -> float:
        return len(self.node.sched) + len(self.node.running)

    def can_start_now(self, request: StageRequest) -> bool:
        """Nothing queued ahead of it here, and the core would start it."""
        return (
            not len(self.node.sched) and (admission := self.admit(request)) is not None and admission is not HELD_BACK
        )


def scaled_out(stage: SimStage, chosen: SimSlot, others: list[SimSlot]) -> SimSlot:
    """Where a stage of a model that runs on `chosen` (the router's choice among its nodes) goes with S(N,T): the
    spare node among `others` where it is predicted to end first (`SimSlot.end_s`, at its reserve), if sooner than on
    `chosen` — a stage that may run long is worth its model's load on a node nothing else needs now, a short one is
    not; never by putting to sleep a model's only copy wanted within the stage's hold (`displaces_in_demand`)."""
    ends = [(s.end_s(stage), s) for s in others if s.is_spare_for(stage)]
    ends = [(end, s) for end, s in ends if not s.displaces_in_demand(stage, end)]
    if not ends:
        return chosen
    end, best = min(ends, key=lambda pair: pair[0])
    return best if end < chosen.end_s(stage) else chosen


def cold_slot(stage: SimStage, slots: list[SimSlot], config: DispatchConfig) -> SimSlot:
    """Where a router that scales models out loads a model running nowhere: one copy of every model in demand before
    a second of any. Among the nodes that could start the stage now without putting a model's only copy to sleep;
    else on a node holding only replicas (models running elsewhere too), where it waits for them to go idle; else
    among the nodes that could start it now, else all (`dispatch.choose` with the router's `config`)."""
    now = [s for s in slots if s.can_start_now(stage.request)]
    free = [s for s in now if not s.sole_copies_displaced(stage)]
    return choose(stage.request, free or [s for s in slots if s.holds_only_replicas(stage)] or now or slots, config)


def running_stage(stage: SimStage, produced: float) -> RunningStage:
    """A running stage as the gate reads it: its prediction, deadline, start, tokens so far, the class of its output
    so far, its predictor's re-prediction table and its workflow's class."""
    return RunningStage(
        stage.request.deadline_s,
        stage.start_s,
        produced,
        output_prefix(stage, produced),
        stage.progressive,
        stage.request.interactive,
        tokens_pred=stage.tokens_pred,
        tokens_reserve=stage.tokens_reserve,
    )


def output_prefix(stage: SimStage, produced: float) -> str:
    """The class of a running stage's first output tokens (`maestro.progressive.prefix_class`), read off its trace's
    output_text as the training rows read it; unknown where the stage has no re-prediction table to read it."""
    text = (stage.source or {}).get("output_text") if stage.progressive is not None else None
    return _prefix_class(text, prefix_num_chars(produced)) if text else UNKNOWN


@functools.lru_cache(maxsize=1 << 16)
def _prefix_class(text: str, num_chars: int) -> str:
    """`prefix_class` of an output's first `num_chars` characters, remembered: the gate reads every running stage's
    at every batch change, and a stage's class changes only over its first `PREFIX_TOKENS`."""
    return prefix_class(text[:num_chars])


def parent_of(stage: SimStage) -> SimStage | None:
    return stage.workflow.stages[stage.session_parent] if stage.session_parent >= 0 else None
