"""The gateway and the simulator make the same admit / wait / node decisions: both drive one dispatch core.

Every system of the table (serving/core/systems.py) runs on both paths by its name: live, a `Gateway` configured with
`system: {name: ...}` (its queue order, router, session cap, batch-cost gate, admission headroom, and the reservation
mode that says what a starting stage maps); simulated, the `Simulator` with the same `System`.

The same stages, in the same order, meet the same node states on both paths: live, the gateway `Dispatcher` on the
test's clock with gateway `Node`s whose vLLM metrics are set by hand (no server; vLLM's KV usage follows the
reservations, as when each stage holds its reserve); simulated, the simulator's `make_ready`/`finish` on `SimNode`s
whose KV pools have the same sizes. After every step each stage is running on a node or waiting, and the two paths
must agree.

The batch-cost gate engages in its own sequence (`GATE_STEPS`): tight SLOs on one node whose prefills slow its
decoding. Before each step the gateway's node is given what the simulated node shows as measurements: its pace (the
step clock's rate, the prefills' chunks included), its bare step and the prefill's time as the delay to a first token
(the simulated node's prefills that end by then have ended: the test runs no other node event); the GPU's
decode step is its fixed overhead (`GATE_COST`), so a stage adds no step time there, as the gateway assumes. Both
paths then give the gate the same inputs, and it holds the same stages back.

Workflow triage runs on both paths too: live, the gateway's (`Gateway.turns_away` when a stage is ready, with its
`workflow_remaining_s` from the workflow prediction; `served` and `end_workflow` when it finishes), simulated, the
simulator's; `TRIAGE_STEPS` measures the node's capacity and then sheds, and both paths shed (with the maestro system:
turn away) the same workflows.

The simulator keeps one queue per node (a stage is routed when it becomes ready) where the gateway keeps one queue for
all nodes (a stage is placed when it starts); they decide alike while no stage waits on a node that another stage
could use, which is what the multi-node sequence covers; waiting, backfill and the wake-up at a finish are covered on
one node, where both queues are the same.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque

import numpy as np
import pytest

from maestro.prediction import FallbackLevel, OutputSize, Prediction, WorkflowFallbackLevel
from serving.core.admission.batch_cost import BatchCostGate
from serving.core.admission.sizing import output_tokens_to_map
from serving.core.kv import KVAllocator, KVAllocatorConfig
from serving.core.request import WorkflowInfo, stage_request
from serving.core.systems import SYSTEMS as TABLE
from serving.core.systems import System, get_system
from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway
from serving.gateway.jobs import Job
from serving.gateway.metadata import StageMeta
from serving.gateway.nodes import Node
from serving.sim.costmodel import CostModel, CostModelConfig, GPUProfile
from serving.sim.engine import ClusterConfig, Simulator
from serving.sim.gpu_pace import ModelPace
from serving.sim.ready import known_remaining
from serving.sim.workload import SimStage, SimWorkflow

BLOCK_TOKENS = 128
MODEL = "llama-3-8b"
SYSTEMS = list(TABLE.values())
FITNESS_SYSTEM = get_system("maestro-srtf")  # the sequences' own checks below read node choice by fitness
SLO_S = 600.0


class Live:
    """The gateway path: a Gateway's dispatcher over its nodes (peak admission: free = unreserved and unused by
    vLLM), on the test's clock, their vLLM metrics and measured pace set by hand."""

    def __init__(self, node_blocks: dict[str, int], system: System, cost: CostModelConfig | None = None):
        self.pace = ModelPace.of(CostModel(cost or CostModelConfig()), MODEL)
        self.now = 0.0
        self.loop = asyncio.new_event_loop()
        self.gateway = Gateway(
            GatewayConfig(
                nodes=[{"name": name, "url": f"http://{name}"} for name in node_blocks],
                system={
                    "name": system.name,
                    "admission_headroom_frac": system.admission_headroom_frac,
                    "triage_rejects": system.triage_rejects,
                },
                kv={"admission": "peak", "overcommit": 1.0},
                limits={"admission_recheck_s": 0, "max_queued": 64},
            )
        )
        self.system, self.dispatcher = self.gateway.system, self.gateway.dispatcher
        self.dispatcher.clock = lambda: self.now
        self.gateway.pace = self.pace  # the gateway's unit of service, here the simulated node's
        self.nodes = {node.name: node for node in self.gateway.nodes}
        for node, num_blocks in zip(self.gateway.nodes, node_blocks.values()):
            Live._report(node, num_blocks, 0)
            node.is_healthy = True
        self.jobs: dict[str, Job] = {}
        self.rejected: set[str] = set()

    @staticmethod
    def _report(node: Node, num_blocks: int, used_blocks: int) -> None:
        """What vLLM's /metrics would say (its null block included in num_gpu_blocks)."""
        node.apply_metrics(
            {
                "vllm:kv_cache_usage_perc": ({}, used_blocks / num_blocks),
                "vllm:cache_config_info": (
                    {"num_gpu_blocks": str(num_blocks + 1), "block_size": str(BLOCK_TOKENS)},
                    1.0,
                ),
            }
        )

    def measure(self, pace_s_per_token: float, step_s: float, first_token_delay_s: float) -> None:
        """What the nodes' finished calls measured: the pace of a running stage, the fastest call's, the delay to a
        first token."""
        for node in self.nodes.values():
            node.pace.mean_pace, node.pace.recent_paces = 1.0 / pace_s_per_token, deque([1.0 / step_s])
            node.pace.first_token_delay_s = first_token_delay_s

    def poll(self, now: float) -> None:
        """A /metrics poll: vLLM holds what the running stages reserved."""
        self.now = now
        for node in self.nodes.values():
            self._report(node, node.num_blocks, node.kv.allocator.backend.num_mapped_pages)
        self.dispatcher.pump()

    def submit(
        self,
        name: str,
        now: float,
        prompt_tokens: int,
        reserve_tokens: int,
        slo_s: float = SLO_S,
        wf: tuple[float, float] | None = None,
    ) -> None:
        """`wf`: the workflow prediction's remaining calls and tokens (None: an answer without one)."""
        # built as both paths build it, at the simulator's pace, so that both order alike
        self.now = now
        level = WorkflowFallbackLevel.PRIOR if wf is None else WorkflowFallbackLevel.APP
        calls, tokens = wf or (4.0, 400.0)
        prediction = Prediction(
            name,
            "s0",
            0.0,
            FallbackLevel.ROLE,
            tokens_pred=reserve_tokens,
            tokens_reserve=reserve_tokens,
            wf_remaining_calls=calls,
            wf_remaining_tokens=tokens,
            wf_fallback_level=level,
        )
        remaining_s = self.gateway.workflow_remaining_s(prediction, prompt_tokens, name, "shared", 0)
        request = stage_request(
            WorkflowInfo(name, now, now + slo_s, remaining_s=remaining_s),
            "s0",
            prompt_tokens=prompt_tokens,
            tokens_pred=reserve_tokens,
            tokens_reserve=reserve_tokens,
            max_tokens=reserve_tokens,
            pace=self.pace,
            ready_s=now,
            model=MODEL,
        )
        mapped = output_tokens_to_map(self.system.reservation, reserve_tokens, reserve_tokens)  # as the gateway maps
        job = Job(StageMeta(name, "s0"), request, reserve_tokens=prompt_tokens + mapped, prediction=prediction)
        job.future, request.payload = self.loop.create_future(), job
        if self.gateway.turns_away(job):  # as call.py asks when the stage is ready
            self.rejected.add(name)
            return
        self.jobs[name] = job
        self.dispatcher.submit(job)

    def finish(self, name: str, now: float) -> None:
        """The stage's call ends (its output as predicted), and with it its workflow, as `Gateway.record` sees it."""
        self.now = now
        job = self.jobs.pop(name)
        self.dispatcher.finish(job)
        service_s = self.gateway.pace.service_s(job.request.prompt_tokens, job.request.tokens_pred)
        self.gateway.remaining_work.observe(name, "shared", service_s)  # as `Gateway.record` feeds the history
        self.gateway.served(job, service_s)
        self.gateway.end_workflow(name, completed=True)

    def shed(self) -> set[str]:
        """Workflows whose queued or running stage the triage left without a deadline."""
        return {name for name, job in self.jobs.items() if job.request.is_shed}

    def state(self) -> dict[str, str | None]:
        return {
            name: (job.node.name if job.node is not None else None)
            for name, job in self.jobs.items()
            if job.node is not None or not job.future.done()
        }


