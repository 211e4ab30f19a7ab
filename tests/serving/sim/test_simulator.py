"""The simulator end to end at small scale: every policy runs, work is conserved, outputs are written."""

import json

import pytest

from serving.core.dispatch import choose
from serving.core.systems import SYSTEMS, get_system
from serving.core.tool_kv import ToolKVPolicy
from serving.sim.costmodel import MODEL_PROFILES, CostModel, CostModelConfig
from serving.sim.engine import Simulator
from serving.sim.predictions import PredictionConfig
from serving.sim.runner import RunConfig, build_workload, run_scenario, write_outputs
from serving.sim.scenarios import get_scenario
from serving.sim.slo import unloaded_latency_s
from serving.sim.stage_request import ready_request
from serving.sim.workload import reset


def small(name, nodes=2):
    scenario = get_scenario(name, nodes)
    scenario.cluster.show_progress = False
    return scenario


def test_cost_model_orders_of_magnitude():
    cost = CostModel(CostModelConfig(gpu="a100-80gb"))
    llama = MODEL_PROFILES["llama-3-8b"]
    assert 0.005 < cost.step_s(cost.weight_read_s(llama), 0) < 0.03  # ~10-20 ms/token for 8B on A100
    assert 0.05 < cost.prefill_s(llama, 2000) < 0.5
    h200 = CostModel(CostModelConfig(gpu="h200"))
    assert h200.prefill_s(llama, 2000) < cost.prefill_s(llama, 2000)
    with pytest.raises(ValueError, match="known"):
        CostModelConfig(gpu="tpu-v5")


@pytest.mark.parametrize("policy", sorted(SYSTEMS))
def test_every_policy_completes_a_small_workload(policy):
    scenario = small("maestro-paper")
    workflows = build_workload(
        scenario, RunConfig(policies=(policy,), num_workflows=60, rate_per_s=2.0), scenario.regimes[0]
    )
    sim = Simulator(scenario.cluster, get_system(policy), workflows)
    summary = sim.run().summary
    finished = sum(w.done_s >= 0 for w in workflows) + sum(w.is_dropped for w in workflows)
    assert finished == len(workflows)
    met = [w for w in workflows if not w.is_dropped and 0 <= w.done_s - w.arrival_s <= w.slo_s]
    assert summary["slo_attainment"] == len(met) / len(workflows)
    cost = CostModel(scenario.cluster.cost)  # no schedule beats a workflow's unloaded latency (its lower bound)
    assert all(w.done_s - w.arrival_s >= unloaded_latency_s(w, cost) - 1e-6 for w in met)
    assert 0.0 < summary["kv_reserved_frac_vs_maxlen"] <= 1.0
    for node in sim.nodes:  # the nodes that ran: every page they handed out came back
        assert node.alloc.num_free_pages == node.alloc.num_physical_pages


def test_pages_all_return_after_a_run():
    scenario = small("mars-swe", nodes=1)
    workflows = build_workload(scenario, RunConfig(policies=("mars",), num_workflows=20), scenario.regimes[-1])
    sim = Simulator(scenario.cluster, get_system("keep-always"), workflows)
    sim.run()
    assert all(n.alloc.backend.num_mapped_pages == 0 and not n.running for n in sim.nodes)


def test_maestro_reserves_less_than_max_len_and_oracle_predictions_work():
    scenario = small("maestro-paper")
    run = RunConfig(
        policies=("edf", "maestro"), num_workflows=80, rate_per_s=3.0, predictions=PredictionConfig(source="oracle")
    )
    results = run_scenario(scenario, run)["results"]["default"]
    assert results["edf"]["kv_reserved_frac_vs_maxlen"] == pytest.approx(1.0)
    assert results["maestro"]["kv_reserved_frac_vs_maxlen"] < 0.5


