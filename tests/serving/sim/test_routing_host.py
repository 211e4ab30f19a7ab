"""The simulator's router sees the tool work waiting on a node's host CPU (a routed session's tool calls run there)."""

import pytest

from serving.core.dispatch import choose
from serving.core.routing import GpuDelayFit, GpuDelayFits, HostWaitFit
from serving.core.systems import get_system
from serving.sim.engine import Simulator
from serving.sim.hostcpu import HostCPU
from serving.sim.runner import RunConfig, build_workload
from serving.sim.scenarios import get_scenario
from serving.sim.stage_request import ready_request


def _two_nodes(gpu_queued_s: float = 50.0):
    """Two mars-swe nodes: 30 s of tool calls queued on the first node's host (the calls of the sessions living
    there), `gpu_queued_s` of GPU work queued on the second; a ready stage and the nodes' slots."""
    scenario = get_scenario("mars-swe", 2)
    scenario.cluster.show_progress = False
    workflows = build_workload(scenario, RunConfig(policies=("maestro",), num_workflows=2), scenario.regimes[0])
    sim = Simulator(scenario.cluster, get_system("maestro"), workflows)
    busy_host, busy_gpu = sim.nodes
    for job in range(3 * busy_host.host.num_cores):
        busy_host.host.submit(job, 10.0, 0.0)
    busy_gpu.queued_work_s = gpu_queued_s
    request = ready_request(workflows[1].stages[0], 0.0, sim.cost, sim.remaining_work)
    return sim, request, [sim.dispatch.slots[n] for n in sim.nodes]


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
    sim, request, slots = _two_nodes(gpu_queued_s=0.0)
    terms = [slot.fitness_terms(request) for slot in slots]
    assert terms[0][1] == pytest.approx(terms[1][1] + 30.0)
    assert choose(request, slots, sim.dispatch.config) is slots[1]


def test_a_host_wait_the_routed_stages_calls_did_not_meet_is_not_charged():
    sim, request, slots = _two_nodes()
    app = request.payload.workflow.app
    assert choose(request, slots, sim.dispatch.config) is slots[1]  # no scores yet: the wait is charged in full
    for shown_s in (0.0, 2.0, 4.0, 8.0, 16.0, 30.0) * 20:  # what the calls met did not follow what was shown
        sim.dispatch.host_fits.observe(app, shown_s, 0.5)
    assert sim.dispatch.host_fits.share(app) == pytest.approx(0.0, abs=0.05)
    assert choose(request, slots, sim.dispatch.config) is slots[0]
    assert sim.dispatch.host_fits.share("another app") == 1.0  # each app's own stages decide for it


def test_a_host_wait_the_calls_met_is_charged_in_full():
    sim, request, slots = _two_nodes()
    app = request.payload.workflow.app
    for shown_s in (0.0, 2.0, 4.0, 8.0, 16.0, 30.0) * 20:
        sim.dispatch.host_fits.observe(app, shown_s, shown_s + 1.0)  # a persistent queue: met as shown
    assert sim.dispatch.host_fits.share(app) == 1.0
    assert choose(request, slots, sim.dispatch.config) is slots[1]


def test_the_fit_is_one_until_the_scores_show_the_wait_is_not_met():
    fit = HostWaitFit()
    assert fit.share() == 1.0
    fit.observe(5.0, 0.0)
    fit.observe(1.0, 0.0)
    assert fit.share() == 1.0  # two scores
    for _ in range(3):
        fit.observe(3.0, 3.0)  # five scores, too few and too scattered to say
    assert fit.share() == 1.0
    with pytest.raises(ValueError, match="waits must be >= 0"):
        fit.observe(-1.0, 0.0)


def test_a_routed_stage_is_scored_with_the_wait_its_call_met_on_the_host():
    host = HostCPU("workers", 1)
    fits = host.fits
    host.submit("running", 4.0, 0.0)
    host.routed("stage", "app", 0.0)  # shown: 4 s
    host.routed("other", "app", 0.0)
    host.ended_without_call("other")  # no call: never scored
    host.submit("stage", 1.0, 1.0)  # handed over at 1 s, starts at 4 s
    host.pop_done(4.0)
    fit = fits.by_app["app"]
    assert (fit.num_scored, fit.shown_s, fit.met_s) == (1, pytest.approx(4.0), pytest.approx(3.0))
    assert not host.shown


def test_gpu_work_that_routed_stages_met_many_times_over_outweighs_a_host_wait():
    sim, request, slots = _two_nodes()  # 30 s of tool calls on the first host, 50 s of GPU work on the second
    app = request.payload.workflow.app
    assert choose(request, slots, sim.dispatch.config) is slots[1]  # no scores: the GPU part as computed, 50/256 s
    for shown_s in (0.0, 0.1, 0.2, 0.4, 0.8) * 10:  # each second of work shown cost a stage routed there 200 s
        sim.dispatch.gpu_fits.observe(app, shown_s, 200.0 * shown_s + 1.0)
    assert sim.dispatch.gpu_fits.scale(app) == pytest.approx(200.0)
    assert choose(request, slots, sim.dispatch.config) is slots[0]
    assert sim.dispatch.gpu_fits.scale("another app") == 1.0


def test_a_routed_stage_is_scored_when_its_llm_call_ends_by_the_delay_beyond_its_idle_service():
    fits = GpuDelayFits()
    for i, shown_s in enumerate((0.0, 1.0, 2.0, 3.0)):
        stage = f"stage {i}"
        fits.routed(stage, "app", shown_s, now=10.0)
        fits.ended(stage, now=10.0 + 5.0 + 3.0 * shown_s, idle_service_s=5.0)  # met 3 s a second shown
    fits.routed("never ends", "app", 100.0, now=0.0)
    fits.ended("never routed", now=50.0, idle_service_s=1.0)
    assert fits.by_app["app"].num_scored == 4
    assert fits.scale("app") == pytest.approx(3.0)


def test_the_gpu_scale_is_one_until_the_scores_say_and_never_below_zero():
    fit = GpuDelayFit()
    fit.observe(1.0, 5.0)
    fit.observe(2.0, 9.0)
    assert fit.scale() == 1.0  # two scores
    for shown_s in (1.0, 2.0, 3.0, 4.0):
        fit.observe(shown_s, 10.0 - shown_s)  # a busier node met less: no reason to charge its work less than 0
    assert fit.scale() == 0.0