class Simulated:
    """The simulator's path: its routing and per-node fill over SimNodes, the clock set by hand."""

    def __init__(self, node_blocks: dict[str, int], system: System, cost: CostModelConfig | None = None):
        cluster = ClusterConfig(
            num_nodes=len(node_blocks),
            placement=[(MODEL,)],
            prefix_caching=False,
            show_progress=False,
            grow_chunk_tokens=1,  # on demand: a token at a time, as live
            cost=cost or CostModelConfig(),
        )
        cluster.page_bytes = BLOCK_TOKENS * cluster.cost.models[MODEL].kv_bytes_per_token
        cluster.kv_pool_bytes = max(node_blocks.values()) * cluster.page_bytes
        self.sim = Simulator(cluster, system, [])
        self.names = {node: name for node, name in zip(self.sim.nodes, node_blocks)}
        for node, num_blocks in zip(self.sim.nodes, node_blocks.values()):
            # vLLM has no virtual ranges to run out of: overcommit them far enough never to refuse
            node.alloc = KVAllocator(KVAllocatorConfig(num_blocks * cluster.page_bytes, cluster.page_bytes, 1000.0))
        self.stages: dict[str, SimStage] = {}

    def poll(self, now: float) -> None:
        pass  # the simulator's nodes are always up to date

    def submit(
        self,
        name: str,
        now: float,
        prompt_tokens: int,
        reserve_tokens: int,
        slo_s: float = SLO_S,
        wf: tuple[float, float] | None = None,
        interactive: bool = False,
    ) -> None:
        workflow = SimWorkflow(name, "shared", interactive=interactive, slo_s=slo_s, arrival_s=now)
        stage = SimStage(
            workflow,
            0,
            "s0",
            "agent",
            MODEL,
            [],
            output_tokens=reserve_tokens,
            is_tool_call=False,
            prompt_tokens=prompt_tokens,
            max_tokens=reserve_tokens,
            size=OutputSize(tokens_pred=reserve_tokens, tokens_reserve=reserve_tokens),
        )
        if wf is not None:
            stage.remaining = known_remaining(*wf, WorkflowFallbackLevel.APP)
        workflow.stages, workflow.num_stages_left = [stage], 1
        self.stages[name] = stage
        self.end_prefills(now)
        self.sim.make_ready(stage)

    def end_prefills(self, now: float) -> None:
        """Run the nodes' prefill ends due by `now` (the test ends stages by hand: no other node event runs)."""
        for node in self.sim.nodes:
            while (next_v := node.steps.next_end_v()) < float("inf"):
                when = max(node.last_s, node.stall_end_s) + max(0.0, next_v - node.v) * node.step_s()
                if when > now:
                    break
                self.sim.now = when
                node.advance(when)
                for stage in node.steps.due(node.v):
                    self.sim.dispatch.prefilled(node, stage)
        self.sim.now = now

    def finish(self, name: str, now: float) -> None:
        stage = self.stages[name]
        self.end_prefills(now)
        self.sim.dispatch.finish(stage.node, stage)
        self.sim.dispatch.fill(stage.node)

    def state(self) -> dict[str, str | None]:
        return {
            name: (self.names[s.node] if s in s.node.running else None)
            for name, s in self.stages.items()
            if s.workflow.done_s < 0 and not s.workflow.is_dropped
        }

    @property
    def rejected(self) -> set[str]:
        return {name for name, s in self.stages.items() if s.workflow.is_dropped}

    def shed(self) -> set[str]:
        return {
            name
            for name, s in self.stages.items()
            if s.request is not None and s.request.is_shed and s.workflow.done_s < 0 and not s.workflow.is_dropped
        }


