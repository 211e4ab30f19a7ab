"""With S(N,T) a stage goes to a spare node, loading its model there, where it is predicted to end sooner than on the
nodes already running the model (Maestro's router), judged at the long end of its predicted length: a stage that may run
long is worth the load, a short one is not, and a node whose
idle model has a session in a tool call is no spare. The least-loaded router keeps every stage on the nodes already
running the model."""

from maestro.prediction import OutputSize
from serving.core.systems import get_system
from serving.sim.engine import ClusterConfig, Simulator
from serving.sim.workload import SimStage, SimWorkflow, reset


def burst(num, tokens, predicted, reserve=None, every=0.0, prompt=500) -> list[SimWorkflow]:
    """`num` one-stage workflows of llama-3-8b arriving `every` seconds apart (at once by default), each a `prompt`
    and decoding `tokens`, predicted `predicted` (its reserve, the prediction's upper bound: `reserve`, else the
    point)."""
    workflows = []
    for k in range(num):
        w = SimWorkflow(f"w{k}", "app", False, 600.0, arrival_s=k * every)
        stage = SimStage(w, 0, "s0", "r", "llama-3-8b", [], tokens, False, prompt_tokens=prompt)
        stage.size = OutputSize(tokens_pred=predicted, tokens_reserve=reserve or predicted)
        w.stages.append(stage)
        workflows.append(w)
    reset(workflows)
    return workflows


def run(system: str, tokens=2000, predicted=2000, before=None, batch=4, **arrivals) -> Simulator:
    # node 0 runs llama-3-8b, node 1 an idle mistral-7b; a batch holds 4 stages, so 36 of 40 stages queue on node 0
    cluster = ClusterConfig(
        num_nodes=2, max_batch_seqs=batch, placement=[("llama-3-8b",), ("mistral-7b",)], show_progress=False
    )
    sim = Simulator(cluster, get_system(system), burst(40, tokens, predicted, **arrivals))
    if before is not None:
        before(sim)
    sim.run()
    return sim


def test_a_long_stage_loads_its_model_on_a_spare_node_by_s_n_t_and_not_by_least_loaded():
    maestro, edf = run("maestro"), run("edf")
    assert maestro.nodes[1].residency.num_loads >= 1  # llama-3-8b loaded in the place of the idle mistral
    assert edf.nodes[1].residency.num_loads == 0
    assert all(w.done_s >= 0 for w in maestro.workflows)
    done = {name: max(w.done_s for w in sim.workflows) for name, sim in (("maestro", maestro), ("edf", edf))}
    assert done["maestro"] < done["edf"]  # two nodes drain the burst sooner than one


def test_a_stage_predicted_short_stays_where_its_model_runs():
    """The same burst predicted at 5 tokens a stage: no stage is predicted to end sooner after a load."""
    assert run("maestro", predicted=5).nodes[1].residency.num_loads == 0


def test_a_stage_predicted_short_that_may_run_long_loads_its_model():
    """A batch wide enough for the whole burst, arriving over 20 s, so nothing queues and only the pace the wide batch
    shows tells the nodes apart; each stage predicted at 5 tokens, its upper bound 2,000. Judged at the bound (a stage
    that runs long on the wide batch costs more than a load wasted on one that runs short), the model is loaded on
    the spare node and the burst ends sooner; judged at the point (bound = point) it is not."""
    at_bound, at_point = (
        run("maestro", predicted=5, reserve=reserve, batch=64, every=0.5, prompt=4000) for reserve in (2000, 5)
    )
    assert at_bound.nodes[1].residency.num_loads >= 1 and at_point.nodes[1].residency.num_loads == 0
    assert max(w.done_s for w in at_bound.workflows) < max(w.done_s for w in at_point.workflows)


def test_a_node_whose_idle_model_has_a_session_in_a_tool_call_is_no_spare():
    """A tool call of mistral's session under way on node 1's host: its next stage comes back to mistral there."""

    class Call:
        model = "mistral-7b"

    def calling(sim):
        sim.nodes[1].host.submit(Call(), 1e6, 0.0)

    sim = run("maestro", before=calling)
    assert sim.nodes[1].models_in_use() == {"mistral-7b"}
    assert sim.nodes[1].residency.num_loads == 0


def test_a_node_loading_a_model_shows_the_load_left_in_its_ready_time():
    """A node that loads a model starts nothing until the weights are in: the router sees that wait, so stages do not
    flock to a node that only looks idle."""
    from serving.sim.stage_request import ready_request

    cluster = ClusterConfig(num_nodes=2, placement=[("llama-3-8b",), ("mistral-7b",)], show_progress=False)
    sim = Simulator(cluster, get_system("maestro"), burst(1, 100, 100))
    stage = sim.workflows[0].stages[0]
    stage.request = ready_request(stage, 0.0, sim.cost, sim.remaining_work)
    slot = sim.dispatch.slots[sim.nodes[1]]
    idle = slot.fitness_terms(stage.request)[1]
    sim.nodes[1].stall(0.0, 12.0)  # a load under way, 12 s left
    assert slot.fitness_terms(stage.request)[1] == idle + 12.0
