"""A model whose stages wait gets another node, loaded where S(N,T) finds the load shorter than the queue (Maestro's
router); the least-loaded router keeps every stage on the nodes already running the model."""

from serving.core.systems import get_system
from serving.sim.engine import ClusterConfig, Simulator
from serving.sim.workload import SimStage, SimWorkflow, reset


def burst(num: int) -> list[SimWorkflow]:
    """`num` one-stage workflows of llama-3-8b arriving at once, each decoding 2,000 tokens (SLO 600 s)."""
    workflows = []
    for k in range(num):
        w = SimWorkflow(f"w{k}", "app", False, 600.0, arrival_s=0.0)
        w.stages.append(SimStage(w, 0, "s0", "r", "llama-3-8b", [], 2000, False, prompt_tokens=500))
        workflows.append(w)
    reset(workflows)
    return workflows


def run(system: str) -> Simulator:
    # node 0 runs llama-3-8b, node 1 an idle mistral-7b; a batch holds 4 stages, so 40 stages queue on node 0
    cluster = ClusterConfig(
        num_nodes=2, max_batch_seqs=4, placement=[("llama-3-8b",), ("mistral-7b",)], show_progress=False
    )
    sim = Simulator(cluster, get_system(system), burst(40))
    sim.run()
    return sim


def test_a_waiting_model_is_loaded_on_an_idle_node_by_s_n_t_and_not_by_least_loaded():
    maestro, edf = run("maestro"), run("edf")
    assert maestro.nodes[1].residency.num_loads >= 1  # llama-3-8b loaded beside (or instead of) the idle mistral
    assert edf.nodes[1].residency.num_loads == 0
    assert all(w.done_s >= 0 for w in maestro.workflows)
    done = {name: max(w.done_s for w in sim.workflows) for name, sim in (("maestro", maestro), ("edf", edf))}
    assert done["maestro"] < done["edf"]  # two nodes drain the burst sooner than one
