"""The simulator replays any contract file, keeps reserves within max_tokens, and keeps sessions on one node."""

import json
import warnings

import pytest

from serving.core.systems import SYSTEMS, get_system
from serving.sim.cluster import SimDispatcher
from serving.sim.engine import Simulator
from serving.sim.predictions import PredictionConfig
from serving.sim.runner import RunConfig, build_workload, run_scenario
from serving.sim.scenarios import get_scenario

UNKNOWN = "gpt-4o (user simulator)"


def small(name, nodes=2):
    scenario = get_scenario(name, nodes)
    scenario.cluster.show_progress = False
    return scenario


def write_trace(path, num_workflows=6):
    """Tool loops whose models the simulator has no profile for; one output longer than the default max_tokens."""
    rows = []
    for w in range(num_workflows):
        for i, (model, out, is_tool) in enumerate(
            [
                (UNKNOWN, 40, False),
                ("claude-x", 120, True),
                (None, 60, True),
                ("claude-x", 4500 if w == 0 else 90, False),
            ]
        ):
            rows.append(
                {
                    "workflow_id": f"wf{w}",
                    "stage_id": f"s{i}",
                    "role": "agent",
                    "model": model,
                    "parent_ids": [f"s{i - 1}"] if i else [],
                    "prompt": "look up the order " * (40 + 30 * i),
                    "output_tokens": out,
                    "is_tool_call": is_tool,
                    "tool_names": ["get_order"],
                    "tool_exec_s": 0.5,
                }
            )
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def replay(path, policies, model_map=None, predictions="oracle"):
    run = RunConfig(
        policies=policies,
        rate_per_s=2.0,
        traces=str(path),
        model_map=model_map,
        predictions=PredictionConfig(source=predictions),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = run_scenario(small("maestro-paper"), run)
    return report, [str(w.message) for w in caught]


def test_replaying_unknown_model_names_runs_every_policy_and_warns_once_per_name(tmp_path):
    report, messages = replay(write_trace(tmp_path / "t.jsonl"), tuple(sorted(SYSTEMS)))
    for name in (UNKNOWN, "claude-x"):
        assert sum(f"'{name}'" in m for m in messages) == 1
    assert report["default_model"] == "llama-3-8b"
    for policy, summary in report["results"]["default"].items():
        assert summary["num_stages_completed"] == summary["num_stages_total"] == 24, policy


def test_model_map_sets_the_profile_and_silences_its_warning(tmp_path):
    path = write_trace(tmp_path / "t.jsonl")
    scenario = small("maestro-paper")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        workflows = build_workload(
            scenario,
            RunConfig(policies=("edf",), traces=str(path), model_map={UNKNOWN: "qwen2-7b"}),
            scenario.regimes[0],
        )
    assert [s.model for s in workflows[0].stages] == ["qwen2-7b", "llama-3-8b", "llama-3-8b", "llama-3-8b"]
    assert not any(UNKNOWN in str(w.message) for w in caught)
    with pytest.raises(ValueError, match="no cost profile 'gpt-9'; known: llama-3-8b"):
        build_workload(
            scenario, RunConfig(policies=("edf",), traces=str(path), model_map={UNKNOWN: "gpt-9"}), scenario.regimes[0]
        )


def test_traces_cycle_to_the_requested_number_of_workflows(tmp_path):
    scenario = small("maestro-paper")
    run = RunConfig(policies=("edf",), traces=str(write_trace(tmp_path / "t.jsonl", 3)), num_workflows=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        workflows = build_workload(scenario, run, scenario.regimes[0])
    ids = [w.workflow_id for w in workflows]
    assert len(ids) == len(set(ids)) == 7 and {i.split("#")[0] for i in ids} == {"wf0", "wf1", "wf2"}


@pytest.mark.parametrize("policy", ["edf", "maestro", "mars"])
def test_the_reserve_never_exceeds_max_tokens(tmp_path, policy):
    path = write_trace(tmp_path / "t.jsonl")
    scenario = small("maestro-paper")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        workflows = build_workload(
            scenario,
            RunConfig(policies=(policy,), traces=str(path), predictions=PredictionConfig(source="noise", sigma=2.0)),
            scenario.regimes[0],
        )
    long_stage = workflows[0].stages[3]
    assert long_stage.output_tokens == long_stage.max_tokens == 4096  # a recorded output over the cap is cut to it
    dispatch = SimDispatcher(Simulator(scenario.cluster, get_system(policy), workflows))
    for stage in (s for w in workflows for s in w.stages):
        for generated in (0, stage.output_tokens // 2, stage.output_tokens - 1):
            stage.generated_tokens = generated
            assert dispatch._reserve_tokens(stage) <= stage.prompt_tokens + stage.max_tokens
        stage.generated_tokens = 0
    Simulator(scenario.cluster, get_system(policy), workflows).run()
    assert all(s.peak_pages <= s.maxlen_pages for w in workflows for s in w.stages)


def hopping_run(policy="mars", kv_pool_gib=8, nodes=4):
    """mars-swe's long regime on small pools: evicted sessions get routed to other nodes."""
    scenario = small("mars-swe", nodes)
    scenario.cluster.kv_pool_bytes = kv_pool_gib * 1024**3
    workflows = build_workload(
        scenario, RunConfig(policies=(policy,), num_workflows=40, rate_per_s=0.4), scenario.regimes[-1]
    )
    return Simulator(scenario.cluster, get_system(policy), workflows), workflows


def test_a_hopping_session_holds_at_most_one_window_slot(monkeypatch):
    sim, workflows = hopping_run()
    visited, most = {}, [0]
    start = SimDispatcher._start

    def checked_start(self, node, stage, victims):
        start(self, node, stage, victims)
        visited.setdefault(stage.workflow.workflow_id, set()).add(node.index)
        most[0] = max(most[0], max(sum(w in n.cap.session_ids for n in sim.nodes) for w in visited))

    monkeypatch.setattr(SimDispatcher, "_start", checked_start)
    sim.run()
    assert any(len(nodes) > 1 for nodes in visited.values())  # sessions did move between nodes
    assert most[0] == 1
    assert all(not n.cap.session_ids for n in sim.nodes)  # every slot came back when its session ended


def test_sessions_stay_on_their_node_while_memory_is_idle():
    scenario = small("mars-swe", 4)
    workflows = build_workload(scenario, RunConfig(policies=("mars",), num_workflows=24), scenario.regimes[0])
    sim = Simulator(scenario.cluster, get_system("continuum"), workflows)
    sim.run()
    turns = [s for w in workflows for s in w.stages if s.session_parent >= 0]
    assert turns and all(s.node is s.workflow.stages[s.session_parent].node for s in turns)