def blocks(n: int) -> tuple[int, int]:
    """(prompt, reserve) tokens of a stage that maps n blocks under every reservation mode: its prompt fills n − 1
    blocks and a token, its reserve (= max_tokens) the rest of the last block, and on demand it maps one token."""
    return (n - 1) * BLOCK_TOKENS + 1, BLOCK_TOKENS - 1


# (step, stage, blocks it needs); "finish" ends a running stage, "poll" reads vLLM's /metrics.
MULTI_NODE = [
    ("submit", "s1", 4),
    ("submit", "s2", 4),
    ("submit", "s3", 3),
    ("submit", "s4", 6),
    ("finish", "s1", 0),
    ("poll", "", 0),
    ("submit", "s5", 5),
    ("submit", "s6", 2),
    ("finish", "s4", 0),
    ("submit", "s7", 7),
    ("submit", "s8", 2),
    ("submit", "big", 15),
]
ONE_NODE = [
    ("submit", "s1", 6),
    ("submit", "s2", 6),
    ("submit", "big", 10),
    ("submit", "s3", 2),
    ("submit", "s4", 2),
    ("finish", "s3", 0),
    ("submit", "s5", 2),
    ("submit", "s6", 1),
    ("finish", "s1", 0),
    ("poll", "", 0),
    ("finish", "s2", 0),
    ("submit", "s7", 3),
]


