"""A load that puts to sleep a model that runs on no other node costs that model's next stage a reload: the router's
ready time on such a node counts it (`SimSlot.displacement_s`), and a session whose model was put to sleep on its
node does not go home for a context the sleeping model no longer holds (`sessions.session_home`). A router that scales
out puts such a copy to sleep neither for a replica while the model is wanted (`SimSlot.displaces_in_demand`) nor for
a cold model where a replica can make room (`slot.cold_slot`)."""

import pytest

from maestro.prediction import OutputSize
from serving.core.residency import ModelState
from serving.core.systems import get_system
from serving.sim.engine import ClusterConfig, Simulator
from serving.sim.sessions import session_home
from serving.sim.stage_request import ready_request
from serving.sim.workload import SimStage, SimWorkflow, reset

MISTRAL, QWEN = "mistral-7b", "qwen2-7b"


def one_stage(model: str, name="w", app="app", arrival_s=0.0, tokens=50, prompt=500, slo_s=600.0) -> SimWorkflow:
    """A one-stage workflow of `model` decoding `tokens`, predicted exactly."""
    w = SimWorkflow(name, app, False, slo_s, arrival_s=arrival_s)
    stage = SimStage(w, 0, "s0", "r", model, [], tokens, False, prompt_tokens=prompt)
    stage.size = OutputSize(tokens_pred=tokens, tokens_reserve=tokens)
    w.stages.append(stage)
    reset([w])
    return w


def cluster(placement) -> Simulator:
    config = ClusterConfig(num_nodes=len(placement), placement=placement, show_progress=False)
    return Simulator(config, get_system("maestro"), [one_stage("llama-3-8b")])


def ready_time(sim: Simulator, node: int, model: str) -> float:
    stage = one_stage(model).stages[0]
    stage.request = ready_request(stage, 0.0, sim.cost, sim.remaining_work)
    return sim.dispatch.slots[sim.nodes[node]].fitness_terms(stage.request)[1]


def test_a_load_that_puts_to_sleep_the_only_copy_of_a_model_shows_its_reload_in_the_ready_time():
    """A 72B model needs the whole weight budget: loading it on node 0 puts mistral to sleep. Where mistral runs on no
    other node, its next stage will reload it from the CPU tier, and node 0's ready time says so; where node 1 runs
    mistral too, it costs nothing."""
    alone = cluster([("mistral-7b",), ("llama-3-8b",)])
    shared = cluster([("mistral-7b",), ("mistral-7b",)])
    node0 = alone.nodes[0].residency
    assert node0.displaced_by("qwen2-72b") == [MISTRAL]
    reload_s = node0.ready_cost_s(MISTRAL, ModelState.CPU)
    assert ready_time(alone, 0, "qwen2-72b") - ready_time(shared, 0, "qwen2-72b") == pytest.approx(reload_s)
    assert reload_s > 5.0  # the CPU tier: weights over PCIe and the warm-up


def test_a_session_does_not_go_home_for_a_context_its_sleeping_model_no_longer_holds():
    """The session's first stage ran on node 0 and its context sits in the node's prefix cache; once its model is put
    to sleep there, its next stage is routed like any other: node 0, with a stage queued, could not start it at once."""
    sim = cluster([(QWEN,), (QWEN,)])
    w = SimWorkflow("s", "app", False, 600.0, arrival_s=0.0)
    first = SimStage(w, 0, "s0", "r", QWEN, [1], 50, False, prompt_tokens=500)
    second = SimStage(w, 1, "s1", "r", QWEN, [], 50, False, prompt_tokens=700, session_parent=0)
    w.stages += [first, second]
    reset([w])
    for stage in (first, second):
        stage.size = OutputSize(tokens_pred=50, tokens_reserve=50)
    node = sim.nodes[0]
    first.node = node
    node.cache.put(first, 4)
    second.request = ready_request(second, 0.0, sim.cost, sim.remaining_work)
    assert session_home(second, sim.dispatch.slots) is node  # held: its model runs there
    queued = sim.workflows[0].stages[0]
    node.core.add(ready_request(queued, 0.0, sim.cost, sim.remaining_work), 0.0)
    assert session_home(second, sim.dispatch.slots) is node  # still held, though node 0 has a queue now
    node.residency.activate("qwen2-72b")  # QWEN put to sleep, its KV cache with it
    assert not node.residency.runs(QWEN)
    assert session_home(second, sim.dispatch.slots) is None


def test_a_cold_model_puts_a_replica_to_sleep_before_a_models_only_copy():
    """qwen2-72b runs nowhere and needs a whole node. Node 0 runs mistral, its only copy, and could start the stage
    now; nodes 1 and 2 run llama-3-8b (two copies) with a stage queued each. The router that scales out loads the 72B
    in the place of a llama copy (the stage waits for it there), not of mistral, whose next stage would reload it."""
    sim = cluster([(MISTRAL,), ("llama-3-8b",), ("llama-3-8b",)])
    for node in sim.nodes[1:]:
        queued = one_stage("llama-3-8b").stages[0]
        node.core.add(ready_request(queued, 0.0, sim.cost, sim.remaining_work), 0.0)
    stage = one_stage("qwen2-72b").stages[0]
    stage.request = ready_request(stage, 0.0, sim.cost, sim.remaining_work)
    assert sim.dispatch.slots[sim.nodes[0]].can_start_now(stage.request)
    assert sim.dispatch.route(stage) in sim.nodes[1:]


def burst_beside(burst_s: float, small_s: list[float]) -> list[SimWorkflow]:
    """40 long qwen2-72b stages arriving at `burst_s`, and a one-stage mistral workflow at each of `small_s`."""
    big = [one_stage("qwen2-72b", f"big{k}", "big", burst_s, tokens=2000, slo_s=6000.0) for k in range(40)]
    small = [one_stage(MISTRAL, f"small{k}", "small", t, tokens=20, prompt=300) for k, t in enumerate(small_s)]
    return big + small


@pytest.mark.parametrize(
    "burst_s, small_s, is_replicated",
    [(10.0, [2.0 * k for k in range(750)], False), (600.0, [0.0], True)],
    ids=["mistral-every-2s", "mistral-idle-600s"],
)
def test_a_replica_does_not_put_to_sleep_a_model_wanted_while_it_would_hold_the_node(burst_s, small_s, is_replicated):
    """Node 0 runs the 72B, and a burst of 40 long stages comes for it (a batch holds 4); node 1 runs mistral, its only
    copy. Where a mistral stage came 2 s before (and keeps coming), a 72B replica on node 1 would hold the node through
    many of them: no scale-out. Where mistral has been idle for 600 s, longer than a replica's stage would hold the
    node, the 72B is loaded on node 1."""
    config = ClusterConfig(num_nodes=2, max_batch_seqs=4, placement=[("qwen2-72b",), (MISTRAL,)], show_progress=False)
    sim = Simulator(config, get_system("maestro"), burst_beside(burst_s, small_s))
    sim.run()
    assert (sim.nodes[1].residency.num_loads > 0) is is_replicated
    assert all(w.done_s >= 0 for w in sim.workflows)
