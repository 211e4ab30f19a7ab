"""The simulator's router sees the tool work waiting on a node's host CPU (a routed session's tool calls run there)."""

import pytest

from serving.core.dispatch import choose
from serving.core.systems import get_system
from serving.sim.engine import Simulator
from serving.sim.hostcpu import HostCPU
from serving.sim.runner import RunConfig, build_workload
from serving.sim.scenarios import get_scenario
from serving.sim.stage_request import ready_request


def test_a_call_waits_for_the_first_core_free_after_the_calls_queued_ahead():
    host = HostCPU("workers", 2)
    host.submit("a", 4.0, 0.0)
    assert host.wait_s(0.0) == 0.0  # a core is free
    for job, work_s in (("b", 2.0), ("c", 6.0)):
        host.submit(job, work_s, 0.0)
    assert host.wait_s(0.0) == pytest.approx(4.0)  # c takes b's core at 2; a's frees at 4
    assert host.wait_s(1.0) == pytest.approx(3.0)
    assert HostCPU("time-sliced", 1).wait_s(5.0) == 0.0


def test_a_stage_goes_to_the_node_whose_host_is_not_busy_with_tools():
    scenario = get_scenario("mars-swe", 2)
    scenario.cluster.show_progress = False
    workflows = build_workload(scenario, RunConfig(policies=("maestro",), num_workflows=2), scenario.regimes[0])
    sim = Simulator(scenario.cluster, get_system("maestro"), workflows)
    busy_host, free_host = sim.nodes
    for job in range(3 * busy_host.host.num_cores):  # tool calls of the sessions living there
        busy_host.host.submit(job, 10.0, 0.0)
    request = ready_request(workflows[1].stages[0], 0.0, sim.cost, sim.remaining_work)
    slots = [sim.dispatch.slots[n] for n in sim.nodes]
    terms = [slot.fitness_terms(request) for slot in slots]
    assert terms[0][1] == pytest.approx(terms[1][1] + 30.0)
    assert choose(request, slots, sim.dispatch.config) is slots[1]