def run(
    path_cls, node_blocks: dict[str, int], steps: list, system: System = FITNESS_SYSTEM
) -> list[dict[str, str | None]]:
    path, states = path_cls(node_blocks, system), []
    for i, (step, name, num_blocks) in enumerate(steps):
        now = float(i + 1)
        if step == "submit":
            path.submit(name, now, *blocks(num_blocks))
        elif step == "finish":
            path.finish(name, now)
        else:
            path.poll(now)
        states.append(path.state())
    return states


CASES = [({"a": 8, "b": 12, "c": 16}, MULTI_NODE), ({"a": 16, "b": 16}, MULTI_NODE), ({"a": 16}, ONE_NODE)]


@pytest.mark.parametrize("system", SYSTEMS, ids=lambda s: s.name)
@pytest.mark.parametrize("node_blocks, steps", CASES)
def test_gateway_and_simulator_decide_alike(node_blocks, steps, system):
    live, simulated = run(Live, node_blocks, steps, system), run(Simulated, node_blocks, steps, system)
    for (step, name, _), live_state, sim_state in zip(steps, live, simulated):
        assert live_state == sim_state, f"after {step} {name}"
    assert any(node is None for state in live for node in state.values())  # some stage waited


def test_the_sequences_exercise_node_choice_waiting_and_backfill():
    multi = run(Live, {"a": 8, "b": 12, "c": 16}, MULTI_NODE)
    assert multi[1] == {"s1": "a", "s2": "b"}  # all empty: any; then the node with the larger free share
    assert len({node for state in multi for node in state.values() if node}) == 3  # every node was chosen
    assert multi[-1]["big"] is None  # 15 blocks fit nowhere now: it waits
    one = run(Live, {"a": 16}, ONE_NODE)
    assert one[2]["big"] is None and one[3]["s3"] == "a"  # the waiting head is passed by a stage that fits
    assert one[-1]["big"] == "a"  # and starts once a finish makes room


HEADROOM_SYSTEM = FITNESS_SYSTEM.with_overrides(admission_headroom_frac=0.25)  # 2, 3 and 4 blocks of 8, 12, 16
# One node: "s2" and later "s4" wait for the headroom; two: the headroom sends "s3" to the other node.
HEADROOM_CASES = [
    (
        {"a": 16},
        [
            ("submit", "s1", 6),
            ("submit", "s2", 7),
            ("submit", "s3", 3),
            ("finish", "s1", 0),
            ("poll", "", 0),
            ("submit", "s4", 5),
        ],
    ),
    ({"a": 8, "b": 12}, [("submit", "s1", 2), ("submit", "s2", 3), ("submit", "s3", 5)]),
]


@pytest.mark.parametrize("node_blocks, steps", HEADROOM_CASES)
def test_both_paths_keep_the_systems_admission_headroom_free(node_blocks, steps):
    live = run(Live, node_blocks, steps, HEADROOM_SYSTEM)
    assert live == run(Simulated, node_blocks, steps, HEADROOM_SYSTEM)
    assert live != run(Live, node_blocks, steps, FITNESS_SYSTEM)  # the headroom changed a decision


