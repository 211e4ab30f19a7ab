"""The discrete-event simulator: one clock driving the serving objects (scheduler, allocator,
admission, tool-KV policy, residency, routing) over N simulated nodes.

Events: a workflow arrives; a node reaches its next step-clock event (a stage finishes or must
grow its KV); a tool finishes on a node's host CPU; a pinned KV's TTL expires; the AIMD control
loop ticks. Everything else happens synchronously inside those handlers.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm import tqdm

from maestro.own_reserve import OwnReserveLevels
from serving.core.admission import AIMDConfig, CapSignals
from serving.core.request import StageRequest
from serving.core.residency import ModelNodes, ResidencyConfig
from serving.core.routing import FitnessConfig
from serving.core.scheduler import Policy
from serving.core.scheduler.remaining import RemainingWork
from serving.core.scheduler.triage import TriageConfig, WorkflowTriage
from serving.core.systems import System
from serving.core.tool_kv import ToolKVConfig, ToolTimes, create_tool_kv
from serving.sim.cluster import SimDispatcher
from serving.sim.costmodel import CostModel, CostModelConfig
from serving.sim.hostcpu import HostCPUMode, tool_pool
from serving.sim.metrics import Recorder
from serving.sim.node import FINISH, GROW, SimNode
from serving.sim.sessions import leave
from serving.sim.stage_request import observe_stage, own_reserve, ready_request
from serving.sim.workload import SimStage, SimWorkflow

ARRIVAL, NODE, TOOL_DONE, TTL, CONTROL = range(5)


@dataclass
class ClusterConfig:
    num_nodes: int = 4
    cost: CostModelConfig | CostModel = field(default_factory=CostModelConfig)  # a config, or a built cost model
    kv_pool_bytes: int = 32 * 1024**3
    page_bytes: int = 2 * 1024**2
    overcommit: float = 3.0  # virtual space × pages for systems that reserve a range (on demand: none, as vLLM)
    residency: ResidencyConfig = field(default_factory=ResidencyConfig)
    placement: list[tuple[str, ...]] = field(default_factory=lambda: [("llama-3-8b",)])  # cycled over nodes
    max_batch_seqs: int = 256
    num_tool_workers: int = 8  # host cores tools may use (MARS pins tools to 8 cores)
    host_cpu: str = "workers"  # workers | time-sliced | shared (serving/sim/hostcpu.py)
    prefix_caching: bool = True  # vLLM V1's default: released KV stays reusable until overwritten
    grow_chunk_tokens: int = 256
    abandon_after_slo_x: float | None = None  # drop a workflow whose age exceeds this × its SLO
    aimd: AIMDConfig = field(default_factory=AIMDConfig)
    fitness: FitnessConfig = field(default_factory=FitnessConfig)
    show_progress: bool = True

    def __post_init__(self):
        if self.num_nodes < 1 or self.max_batch_seqs < 1 or self.num_tool_workers < 1:
            raise ValueError("num_nodes, max_batch_seqs and num_tool_workers must be >= 1")
        if self.token_budget < self.max_batch_seqs:
            raise ValueError(
                f"cost.max_num_batched_tokens ({self.token_budget}) must be >= max_batch_seqs "
                f"({self.max_batch_seqs}), as vLLM requires: raise the budget or lower max_batch_seqs"
            )
        if self.grow_chunk_tokens < 1 or not self.placement:
            raise ValueError("grow_chunk_tokens must be >= 1 and placement non-empty")
        if self.abandon_after_slo_x is not None and self.abandon_after_slo_x <= 0:
            raise ValueError("abandon_after_slo_x must be > 0 or None")
        HostCPUMode(self.host_cpu)

    @property
    def token_budget(self) -> int:
        """vLLM's token budget a step (`max_num_batched_tokens`), from the cost model's config."""
        return (self.cost.config if isinstance(self.cost, CostModel) else self.cost).token_budget


class Simulator:
    """`predict_ready`: sets a stage's prediction when it becomes ready (`serving.sim.ready`); without it, the
    predictions already on the stages stand. `remaining_work`: what estimates a workflow's work after a stage (the
    history of ended workflows by default). `log_decisions`: keep every decision in `recorder.decisions`."""

    def __init__(
        self,
        cluster: ClusterConfig,
        system: System,
        workflows: list[SimWorkflow],
        predict_ready: Callable[[SimStage], None] | None = None,
        remaining_work: RemainingWork | None = None,
        log_decisions: bool = False,
    ):
        self.cluster, self.system, self.workflows = cluster, system, workflows
        self.predict_ready = predict_ready
        self.cost = cluster.cost if isinstance(cluster.cost, CostModel) else CostModel(cluster.cost)
        self.tool_kv = create_tool_kv(ToolKVConfig(policy=system.tool_kv))
        self.nodes = [SimNode(i, self.cost, cluster, system, self._is_live) for i in range(cluster.num_nodes)]
        self.recorder = Recorder()
        if log_decisions:
            self.recorder.decisions = []
        self.dispatch = SimDispatcher(self)
        self.now = 0.0
        self.num_events = 0
        self._events: list = []
        self._tie = itertools.count()
        self.tool_times = ToolTimes()
        self.remaining_work = remaining_work or RemainingWork()
        self.own_reserves = OwnReserveLevels()  # an unseen app's reserve level from its finished stages
        self.stage_ema_s = 1.0
        self.evicted_wait_ema_s = 0.0
        self.num_open = len(workflows)
        self.dispatch.place_models()
        self.triage = (
            WorkflowTriage(TriageConfig(patience_slo_x=cluster.abandon_after_slo_x))
            if Policy(system.scheduler) is Policy.TRIAGE
            else None
        )

    def push(self, time_s: float, kind: int, obj, tag: int = 0) -> None:
        heapq.heappush(self._events, (time_s, next(self._tie), kind, obj, tag))

    def run(self) -> Recorder:
        for workflow in self.workflows:
            self.push(workflow.arrival_s, ARRIVAL, workflow)
        bar = tqdm(
            total=len(self.workflows),
            desc=f"simulating {self.system.name}",
            unit="wf",
            disable=not self.cluster.show_progress,
            mininterval=1.0,
        )
        handlers = (self._on_arrival, self._on_node, self._on_tool_done, self._on_ttl, self._on_control)
        events = self._events
        while events:
            time_s, _, kind, obj, tag = heapq.heappop(events)
            self.now = time_s
            self.num_events += 1
            done_before = self.num_open
            handlers[kind](obj, tag)
            if self.num_open != done_before:
                bar.update(done_before - self.num_open)
        bar.close()
        self.recorder.finish(self)
        return self.recorder

    # --- handlers --------------------------------------------------------------------------------
    def _on_arrival(self, workflow: SimWorkflow, _tag: int) -> None:
        for stage in workflow.stages:
            stage.num_parents_left = len(stage.parents)
        for stage in workflow.stages:
            if not stage.parents:
                self.make_ready(stage)

    def _on_node(self, node: SimNode, version: int) -> None:
        if version != node.version:
            return
        node.advance(self.now)
        for kind, stage, epoch in node.pop_due():
            if stage.epoch != epoch:  # preempted by an earlier event of this batch
                continue
            if kind == FINISH:
                self.dispatch.finish(node, stage)
            elif kind == GROW:
                self.dispatch.grow(node, stage)
            else:
                self.dispatch.prefilled(node, stage)
        self.dispatch.fill(node)
        self.reschedule(node)

    def _on_tool_done(self, node: SimNode, version: int) -> None:
        if version != node.host.version:
            return
        node.advance(self.now)  # the engine's step rate may change with the number of tool calls
        done, started = node.host.pop_done(self.now)
        self._tools_started(node, started)
        self._reschedule_host(node)
        self.reschedule(node)
        for stage in done:
            self.observe_tool(stage.tool_name, stage.tool_exec_s)
            self.children_ready(stage)

    def _on_ttl(self, stage: SimStage, epoch: int) -> None:
        node = stage.node
        if stage in node.pinned and stage.epoch == epoch:
            node.release(stage, node.pinned.pop(stage))
            self.dispatch.fill(node)
            self.reschedule(node)

    def _on_control(self, node: SimNode, _tag: int) -> None:
        node.cap.adapt(CapSignals(kv_usage=node.alloc.usage, num_tool_jobs=node.num_tool_jobs()), self.now)
        self.dispatch.fill(node)
        self.reschedule(node)
        if self.num_open > 0:
            self.push(self.now + self.cluster.aimd.control_period_s, CONTROL, node)
        else:
            node.is_control_armed = False

    # --- shared steps ----------------------------------------------------------------------------
    def reschedule(self, node: SimNode) -> None:
        node.version += 1
        when = node.next_event_s()
        if when is not None:
            self.push(max(when, self.now), NODE, node, node.version)
        if node.cap is not None and not node.is_control_armed:
            node.is_control_armed = True
            self.push(self.now + self.cluster.aimd.control_period_s, CONTROL, node)

    def make_ready(self, stage: SimStage) -> None:
        workflow = stage.workflow
        if workflow.is_dropped:
            return
        stage.ready_s = self.now
        if self.predict_ready is not None:
            self.predict_ready(stage)
            own_reserve(self.own_reserves, stage)
        request = stage.request = ready_request(stage, self.now, self.cost, self.remaining_work)
        if self.triage is not None and self._triage_sheds(request) and self.system.triage_rejects:
            self.drop(workflow)  # turned away: its caller is told now, not at its deadline
            self.recorder.rejected += 1
            self.recorder.decision("reject", self.now, stage, -1)
            return
        node = self.dispatch.route(stage)
        self.recorder.stage_ready(len(node.core))
        node.core.add(request, self.now)
        node.queued_work_s += request.pred_service_s
        stage.node = node
        self.dispatch.fill(node)
        self.reschedule(node)

    def _triage_sheds(self, request: StageRequest) -> bool:
        """Triage's verdict on a ready stage, fed the pools as they stand now (its model's nodes, the hosts)."""
        model, hosts = request.model, (node.host for node in self.nodes)
        backlogged, nodes = self.dispatch.is_backlogged(model), ModelNodes.of(model, self.nodes)
        return self.triage.apply(request, self.now, backlogged, nodes, tool_pool(hosts))

    def _is_live(self, request: StageRequest, now: float) -> bool:
        return self.dispatch.is_live(request, now)

    def children_ready(self, stage: SimStage) -> None:
        workflow = stage.workflow
        observe_stage(self.remaining_work, stage, self.cost, self.now, self.own_reserves)
        workflow.num_stages_left -= 1
        for child_index in stage.children:
            child = workflow.stages[child_index]
            child.num_parents_left -= 1
            if child.num_parents_left == 0:
                self.make_ready(child)
        if workflow.num_stages_left == 0 and not workflow.is_dropped:
            workflow.done_s = self.now
            self.remaining_work.end(workflow.workflow_id)
            self.close(workflow)

    def close(self, workflow: SimWorkflow) -> None:
        leave(workflow)
        if self.triage is not None:
            self.triage.end(workflow.workflow_id)
        self.num_open -= 1

    def drop(self, workflow: SimWorkflow) -> None:
        if not workflow.is_dropped and workflow.done_s < 0:
            workflow.is_dropped = True
            self.remaining_work.end(workflow.workflow_id, completed=False)
            for stage in workflow.stages:  # a dropped workflow never resumes: the KV kept for it expires now
                if stage.node is not None and stage in stage.node.pinned:
                    self.arm_ttl(stage, 0.0)
            self.close(workflow)

    def submit_tool(self, node: SimNode, stage: SimStage) -> None:
        """Run a stage's tool on its node's host CPU (the caller reschedules the node)."""
        node.advance(self.now)
        self._tools_started(node, node.host.submit(stage, stage.tool_exec_s, self.now))
        self._reschedule_host(node)

    def _tools_started(self, node: SimNode, started: list) -> None:
        if node.cap is not None:
            for _stage, wait_s in started:
                node.cap.observe_tool_wait(wait_s)

    def _reschedule_host(self, node: SimNode) -> None:
        when = node.host.next_done_s()
        if when is not None:
            self.push(max(when, self.now), TOOL_DONE, node, node.host.version)

    def observe_tool(self, tool: str, duration_s: float) -> None:
        self.tool_kv.observe(tool, duration_s)
        self.tool_times.observe(tool, duration_s)

    def predicted_tool_s(self, tool: str) -> float:
        from pipelines.agent_tools import TOOLS

        prior = TOOLS[tool].exec_s_mean if tool in TOOLS else 1.0
        return self.tool_times.get(tool, prior)

    def arm_ttl(self, stage: SimStage, ttl_s: float) -> None:
        if stage.workflow.is_dropped:  # kept after its workflow was dropped (a stage that was running)
            ttl_s = 0.0
        if math.isfinite(ttl_s):
            self.push(self.now + ttl_s, TTL, stage, stage.epoch)