def test_replay_is_deterministic_and_reset_replays_identically():
    scenario = small("maestro-paper")
    workflows = build_workload(scenario, RunConfig(policies=("fcfs",), num_workflows=40), scenario.regimes[0])
    first = Simulator(scenario.cluster, get_system("maestro"), workflows).run().summary
    reset(workflows)
    second = Simulator(scenario.cluster, get_system("maestro"), workflows).run().summary
    assert first == second


def test_write_outputs_json_and_plots(tmp_path):
    scenario = small("mars-swe", nodes=1)
    report = run_scenario(scenario, RunConfig(policies=("continuum", "mars"), num_workflows=10, regimes=("short",)))
    paths = write_outputs(report, tmp_path / "out.json")
    data = json.loads((tmp_path / "out.json").read_text())
    assert set(data["results"]["short"]) == {"continuum", "mars"}
    assert "mars_vs_best_continuum" in data["comparisons"]["short"]
    assert all(p.exists() for p in paths) and any(p.suffix == ".png" for p in paths)


def test_unknown_names_fail_with_the_known_ones():
    with pytest.raises(ValueError, match="known policies"):
        get_system("round-robin")
    with pytest.raises(ValueError, match="known scenarios"):
        get_scenario("nope", 1)


@pytest.mark.parametrize("mode", ["workers", "time-sliced", "shared"])
def test_every_host_cpu_mode_completes_and_returns_pages(mode):
    scenario = small("mars-swe", nodes=1)
    scenario.cluster.host_cpu = mode
    workflows = build_workload(scenario, RunConfig(policies=("mars",), num_workflows=20), scenario.regimes[1])
    sim = Simulator(scenario.cluster, get_system("mars"), workflows)
    summary = sim.run().summary
    assert summary["num_stages_completed"] == summary["num_stages_total"]
    assert all(n.alloc.backend.num_mapped_pages == 0 and n.host.num_jobs() == 0 for n in sim.nodes)


def test_scaled_slo_is_a_multiple_of_unloaded_latency():
    from serving.sim.slo import SLOConfig, unloaded_latency_s

    scenario = small("maestro-paper")
    run = RunConfig(policies=("edf",), num_workflows=30, slo=SLOConfig(slo_scale=3.0))
    workflows = build_workload(scenario, run, scenario.regimes[0])
    cost = CostModel(scenario.cluster.cost)
    assert all(w.slo_s == pytest.approx(3.0 * unloaded_latency_s(w, cost)) for w in workflows)


def test_prefix_caching_spares_re_prefill_when_memory_is_free():
    scenario = small("mars-swe", nodes=1)
    workflows = build_workload(
        scenario, RunConfig(policies=("evict-always",), num_workflows=10, rate_per_s=0.05), scenario.regimes[1]
    )
    e2e = {}
    for caching in (False, True):
        scenario.cluster.prefix_caching = caching
        reset(workflows)
        e2e[caching] = Simulator(scenario.cluster, get_system("evict-always"), workflows).run().summary["e2e_s"]["mean"]
    assert e2e[True] < e2e[False]


def test_the_recorder_counts_cold_session_starts_their_reprefilled_context_and_reclaimed_kept_kv():
    scenario = small("mars-swe", nodes=1)
    run = RunConfig(policies=("evict-always",), num_workflows=10, rate_per_s=0.05)
    workflows = build_workload(scenario, run, scenario.regimes[1])
    children = [s for w in workflows for s in w.stages if s.session_parent >= 0]
    counts = {}
    for caching in (False, True):
        scenario.cluster.prefix_caching = caching
        reset(workflows)
        counts[caching] = Simulator(scenario.cluster, get_system("evict-always"), workflows).run().summary
    # nothing kept, nothing cached: every next stage of a session prefills its parent's whole context again
    assert counts[False]["num_cold_session_starts"] == len(children) > 0
    parents = [w.stages[s.session_parent] for w in workflows for s in w.stages if s.session_parent >= 0]
    assert counts[False]["num_reprefilled_tokens"] == sum(p.prompt_tokens + p.output_tokens for p in parents)
    assert counts[True]["num_cold_session_starts"] < len(children)  # memory is free: the prefix cache holds them
    assert counts[False]["num_kept_reclaimed"] == counts[True]["num_kept_reclaimed"] == 0
    scenario.cluster.kv_pool_bytes //= 8  # keep every context where memory binds: starts reclaim kept KV
    burst = build_workload(
        scenario, RunConfig(policies=("keep-always",), num_workflows=10, rate_per_s=5.0), scenario.regimes[1]
    )
    assert Simulator(scenario.cluster, get_system("keep-always"), burst).run().summary["num_kept_reclaimed"] > 0