# A GPU whose decode step is its fixed overhead (memory reads free, prefills not): every step the same, and a stage
# adds nothing to one, which is what the gateway, measuring only its pace, assumes (the datasheet model's formulas).
GATE_COST = CostModelConfig(
    gpu="flat",
    gpus={"flat": GPUProfile("flat", 80e9, math.inf, 4.6e12)},
    step_overhead_s=2.0**-5,
    step_model="datasheet",
)
GATE_PROMPT = 129  # every stage's, so one delay to a first token is every prefill's stall (0.9 s)
# (time, step, stage, output tokens, SLO): "anchor" runs throughout, past its 1-token prediction on both paths; "warm"
# stalls the node, so that its pace is measured congested (2.3-2.5 steps a token); "tight" can still make its SLO, but
# not with another prefill: "late" and "later", which come during its own prefill, wait until it ends.
GATE_STEPS = [
    (1.0, "submit", "anchor", 1, SLO_S),
    (2.0, "submit", "warm", 100, SLO_S),
    (3.0, "finish", "warm", 0, 0),
    (4.0, "submit", "tight", 20, 2.5),
    (4.5, "submit", "late", 50, SLO_S),
    (4.6, "submit", "later", 30, SLO_S),
    (5.0, "finish", "tight", 0, 0),
    (6.0, "finish", "late", 0, 0),
]


class RecordingGate(BatchCostGate):
    """The batch-cost gate, keeping what it was given and what it answered."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def admits(self, batch, stall_s, added_step_s, candidate_tokens, candidate_slack_s) -> bool:
        is_ok = super().admits(batch, stall_s, added_step_s, candidate_tokens, candidate_slack_s)
        inputs = (
            batch.remaining_tokens,
            batch.slack_s,
            batch.is_savable,
            batch.pace_s_per_token,
            batch.step_s,
            stall_s,
            added_step_s,
            candidate_tokens,
            candidate_slack_s,
        )
        call = tuple(np.asarray(x, dtype=float) for x in inputs), is_ok
        if not self.calls or not _same_call(self.calls[-1], call):  # the simulator asks twice: to route, to start
            self.calls.append(call)
        return is_ok


def _same_call(one: tuple, other: tuple, atol: float = 0.0) -> bool:
    return one[1] == other[1] and all(
        np.allclose(a, b, rtol=1e-9, atol=atol) and a.shape == b.shape for a, b in zip(one[0], other[0])
    )


def run_gate(system: System) -> tuple[list, list, RecordingGate | None, RecordingGate | None]:
    """`GATE_STEPS` on one node on both paths, the gateway's measurements taken from the simulated node before each
    step; returns each path's states after every step and its gate."""
    live, simulated = Live({"a": 16}, system, GATE_COST), Simulated({"a": 16}, system, GATE_COST)
    gates = (RecordingGate(), RecordingGate()) if system.batch_cost else (None, None)
    live.dispatcher.batch_cost, simulated.sim.dispatch.batch_gate = gates
    node, cost = simulated.sim.nodes[0], simulated.sim.cost
    prefill_s = cost.prefill_s(cost.model(MODEL), GATE_PROMPT)
    live_states, sim_states = [], []
    for now, step, name, tokens, slo_s in GATE_STEPS:
        simulated.end_prefills(now)
        live.measure(node.pace_s_per_token(now), node.decode_step_s(), prefill_s)
        for path, states in ((live, live_states), (simulated, sim_states)):
            if step == "submit":
                path.submit(name, now, GATE_PROMPT, tokens, slo_s)
            else:
                path.finish(name, now)
            states.append(path.state())
    return live_states, sim_states, *gates


@pytest.mark.parametrize("system", SYSTEMS, ids=lambda s: s.name)
def test_the_batch_cost_gate_gets_the_same_inputs_and_holds_the_same_stages_back_on_both_paths(system):
    live_states, sim_states, live_gate, sim_gate = run_gate(system)
    assert live_states == sim_states
    if not system.batch_cost:
        assert live_states[4]["late"] == "a"  # no gate: "late" starts in "tight"'s prefill
        return
    assert live_states[4]["late"] is None and live_states[5]["later"] is None  # held back by the gate
    assert live_states[6] == {"anchor": "a", "late": "a", "later": "a"}  # and started once "tight" ended
    assert live_gate.num_refused > 0 and sim_gate.num_refused > 0
    assert len(live_gate.calls) == len(sim_gate.calls)
    # To within a step: the gateway dates a first token by the prefill's time, the simulator by the end of the step
    # that carries the prefill's chunk (the running stages' slack), and prices a chunk's attention pairs at the middle
    # of what the prefill has left (its stall).
    step_s = GATE_COST.step_overhead_s
    assert all(_same_call(one, other, atol=step_s) for one, other in zip(live_gate.calls, sim_gate.calls))
    assert [is_ok for _, is_ok in live_gate.calls].count(False) == 3  # "late" twice, "later" once


