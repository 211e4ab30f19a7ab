"""Triage's capacity where models move between nodes or share one: each node at its own measured rate."""

import math

from serving.core.residency import ModelNodes
from serving.core.scheduler.triage import TriageConfig, WorkflowTriage
from tests.serving.core.test_triage import filled, request


def on(*names: str) -> ModelNodes:
    return ModelNodes(frozenset(names), frozenset())


def window(triage: WorkflowTriage, model: str, node: str, rate: float, start_s: float, is_node_backlogged=True):
    """One saturated 10 s window of `model` on `node` at `rate` unloaded seconds a second (after one more)."""
    filled(triage, model, start_s, node=node, is_node_backlogged=is_node_backlogged)
    triage.served(model, 0.0, start_s, True, node=node, is_node_backlogged=is_node_backlogged)
    triage.served(model, rate * 10.0, start_s + 10.0, True, node=node, is_node_backlogged=is_node_backlogged)


def crowded(triage: WorkflowTriage, nodes: ModelNodes) -> int:
    """Two workflows of 8 s of work due in 10 s (at t = 10): 16 s of work, feasible at 3 s/s, not at 1; how many of
    them are shed."""
    for w in ("x", "y"):
        triage.assess(request(w, 20.0, 8.0), 10.0, backlogged=True, nodes=nodes)
    return len(triage.shed & {"x", "y"})


def test_a_pool_on_more_nodes_than_it_was_measured_on_reads_each_nodes_rate():
    triage = WorkflowTriage(TriageConfig(window_s=10.0))
    triage.assess(request("w", 1000.0, 1.0), 0.0, backlogged=False, nodes=on("a"))
    window(triage, "m", "a", 1.0, 0.0)  # measured on node a alone: 1 s/s
    window(triage, "k", "b", 3.0, 0.0)  # node b serves another model at 3 s/s
    pool = triage.pools["m"]
    assert math.isclose(triage.capacity_s(pool), 1.0)
    # the model now runs on a and b: what it can get there is a's rate and b's, not the one node it was read on
    assert crowded(triage, on("a", "b")) == 0
    assert math.isclose(triage.capacity_s(pool), 4.0)


def test_a_pool_that_shares_its_node_reads_the_node_not_its_share():
    triage = WorkflowTriage(TriageConfig(window_s=10.0))
    triage.assess(request("w", 1000.0, 1.0), 0.0, backlogged=False, nodes=on("a"))
    filled(triage, "m", 0.0, node="a", is_node_backlogged=True)
    triage.served("m", 0.0, 0.0, True, node="a", is_node_backlogged=True)
    triage.served("k", 25.0, 5.0, True, node="a", is_node_backlogged=True)  # the other model's work on node a
    triage.served("m", 5.0, 10.0, True, node="a", is_node_backlogged=True)
    triage.served("k", 0.0, 10.0, True, node="a", is_node_backlogged=True)
    assert math.isclose(triage.pools["m"].capacity, 0.5)  # its share of the node
    assert crowded(triage, on("a")) == 0
    assert math.isclose(triage.capacity_s(triage.pools["m"]), 3.0)  # the node's: 30 s of work in 10 s


def test_a_pool_alone_on_the_nodes_it_was_measured_on_keeps_its_own_figure():
    # one model on its nodes (every single-model fleet): the pool's own windows measured exactly those nodes
    triage = WorkflowTriage(TriageConfig(window_s=10.0))
    triage.assess(request("w", 1000.0, 1.0), 0.0, backlogged=False, nodes=on("a"))
    window(triage, "m", "a", 1.0, 0.0, is_node_backlogged=False)
    window(triage, "k", "b", 5.0, 0.0)  # another node's rate says nothing of this pool's
    assert crowded(triage, on("a")) == 1  # at 1 s/s one of the two goes
    assert math.isclose(triage.capacity_s(triage.pools["m"]), 1.0)


def test_without_the_nodes_the_pool_keeps_its_own_figure():
    triage = WorkflowTriage(TriageConfig(window_s=10.0))
    window(triage, "m", "a", 1.0, 0.0)
    window(triage, "k", "b", 3.0, 0.0)
    assert math.isclose(triage.capacity_s(triage.pools["m"]), 1.0)
    assert triage.node_pools["b"].capacity == 3.0
