"""Model residency transitions with hierarchical LRU, and node selection by S(N,T)."""

import numpy as np
import pytest

from serving.core.residency import GiB, ModelNodes, ModelState, NodeResidency, ResidencyConfig
from serving.core.routing import FitnessConfig, robust_minmax, select_node


def node(gpu_gib=40, cpu_gib=40, disk_gib=100):
    r = NodeResidency(
        ResidencyConfig(
            gpu_weight_budget_bytes=gpu_gib * GiB, cpu_budget_bytes=cpu_gib * GiB, disk_budget_bytes=disk_gib * GiB
        ),
        {"a": 16 * GiB, "b": 16 * GiB, "c": 30 * GiB},
    )
    for m in "abc":
        r.place(m, ModelState.DISK)
    return r


def test_costs_fall_as_the_model_moves_up_the_hierarchy():
    r = node()
    costs = {}
    for state in (ModelState.REMOTE, ModelState.DISK, ModelState.CPU, ModelState.SLEEPING):
        r.place("a", state)
        costs[state] = r.ready_cost_s("a")
    r.place("a", ModelState.RUNNING)
    assert r.ready_cost_s("a") == 0.0
    assert costs[ModelState.REMOTE] > costs[ModelState.DISK] > costs[ModelState.CPU] > costs[ModelState.SLEEPING] > 0
    assert costs[ModelState.CPU] - costs[ModelState.SLEEPING] == pytest.approx(6.5)  # warm-up Sleeping saves


def test_activation_demotes_least_recently_used_first():
    r = node()
    r.activate("a")
    r.activate("b")
    r.touch("a")  # b is now the least recently used
    assert r.activate("c") is not None
    assert r.state["c"] is ModelState.RUNNING
    assert r.state["b"] > ModelState.RUNNING and r.state["a"] > ModelState.RUNNING


def test_busy_models_are_never_evicted():
    r = node()
    r.activate("a")
    r.activate("b")
    assert r.activate("c", busy_models={"a"}) is None
    assert r.state["a"] is ModelState.RUNNING and r.state["c"] is ModelState.DISK


def test_cpu_tier_spills_to_disk():
    r = node(gpu_gib=31, cpu_gib=16)
    r.activate("a")
    r.activate("b")  # a → Sleeping (16 GiB on CPU)
    r.activate("c", busy_models=set())  # needs the whole GPU: b sleeps, CPU over budget → LRU to disk
    assert r.tier_bytes(ModelState.CPU) <= 16 * GiB
    assert ModelState.DISK in (r.state["a"], r.state["b"])


def test_robust_minmax_clips_outliers():
    values = np.r_[np.arange(20.0), 1000.0]
    scaled = robust_minmax(values)
    assert scaled.min() == 0 and scaled.max() == 1 and scaled[15] > 0.5  # the outlier does not squash the rest
    assert not robust_minmax(np.ones(4)).any()


def test_select_node_trades_availability_against_readiness_and_degradation():
    config = FitnessConfig()
    assert select_node([0.9, 0.5, 0.5], [0, 0, 0], [0, 0, 0], config) == 0
    assert select_node([0.9, 0.8, 0.1], [30, 0, 0], [0, 0, 0], config) == 1  # cold model costs more than free KV gains
    assert select_node([0.5, 0.5, 0.5], [0, 0, 0], [1, 0, 1], config) == 1


def test_a_sliver_more_free_kv_does_not_outweigh_seconds_of_ready_time():
    # node 0: 3 % more free KV, a second more work ahead, 2 % less of a shortfall
    terms = [0.53, 0.50], [2.0, 1.0], [0.0, 0.02]
    assert select_node(*terms, FitnessConfig()) == 1  # the shares count as shares
    assert select_node(*terms, FitnessConfig(share_span=0.0)) == 0  # the seed's min-max: each sliver is a whole unit
    with pytest.raises(ValueError, match="share_span"):
        FitnessConfig(share_span=-1.0)


class _Node:
    def __init__(self, name: str, running: str | None, busy: set[str]):
        self.name, self.residency, self.busy = name, node(), busy
        if running is not None:
            self.residency.activate(running)

    def busy_models(self) -> set[str]:
        return self.busy


def test_the_router_loads_a_model_where_it_runs_else_where_the_weight_budget_takes_it():
    fleet = [_Node("n0", "a", {"a"}), _Node("n1", "c", {"c"}), _Node("n2", "c", set()), _Node("n3", None, set())]
    nodes = ModelNodes.of("a", fleet)
    assert nodes.running == {"n0"} and nodes.names == {"n0"}
    assert nodes.loadable == {"n2", "n3"}  # n1's busy 30 GiB model leaves no room for 16 GiB; n2's is idle
    cold = ModelNodes.of("b", fleet)  # runs nowhere: wherever it fits beside the busy models
    assert cold.running == frozenset() and cold.names == {"n0", "n2", "n3"}


def test_displaced_by_names_what_a_load_would_put_to_sleep_and_changes_nothing():
    r = node()
    r.activate("a")
    r.activate("b")
    r.touch("a")  # b is the least recently used
    before = dict(r.state)
    assert r.displaced_by("c") == ["b", "a"]  # 30 GiB needs both 16 GiB models gone
    assert r.displaced_by("c", busy_models={"a"}) == []  # a is busy: c cannot be activated at all
    assert r.displaced_by("a") == []  # runs already
    assert r.state == before and r.num_loads == 2
    r.activate("c")
    assert {m for m, s in r.state.items() if s is ModelState.RUNNING} == {"c"}
