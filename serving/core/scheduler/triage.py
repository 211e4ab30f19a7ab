"""Workflow triage: deadline order while the admitted workflows can all make their deadlines, and when they cannot,
the workflow with the most predicted work left goes behind — decided when its stages become ready, not in its middle.

This is Moore–Hodgson's rule (which maximises the number of jobs on time on one machine: keep deadline order, and
whenever the job just added would be late, drop the longest job so far) made online, for a pool of nodes that serves
one model. Each open workflow w has a deadline D_w and a predicted remaining pool work W_w, in unloaded seconds of
service (the unit of `StageRequest.pred_service_s`: the ready stage's own service plus `workflow_remaining_s`; no tool
time, which takes none of the pool). The pool completes about `c` such seconds per wall second while work is waiting
(its measured capacity, see below). The workflow also waits T_w of tool time from its ready stage on
(`remaining_tool_s`), outside the pool, so its pool work must end by D'_w = D_w − T_w (`pool_deadline_s`). Sorted by
D', the admitted set is feasible when, for every w,

    Σ_{v: D'_v ≤ D'_w} W_v  ≤  c · (D'_w − now)

and while it is not, the workflow with the largest W among those up to the first violation is shed, and so is one whose
ready stage alone, with its tool time after it, cannot end before its deadline (`is_late_alone`; only the stage's
service: the workflow's remaining service is a median, and a single workflow may well need less). A workflow whose
deadline has passed when a stage of it becomes ready can no longer be met: it is shed while the pool is saturated (it
takes the pool from work that can), and whatever the pool's state where its predicted work, at the pool's pace, would
end after its callers give it up (`patience_slo_x` × its SLO after it arrived, where the caller knows it): the
alternative is abandonment, after the work. Shedding is final, and it withdraws the workflow's claim to its deadline
(`apply`): its stages carry no deadline from then on, so they queue behind every on-time stage (`TriageScheduler`) and
the batch-cost gate admits one only where it endangers no running stage that can still make its deadline. The capacity
goes to the workflows that can still be met; the rest end when there is room (or by the starvation bound,
`late_max_wait_s`).

The feasibility test runs only while the pool is saturated: work of its model waits for its nodes (`backlogged`; a
node holding several models may queue another's, which says nothing of this pool), or, where
`saturated_stretch` is set, its stages run that many × slower than alone (a pool whose batches take every stage never
queues; it slows everyone instead). With room for every stage at near its own pace, shedding one helps nobody. The
stretch is wall over unloaded seconds of the stages the pool finished (where the caller reports their wall time), per
window.

Capacity is measured, not configured: the unloaded seconds of the stages a pool finished over a window, divided by the
window, kept for windows through which the pool was saturated (work waited at every finish, or the window's stretch
reached `saturated_stretch`; a pool with room shows its load, not its capacity), as a moving average. A stage's work
is counted when it ends, so a window shorter than the stages it counts reads the pace at which stages started before
it end, not the pool's: where the caller reports wall times, a window stays open until it is at least as long as the
longest stage it counts (docs/triage.md: pools of long stages read several times low while they filled). With
`saturated_stretch` set, the capacity before the first such window — a burst into an empty fleet — is seeded from what
the pool has shown so far: its stages in flight (assessed, not yet served) at the pace its finished stages ran,
`num_in_flight / stretch`, once `min_seed_stages` finishes were timed. The seed errs high (queued and never-served
stages count as in flight), and the first window's rate — low, since it counts a stage's work only when it ends — is
raised to it. Both are off by default: on the referee's dev-side burst, fed the trained model, they shed three times
as many workflows and lost 4.6 pp (serving/EXPERIMENTS.md, 2026-12-04).

Where models move between nodes or share one, the pool's own figure measured other nodes than the model can use now,
or only its share of a node. There (the caller gives the nodes the router would load the model on, `ModelNodes.names`:
those running it, else those whose weight budget could take it) the capacity is what the model can get on them: each
node at its own measured rate (its unloaded seconds of every model over its saturated windows, `pool_window.Pool`;
the fleet's mean node rate where one has none yet), never below the pool's own figure. A pool alone on the nodes it was
measured on keeps its own figure (one model on every node: unchanged).

Tool calls have a pool of their own: the host CPUs that run them (`ToolPool`: the tool work they run a second, and
whether a call waits for one). A fleet whose GPUs have room can still be overloaded there, and then no stage waits for
a node, the test above never runs, and every workflow waits in the hosts' queue until most are late (measured:
serving/EXPERIMENTS.md, 2026-12-06). So while calls wait for the hosts, the same test runs over them: each open
workflow's tool work ahead (`remaining_tool_work_s`, the seconds its tools run on a CPU, not the time they wait for
one) must end by its deadline less its ready stage's service, Moore–Hodgson sheds the workflows with the most tool work
where the set cannot all end in time, and a workflow whose deadline has passed is shed, as while the pool is saturated.
The simulator reads its hosts' workers; the gateway its callers' (`sessions.tool_workers`, saturated while more
sessions are in a tool call); the vLLM plugin none (the engine never sees a tool).

With no workflow prediction W is the ready stage's own service (triage sheds by stage size); fed the predicted
remaining work it sheds the workflows that would use the most of the pool.
The gateway, the simulator and the vLLM plugin call the same object: `assess` when a stage becomes ready, `served`
when one finishes, `end` when a workflow does.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator

from serving.core.request import StageRequest
from serving.core.residency import ModelNodes
from serving.core.scheduler.base import SchedulerConfig, merge_by_wait
from serving.core.scheduler.pool_window import Pool, ToolPool, TriageConfig, moore_hodgson
from serving.core.scheduler.slack import LeastSlackScheduler, SlackQueue


def pool_deadline_s(request: StageRequest) -> float:
    """When the workflow's pool work must end for the workflow to make its deadline: the deadline less the tool time
    predicted ahead of it (`remaining_tool_s`), which it waits outside the pool."""
    return request.deadline_s - request.remaining_tool_s


def is_late_alone(request: StageRequest, now: float) -> bool:
    """Whether the ready stage cannot end by its deadline even alone on a node, with its workflow's predicted tool time
    still to wait (only the stage's service: the workflow's remaining service is a median, and a single workflow may
    well need less)."""
    return request.pred_service_s + request.remaining_tool_s > request.deadline_s - now


class WorkflowTriage:
    """Which workflows are shed (see the module docstring); one per cluster, pools keyed by model."""

    def __init__(self, config: TriageConfig | None = None):
        self.config = config or TriageConfig()
        self.pools: dict[str, Pool] = {}
        self.node_pools: dict[str, Pool] = {}  # each node's windows over every model it serves (`capacity_s`)
        self.shed: set[str] = set()
        self.tool_open: dict[str, tuple[float, float]] = {}  # workflow → (deadline of its tool work, that work)
        self.num_assessed = 0
        self.num_shed = 0  # workflows shed so far, whichever workflow's stage the test that shed them ran for

    def assess(
        self,
        request: StageRequest,
        now: float,
        backlogged: bool = True,
        nodes: ModelNodes | None = None,
        tools: ToolPool | None = None,
    ) -> bool:
        """A stage of `request.workflow_id` became ready: update its workflow's predicted work, re-check the pool's
        admitted set (only while the pool is saturated: work waits for its nodes, `backlogged`, or its stages run
        `saturated_stretch` × slower than alone), and say whether the workflow is shed. `nodes`: where the router
        would load the model now (None: the pool's own capacity); `tools`: the tool workers (None: not triaged on)."""
        workflow = request.workflow_id
        self.num_assessed += 1
        if workflow in self.shed:
            return True
        pool = self.pools.setdefault(request.model, Pool())
        pool.nodes = nodes or pool.nodes
        pool.open[workflow] = (pool_deadline_s(request), request.pred_service_s + request.workflow_remaining_s)
        is_saturated = self.is_saturated(pool, backlogged)
        is_tools_saturated = tools is not None and tools.is_saturated
        if tools is not None:
            self.tool_open[workflow] = (request.deadline_s - request.pred_service_s, request.remaining_tool_work_s)
        if request.deadline_s < now and (is_saturated or is_tools_saturated or self.is_given_up(request, pool, now)):
            self._shed(workflow)
        elif is_saturated:
            capacity = self.capacity_s(pool)
            if is_late_alone(request, now):
                self._shed(workflow)
            elif capacity is not None and math.isfinite(request.deadline_s):
                for name in moore_hodgson(pool.open, capacity, now):
                    self._shed(name)
        if is_tools_saturated and workflow not in self.shed and math.isfinite(request.deadline_s):
            for name in moore_hodgson(self.tool_open, tools.capacity_s, now):
                self._shed(name)
        is_shed = workflow in self.shed
        pool.num_in_flight += not is_shed
        return is_shed

    def is_given_up(self, request: StageRequest, pool: Pool, now: float) -> bool:
        """Whether the workflow's predicted work, at the pool's pace, ends after its callers give it up
        (`patience_slo_x` × its SLO after it arrived); False where the patience is not known."""
        if self.config.patience_slo_x is None:
            return False
        give_up_s = request.workflow_arrival_s + self.config.patience_slo_x * (
            request.deadline_s - request.workflow_arrival_s
        )
        work_s = request.pred_service_s + request.workflow_remaining_s
        return now + work_s * max(1.0, pool.stretch_now(self.config) or 1.0) > give_up_s

    def is_saturated(self, pool: Pool, backlogged: bool) -> bool:
        return backlogged or self.config.is_stretched(pool.stretch_now(self.config))

    def capacity_s(self, pool: Pool) -> float | None:
        """Unloaded seconds the pool serves per wall second: measured over saturated windows; before the first, seeded
        from what the pool has shown so far — its stages in flight at the pace its finished stages ran
        (`num_in_flight` / stretch), which over-counts rather than under-counts (queued stages are in flight too);
        raised to its nodes' rates where its own figure did not measure them (`is_own_measure`)."""
        own = pool.seeded_capacity_s(self.config)
        nodes = pool.nodes
        if own is None or nodes is None or self.is_own_measure(pool):
            return own
        rates = [p.capacity for p in self.node_pools.values() if p.capacity is not None]
        if not rates:
            return own
        mean = sum(rates) / len(rates)
        node_rates = (self.node_pools.get(n, Pool()).capacity for n in sorted(nodes.names))
        return max(own, sum(mean if rate is None else rate for rate in node_rates))

    def is_own_measure(self, pool: Pool) -> bool:
        """Whether the pool's own figure measured its nodes: they are the nodes it ran on when it was measured, and
        they served no other model (a node's other models take its time, so the pool reads only its share)."""
        names = pool.nodes.names if pool.nodes is not None else frozenset()
        return names == pool.measured_on and all(
            len(self.node_pools[n].models) <= 1 for n in names if n in self.node_pools
        )

    def apply(
        self,
        request: StageRequest,
        now: float,
        backlogged: bool = True,
        nodes: ModelNodes | None = None,
        tools: ToolPool | None = None,
    ) -> bool:
        """`assess`, and a shed workflow's stage marked shed with no deadline left to meet."""
        if self.assess(request, now, backlogged, nodes, tools):
            request.is_shed, request.deadline_s = True, math.inf
        return request.is_shed

    def _shed(self, workflow: str) -> None:
        self.num_shed += workflow not in self.shed
        self.shed.add(workflow)
        self.tool_open.pop(workflow, None)
        for pool in self.pools.values():
            pool.open.pop(workflow, None)

    def served(
        self,
        model: str,
        work_s: float,
        now: float,
        backlogged: bool,
        wall_s: float | None = None,
        node: str | None = None,
        is_node_backlogged: bool = False,
    ) -> None:
        """A stage of `model` finished after `work_s` unloaded seconds of service (`wall_s` on the clock, where the
        caller knows it); `backlogged`: work was waiting for the pool's nodes. `node`: where it ran (its node's rate is
        measured too; `is_node_backlogged`: work of any model was waiting there)."""
        pool = self.pools.setdefault(model, Pool())
        pool.num_in_flight = max(0, pool.num_in_flight - 1)
        pool.count(work_s, now, backlogged, wall_s, self.config)
        if node is not None:
            node_pool = self.node_pools.setdefault(node, Pool())
            node_pool.models.add(model)
            node_pool.count(work_s, now, is_node_backlogged, wall_s, self.config)

    def end(self, workflow: str) -> None:
        """The workflow ended (completed or dropped)."""
        self.shed.discard(workflow)
        self.tool_open.pop(workflow, None)
        for pool in self.pools.values():
            pool.open.pop(workflow, None)


class TriageQueue(SlackQueue):
    """One class of work: on-time stages by deadline, shed (or past-deadline) stages behind them."""

    def push(self, request: StageRequest, now: float) -> None:
        if request.is_shed or request.deadline_s - request.pred_service_s < now:
            self._push_late(request)
        else:
            self.on_time.push((request.deadline_s, request.ready_s), request)

    def demote(self, now: float) -> None:
        """Move every stage whose deadline has passed behind on-time work."""
        while (entry := self.on_time.top()) is not None and entry[0][0] < now:
            self._push_late(self.on_time.pop())


class TriageScheduler(LeastSlackScheduler):
    """Earliest deadline first across both classes among on-time stages; the stages of workflows that `WorkflowTriage`
    shed, and stages that can no longer end by their deadline, behind every on-time stage of either class, interactive
    before batch among them. A late interactive stage never goes before an on-time batch stage: its own deadline is lost
    already, the batch stage's is not.

    On-time interactive stages are not put first by class: in heavy overload that gave a turn on time the pool that a
    batch workflow with an earlier deadline needed (serving/EXPERIMENTS.md). What keeps a turn's queueing short is
    that the batch-cost gate never holds one back, and that a batch stage the gate holds does not hold up the stages
    behind it (`serving.core.dispatch.HELD_BACK`).

    The starvation bounds: a late head that waited `late_max_wait_s` beats on-time work, and among late stages a batch
    head that waited `batch_max_wait_s` beats the interactive one. Which workflows are shed: the module docstring.
    """

    def __init__(self, config: SchedulerConfig):
        super().__init__(config)
        self._interactive, self._batch = TriageQueue(config), TriageQueue(config)

    def peek(self, now: float) -> StageRequest | None:
        return next(self.in_order(now), None)

    def in_order(self, now: float) -> Iterator[StageRequest]:
        inter, batch, config = self._interactive, self._batch, self.config
        inter.demote(now)
        batch.demote(now)

        on_time = (e[2] for e in heapq.merge(inter.on_time.in_order(), batch.on_time.in_order(), key=lambda e: e[0]))
        late = merge_by_wait(
            (e[2] for e in inter.late.in_order()), (e[2] for e in batch.late.in_order()), config.batch_max_wait_s, now
        )
        return merge_by_wait(on_time, late, config.late_max_wait_s, now)
