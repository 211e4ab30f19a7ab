"""The referee's scenarios on small replays of the real traces, built as the referee builds one (its train side fixes
the SLOs; the replayed side is mapped to cost profiles, then `Scenario.prepare` applies the scenario)."""

import warnings

import numpy as np
import pytest

from benchmarks.referee.grid import MODEL_MAP
from benchmarks.referee.sides import DEFAULT_TRACES, read_all, side_split
from serving.core.residency import ModelState
from serving.core.systems import get_system
from serving.sim.arrivals import arrival_times
from serving.sim.costmodel import CostModel
from serving.sim.engine import Simulator
from serving.sim.scenarios import SCENARIOS, get_scenario
from serving.sim.slo import SLOTable, TurnSLO
from serving.sim.tooltime import ToolTimeDistribution
from serving.sim.workload import map_models, trace_workflows

pytestmark = pytest.mark.skipif(not DEFAULT_TRACES[0].exists(), reason="needs ../shared/data (the real traces)")


@pytest.fixture(scope="module")
def split():
    return side_split(read_all(DEFAULT_TRACES), "dev")


def build(scenario, stages, count, seed=0):
    default = scenario.cluster.placement[0][0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        workflows = trace_workflows(stages, default, count, seed)
        map_models(workflows, scenario.cluster.cost.models, default, MODEL_MAP)
    scenario.prepare(workflows)
    ToolTimeDistribution().draw(workflows, seed)
    return workflows


def replay(scenario, split, count, rate, seed=0):
    """(replayed workflows with SLOs and arrivals, the cost model, the training workflows)."""
    scenario.cluster.show_progress = False
    cost = CostModel(scenario.cluster.cost)
    train = build(scenario, split.train, None)
    workflows = build(scenario, split.test, count, seed)
    SLOTable.fit(train, cost, 5.0).apply(workflows)
    for workflow, at in zip(workflows, arrival_times("poisson", len(workflows), rate, seed)):
        workflow.arrival_s = float(at)
    return workflows, cost, train


def test_unknown_scenario_or_regime_names_the_known_ones():
    with pytest.raises(ValueError, match="known scenarios: maestro-paper, mars-swe, mixed-class, multi-model"):
        get_scenario("nope", 1)
    with pytest.raises(ValueError, match="known regimes: short, medium, long"):
        get_scenario("mars-swe", 1, regime="huge")
    assert get_scenario("mars-swe", 1).regime.name == "long"  # the default
    assert get_scenario("mars-swe", 1, regime="medium").regime.name == "medium"
    assert set(get_scenario("mars-swe", 1).referee_arms) >= {"keep-always", "evict-always", "continuum", "mars"}
    for name in SCENARIOS:
        assert get_scenario(name, 2).cluster.num_nodes == 2


def test_mars_swe_grows_contexts_the_same_per_workflow_whatever_the_list(split):
    scenario = get_scenario("mars-swe", 1)
    first = build(scenario, split.test, 60)
    again = {w.workflow_id: w for w in build(scenario, split.test, 60)}
    other_order = {w.workflow_id: w for w in build(scenario, split.test, 60, seed=1)}
    plain = {w.workflow_id: w for w in build(get_scenario("maestro-paper", 1), split.test, 60)}
    for w in first:
        assert [s.prompt_tokens for s in w.stages] == [s.prompt_tokens for s in again[w.workflow_id].stages]
        if w.workflow_id in other_order:  # the same workflow in another replay order: the same growth
            assert [s.prompt_tokens for s in w.stages] == [s.prompt_tokens for s in other_order[w.workflow_id].stages]
        assert {s.model for s in w.stages} == {"qwen3-coder-30b-a3b"}
    starts = [s.prompt_tokens - p.prompt_tokens for w in first for s, p in zip(w.stages, plain[w.workflow_id].stages)]
    assert 25_000 < np.median(starts) < 45_000  # +40k a session's first call (LogNormal, σ 0.5), capped at 64k
    medium = build(get_scenario("mars-swe", 1, regime="medium"), split.test, 60)
    assert np.median([s.prompt_tokens for w in medium for s in w.stages]) < np.median(
        [s.prompt_tokens for w in first for s in w.stages]
    )


def test_mars_swe_long_burst_binds_memory_for_stock_vllm(split):
    scenario = get_scenario("mars-swe", 1)
    workflows, _, _ = replay(scenario, split, 40, rate=64.0)
    summary = Simulator(scenario.cluster, get_system("vllm"), workflows).run().summary
    # Memory binds as refused starts: contexts (~40k tokens) dwarf outputs (median 64), so a running stage rarely
    # outgrows its blocks; under chunked prefill no running stage is preempted in this burst.
    assert summary["num_kv_refused"] > 0
    pool_tokens = (
        scenario.cluster.kv_pool_bytes
        / CostModel(scenario.cluster.cost).model("qwen3-coder-30b-a3b").kv_bytes_per_token
    )
    assert 500_000 < pool_tokens < 700_000  # 0.9 × 141 GB − 61 GB of weights − 4 GB, at 96 KiB a token


def test_mixed_class_tau2_interactive_chatdev_batch_on_shared_nodes(split):
    scenario = get_scenario("mixed-class", 2)
    workflows, cost, train = replay(scenario, split, 120, rate=4.0)
    by_app = {}
    for w in workflows:
        by_app.setdefault(w.app, set()).add(w.interactive)
    assert by_app["tau2_retail"] == by_app["tau2_telecom"] == {True}
    assert by_app["chatdev_warehouse"] == by_app["tau2_telecom_solo"] == {False}
    sim = Simulator(scenario.cluster, get_system("maestro"), workflows)
    summary = sim.run().summary
    waits = sim.recorder.interactive_waits_s
    assert waits and summary["interactive_queue_p95_s"] == pytest.approx(np.percentile(waits, 95))
    ran = [(w.interactive, s.node.index) for w in workflows for s in w.stages if s.node is not None]
    nodes = {c: {n for i, n in ran if i is c} for c in (True, False)}
    assert nodes[True] & nodes[False]  # both classes ran on the same node
    turns = TurnSLO.fit(train, cost, 5.0)
    assert set(turns.by_app) == {"tau2_retail", "tau2_telecom", "tau2_medical_triage"} & {w.app for w in train}
    report = turns.report(workflows, cost)
    assert 0 < report["turn_attainment"] <= report["turn_ceiling"] <= 1
    assert report["interactive_all_turns"] <= report["turn_attainment"]
    finished = [s.finished_s - s.ready_s for w in workflows if w.interactive for s in w.stages if s.finished_s >= 0]
    assert report["turn_p95_s"] == pytest.approx(np.percentile(finished, 95))


def test_multi_model_cold_stage_waits_for_its_load_and_the_load_is_counted(split):
    scenario = get_scenario("multi-model", 2)
    workflows, cost, _ = replay(scenario, split, 80, rate=2.0)
    models = {s.model for w in workflows for s in w.stages}
    budget = scenario.cluster.residency.gpu_weight_budget_bytes
    weights = sorted(cost.model(m).weight_bytes for m in models)
    assert len(models) > 2 and sum(weights[:3]) > budget  # more models than a node holds: one or two at most
    assert weights[0] + weights[1] <= budget
    sim = Simulator(scenario.cluster, get_system("vllm"), workflows)
    summary = sim.run().summary
    assert summary["num_model_loads"] >= len(models)  # every model starts on disk: each loads at least once
    residency = sim.nodes[0].residency
    from_disk = {
        m: residency.config.warmup_s + cost.model(m).weight_bytes / residency.config.nvme_bytes_per_s for m in models
    }
    first = {}
    for stage in sorted((s for w in workflows for s in w.stages if s.finished_s >= 0), key=lambda s: s.first_start_s):
        first.setdefault(stage.model, stage)
    assert all(s.finished_s - s.first_start_s >= from_disk[m] for m, s in first.items())  # each first stage waited
    states = {state for node in sim.nodes for state in node.residency.state.values()}
    assert ModelState.SLEEPING in states or ModelState.CPU in states  # models were pushed out to make room


def test_multi_model_a_pool_is_backlogged_only_while_a_stage_of_its_model_waits(split):
    # nodes hold two models each: a stage of one waiting on the node says nothing of the other's pool, whose
    # finishes then would read its own light load as its capacity (triage's feasibility test sheds on it)
    scenario = get_scenario("multi-model", 2)
    workflows, _, _ = replay(scenario, split, 120, rate=8.0)
    sim = Simulator(scenario.cluster, get_system("maestro"), workflows)
    flags = []

    def observed(model, work_s, now, backlogged, wall_s=None, *node):
        waiting = {r.model for n in sim.dispatch.running_on.get(model, ()) for r in n.sched.in_order(now)}
        flags.append((backlogged, model in waiting, bool(waiting - {model})))
        served(model, work_s, now, backlogged, wall_s, *node)

    served, sim.triage.served = sim.triage.served, observed
    sim.run()
    assert any(others and not mine for _, mine, others in flags)  # others' stages waited while none of its own did
    assert all(backlogged == mine for backlogged, mine, _ in flags)