def test_continuum_sees_which_programs_have_pinned_kv():
    scenario = small("mars-swe", nodes=1)
    workflows = build_workload(scenario, RunConfig(policies=("continuum",), num_workflows=10), scenario.regimes[0])
    Simulator(scenario.cluster, get_system("continuum"), workflows).run()
    flags = [s.request.is_kv_pinned for w in workflows for s in w.stages if s.session_parent >= 0]
    assert any(flags) and not all(flags)  # pinned within the 2 s TTL for fast tools, not for slow ones


def test_a_node_holding_kept_tool_kv_ranks_as_free_as_an_idle_one_and_above_a_busy_one():
    scenario = small("mars-swe", nodes=4)
    workflows = build_workload(scenario, RunConfig(policies=("maestro",), num_workflows=4), scenario.regimes[0])
    sim = Simulator(scenario.cluster, get_system("maestro"), workflows)
    kept_node, idle_node, busy_node, busier_node = sim.nodes
    first, stage = workflows[0].stages[0], workflows[3].stages[0]
    bytes_per_token = sim.dispatch.bytes_per_token(first)

    def hold(node, tokens):
        return node.alloc.reserve(tokens, tokens, bytes_per_token)

    kept = hold(kept_node, 8000)
    kept_node.pinned[first] = kept  # another session's context, kept during its tool call
    busy_node.running[workflows[1].stages[0]] = hold(busy_node, 1000)  # one running stage, less KV
    for s in workflows[2].stages[:2]:
        busier_node.running[s] = hold(busier_node, 2000)
    request = ready_request(stage, 0.0, sim.cost, sim.remaining_work)
    slots = [sim.dispatch.slots[n] for n in sim.nodes]
    terms = [slot.fitness_terms(request) for slot in slots]
    assert kept.mapped_pages > 0 and terms[0][0] == terms[1][0] == 1.0 > terms[2][0]
    # the idle node holding kept KV, not the node that would share its batch
    assert choose(request, [slots[0], slots[2], slots[3]], sim.dispatch.config) is slots[0]


def test_maestros_keep_rule_keeps_the_contexts_marss_evicts_where_stages_run_beside_them():
    scenario = small("mars-swe", nodes=1)
    run = RunConfig(policies=("mars",), num_workflows=12, rate_per_s=2.0)
    workflows = build_workload(scenario, run, scenario.regimes[0])
    kept = {}
    for rule in (ToolKVPolicy.MARS, ToolKVPolicy.MARS_BATCH):
        reset(workflows)
        sim = Simulator(scenario.cluster, get_system("mars").with_overrides(tool_kv=rule), workflows)
        sim.recorder.decisions = []
        sim.run()
        kinds = [d[1] for d in sim.recorder.decisions if d[1] in ("keep", "evict")]
        kept[rule] = {d[2:4] for d in sim.recorder.decisions if d[1] == "keep"}
        assert kinds and all(n.alloc.backend.num_mapped_pages == 0 for n in sim.nodes)
    # the re-prefill priced with what it adds to the stages running beside it: more contexts are kept
    assert len(kept[ToolKVPolicy.MARS_BATCH]) > len(kept[ToolKVPolicy.MARS])
