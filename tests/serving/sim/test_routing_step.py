"""The simulator's router prices a node by the stage's own predicted decode at the node's step price now."""

import pytest

from serving.core.dispatch import choose
from serving.core.systems import get_system
from serving.sim.engine import Simulator
from serving.sim.runner import RunConfig, build_workload
from serving.sim.scenarios import get_scenario
from serving.sim.stage_request import ready_request


def _nodes_running(contexts: tuple[int, int]):
    """Two mars-swe nodes, each running one stage of the given context (tokens); a ready stage and the slots."""
    scenario = get_scenario("mars-swe", 2)
    scenario.cluster.show_progress = False
    workflows = build_workload(scenario, RunConfig(policies=("maestro",), num_workflows=3), scenario.regimes[0])
    sim = Simulator(scenario.cluster, get_system("maestro"), workflows)
    for node, workflow, context in zip(sim.nodes, workflows[1:], contexts):
        node.add_running(workflow.stages[0], context)
    request = ready_request(workflows[0].stages[0], 0.0, sim.cost, sim.remaining_work)
    return sim, request, [sim.dispatch.slots[n] for n in sim.nodes]


def test_a_stage_goes_to_the_node_whose_steps_are_cheaper_at_an_equal_count_of_running_stages():
    sim, request, slots = _nodes_running((40_000, 1_000))
    slow, fast = sim.nodes
    assert slow.step_s() > fast.step_s()
    terms = [slot.fitness_terms(request) for slot in slots]
    assert terms[0][0] == terms[1][0] and terms[0][2] == terms[1][2]  # the same free KV, no queue on either
    tokens_pred = request.payload.tokens_pred
    assert tokens_pred > 0
    assert terms[0][1] - terms[1][1] == pytest.approx(tokens_pred * (slow.step_s() - fast.step_s()))
    assert choose(request, slots, sim.dispatch.config) is slots[1]


def test_equal_nodes_tie_whatever_the_prediction():
    sim, request, slots = _nodes_running((1_000, 1_000))
    terms = [slot.fitness_terms(request) for slot in slots]
    assert terms[0] == terms[1]
    assert choose(request, slots, sim.dispatch.config) is slots[0]  # a tie goes to the first of the lowest ready