def test_the_simulators_gate_never_holds_an_interactive_stage_back():
    """`GATE_STEPS` with "late" an interactive turn: it starts in "tight"'s prefill; "later", batch, is still held."""
    simulated = Simulated({"a": 16}, TABLE["maestro"], GATE_COST)
    for now, step, name, tokens, slo_s in GATE_STEPS[:6]:
        simulated.end_prefills(now)
        if step == "submit":
            simulated.submit(name, now, GATE_PROMPT, tokens, slo_s, interactive=name == "late")
        else:
            simulated.finish(name, now)
    assert simulated.state()["late"] == "a" and simulated.state()["later"] is None


# Workflow triage (serving/core/scheduler/triage.py) on one node of 16 blocks, every stage 4 of them and ~1.9 s of work:
# "w1"-"w4" fill it and "q1"-"q6" wait (SLO_S); five finishes with work waiting at each measure its capacity (~0.54 s
# of work a second over 16 s: the window stays open until it spans "w4", which ran 16 s). Then workflows with tight
# SLOs and their remaining work predicted arrive while work waits: "fits" can make its deadline beside the rest; "long"
# (the most remaining work) and "short-slo" (its own stage cannot end in time) cannot; "more" fits once "long" is gone,
# and "huge" not even then.
# (step, name, SLO, the workflow prediction's remaining calls and tokens)
TRIAGE_STEPS = (
    [("submit", f"w{i}", SLO_S, (0.0, 0.0)) for i in range(1, 5)]
    + [("submit", f"q{i}", SLO_S, (1.0, 100.0)) for i in range(1, 7)]
    + [
        ("finish", "w1", 0, None),
        ("finish", "w2", 0, None),
        ("finish", "w3", 0, None),
        ("finish", "w4", 0, None),
        ("finish", "q1", 0, None),
        ("submit", "fits", 20.0, (2.0, 400.0)),
        ("submit", "long", 20.0, (3.0, 700.0)),
        ("submit", "more", 25.0, (1.0, 300.0)),
        ("submit", "short-slo", 1.0, (0.0, 0.0)),
        ("submit", "huge", 30.0, (6.0, 2000.0)),
        ("submit", "no-wf", SLO_S, None),
    ]
)
TRIAGE_TIMES = [float(i + 1) for i in range(10)] + [11.0, 14.0, 17.0, 20.0, 27.0, 28.0, 28.5, 29.0, 29.5, 30.0, 30.5]


def run_triage(path_cls, system: System) -> tuple[object, list]:
    path, states = path_cls({"a": 16}, system), []
    for now, (step, name, slo_s, wf) in zip(TRIAGE_TIMES, TRIAGE_STEPS):
        if step == "submit":
            path.submit(name, now, *blocks(4), slo_s=slo_s, wf=wf)
        else:
            path.finish(name, now)
        states.append(path.state())
    return path, states


TRIAGE_SYSTEMS = [get_system("maestro"), get_system("maestro").with_overrides(triage_rejects=False)]


@pytest.mark.parametrize("system", TRIAGE_SYSTEMS, ids=["rejects", "serves-behind"])
def test_gateway_and_simulator_shed_the_same_workflows(system):
    live, live_states = run_triage(Live, system)
    simulated, sim_states = run_triage(Simulated, system)
    assert live_states == sim_states
    assert live.gateway.triage.triage.pools[MODEL].capacity == pytest.approx(
        simulated.sim.triage.pools[MODEL].capacity, rel=1e-12
    )
    if system.triage_rejects:
        assert live.rejected == simulated.rejected == {"long", "short-slo", "huge"}
        assert simulated.sim.recorder.rejected == live.gateway.triage.num_rejected_workflows == 3
    else:
        assert live.shed() == simulated.shed() == {"long", "short-slo", "huge"}
        assert not live.rejected and not simulated.rejected
