"""Triage over the hosts' tool workers: Moore–Hodgson on the tool work ahead, only while calls wait for a worker."""

import copy
import math

import pytest

from serving.core.request import StageRequest
from serving.core.scheduler.pool_window import ToolPool, moore_hodgson
from serving.core.scheduler.remaining import RemainingWork
from serving.core.scheduler.triage import WorkflowTriage
from serving.core.systems import get_system
from serving.gateway.sessions import Sessions
from serving.sim.engine import ClusterConfig, Simulator
from serving.sim.hostcpu import HostCPU, tool_pool
from serving.sim.workload import SimStage, SimWorkflow, reset

WAITING = ToolPool(capacity_s=2.0, is_saturated=True)  # two workers, a call waiting for one


def request(workflow: str, deadline_s: float, tool_work_s: float) -> StageRequest:
    """A ready 1 s stage of `workflow` with `tool_work_s` seconds of tool work ahead of it on a host CPU."""
    return StageRequest(
        workflow, f"{workflow}-s", "m", deadline_s=deadline_s, pred_service_s=1.0, remaining_tool_work_s=tool_work_s
    )


def test_moore_hodgson_sheds_the_most_work_up_to_the_first_late_prefix():
    open_work = {"a": (10.0, 6.0), "b": (12.0, 3.0), "c": (14.0, 8.0), "never": (math.inf, 99.0)}
    # by 10: 6 ≤ 10; by 12: 9 ≤ 12; by 14: 17 > 14 → the most work of a, b, c goes (c); no deadline, never counted
    assert moore_hodgson(open_work, 1.0, 0.0) == ["c"]
    assert moore_hodgson(open_work, 2.0, 0.0) == []


def test_while_calls_wait_the_workflow_with_the_most_tool_work_is_shed():
    triage = WorkflowTriage()
    # deadlines less the 1 s stage: 19 and 29; with two workers 30 s of tool work fit by 29, 46 do not
    assert not triage.assess(request("light", 20.0, 10.0), now=0.0, backlogged=False, tools=WAITING)
    assert not triage.assess(request("heavy", 30.0, 20.0), now=0.0, backlogged=False, tools=WAITING)
    assert triage.shed == set()
    triage.assess(request("heavier", 30.0, 36.0), now=0.0, backlogged=False, tools=WAITING)
    assert triage.shed == {"heavier"}


def test_no_tool_shedding_while_every_call_has_a_worker_or_without_the_hosts():
    for tools in (ToolPool(2.0, is_saturated=False), None):
        triage = WorkflowTriage()
        for name, work in (("a", 30.0), ("b", 30.0)):
            assert not triage.assess(request(name, 10.0, work), now=0.0, backlogged=False, tools=tools)


def test_a_workflow_past_its_deadline_is_shed_while_calls_wait_though_no_stage_waits_for_a_node():
    triage = WorkflowTriage()
    assert not triage.assess(request("late", 5.0, 0.0), now=6.0, backlogged=False)
    triage = WorkflowTriage()
    assert triage.assess(request("late", 5.0, 0.0), now=6.0, backlogged=False, tools=WAITING)


def test_an_ended_or_shed_workflow_leaves_the_tool_pool():
    triage = WorkflowTriage()
    triage.assess(request("a", 20.0, 10.0), now=0.0, backlogged=False, tools=WAITING)
    triage.end("a")
    assert triage.tool_open == {}


def test_the_history_keeps_the_tools_cpu_work_apart_from_their_wall_time():
    history = RemainingWork(min_count=1)
    history.observe("w", "app", 1.0)
    history.observe_tool("w", 5.0, 2.0)  # 3 s waiting for a worker, 2 s running
    history.observe("w", "app", 1.0)
    history.end("w")
    assert history.tool_ahead_s("app", 0) == 5.0
    assert history.tool_ahead_s("app", 0, work=True) == 2.0
    history.observe("v", "other", 1.0)
    history.observe_tool("v", 4.0)  # a caller that sees only the wall: all of it counts as work
    history.end("v")
    assert history.tool_ahead_s("other", 0, work=True) == 4.0
    with pytest.raises(ValueError, match="work_s <= tool_s"):
        history.observe_tool("v", 1.0, 2.0)


def test_the_simulated_hosts_read_saturated_once_a_call_waits_for_a_worker():
    hosts = [HostCPU("workers", 2), HostCPU("workers", 2)]
    for job in range(2):
        hosts[0].submit(job, 10.0, 0.0)
    assert tool_pool(hosts) == ToolPool(4.0, is_saturated=False)
    hosts[0].submit(2, 10.0, 0.0)
    assert tool_pool(hosts) == ToolPool(4.0, is_saturated=True)


def test_the_gateways_callers_read_saturated_with_more_sessions_in_a_tool_call_than_workers():
    sessions = Sessions(tool_workers=1)
    for key in ("a", "b"):
        sessions.arrive(key, 0.0)
    assert sessions.tool_pool() == ToolPool(1.0, is_saturated=False)
    for key in ("a", "b"):
        sessions.sessions[key].tool_since_s = 1.0
    assert sessions.tool_pool() == ToolPool(1.0, is_saturated=True)


def tool_bound(num: int) -> list:
    """`num` workflows a second apart, each a short call, a 4 s tool on the host, then a short answer (SLO 12 s)."""
    workflows = []
    for k in range(num):
        w = SimWorkflow(f"w{k}", "app", False, 12.0, arrival_s=float(k))
        for i, (parents, tool_s) in enumerate((([], 4.0), ([0], 0.0))):
            stage = SimStage(w, i, f"s{i}", "r", "llama-3-8b", parents, 20, tool_s > 0, tool_exec_s=tool_s)
            stage.prompt_tokens = 200
            w.stages.append(stage)
        w.stages[0].children.append(1)
        workflows.append(w)
    reset(workflows)
    return workflows


def test_the_simulated_fleet_triages_a_tool_overload_its_gpus_never_see():
    # one node, one tool worker, a 4 s tool a second: the GPU has room, the worker is 4× over
    history = RemainingWork(min_count=1)
    history.observe("past", "app", 0.1)
    history.observe_tool("past", 4.0)
    history.observe("past", "app", 0.1)
    history.end("past")
    cluster = ClusterConfig(num_nodes=1, num_tool_workers=1, show_progress=False)
    met = {}
    for name in ("edf", "maestro"):
        workflows = tool_bound(30)
        sim = Simulator(cluster, get_system(name), workflows, remaining_work=copy.deepcopy(history))
        sim.run()
        met[name] = sum(0 <= w.done_s - w.arrival_s <= w.slo_s for w in workflows if not w.is_dropped)
        turned_away = sim.recorder.rejected
    assert turned_away > 0
    assert met["maestro"] >= 2 * met["edf"]  # 9 against 3: of equal tool work, the newest goes, not the one served
