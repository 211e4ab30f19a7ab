"""The referee's engine replay knows no future: change what a workflow does later, and nothing it is told before
changes.

The plans of `python -m benchmarks.referee --engine` (benchmarks/engine/replay.py) are built for real held-out
workflows with a small trained predictor, for every default arm. Then one chain workflow is changed from a middle stage
on — its later stages three times longer, or its last stages dropped — and the plans are built again: every stage
before the cut (its spec, hints, session, vLLM priority), the workflow's arrival and deadline, and every other workflow
must be identical. The same check on the plans as the engine replay built them before the referee (a per-workflow
deadline from every stage's true length; `workflow_remaining_s` the sum of the later stages' predictions) must find a
difference: the proof that it can fail. No engine runs here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.engine.arms import DEFAULT_ARMS, engine_arm
from benchmarks.engine.config import EngineConfig
from benchmarks.engine.replay import EngineWorkload
from benchmarks.engine.report import context_tokens, run_figures
from benchmarks.referee.engine import pairs, summarize_rate
from maestro.contract import StageTrace

from .engine_cuts import chains, trained_sides, truncate

RATE, SEED, WORKFLOWS = 20.0, 0, 40
ARMS = [engine_arm(name) for name in (*DEFAULT_ARMS, "maestro[model/preempt]", "maestro[model/admit]")]


@pytest.fixture(scope="module")
def sides():
    return trained_sides()


def lengthen(test: list[StageTrace], workflow_id: str, cut: int) -> list[StageTrace]:
    out, position = [], 0
    for stage in test:
        if stage.workflow_id == workflow_id:
            if position >= cut:
                stage = stage.model_copy(update={"output_tokens": stage.output_tokens * 3})
            position += 1
        out.append(stage)
    return out


def plans(split, model_dir, test: list[StageTrace]) -> dict[str, dict]:
    workload = EngineWorkload(split.train, test, model_dir, EngineConfig())
    return workload.plans(ARMS, RATE, SEED, WORKFLOWS, "unused")


@pytest.fixture(scope="module")
def original(sides) -> dict[str, dict]:
    return plans(*sides, sides[0].test)


def told_before(plan: dict, workflow_id: str, cut: int) -> list:
    """Everything the plan tells about stages before the cut of `workflow_id`'s copies, and about every other
    workflow. maestro[oracle] is told its workflows' true remaining work (the one read of later stages, by
    definition of that arm): that hint is left out of its comparison."""
    out = []
    oracle = plan["arm"]["name"] == "maestro[oracle]"
    for wf in plan["workflows"]:
        if wf["id"].split("#")[0] == workflow_id:
            stages = [
                {**s, "hints": {k: v for k, v in s["hints"].items() if k != "workflow_remaining_s"}}
                if oracle and "hints" in s
                else s
                for s in wf["stages"][:cut]
            ]
            out.append((wf["id"], wf["arrival_step"], wf["slo_steps"], stages))
        else:
            out.append(wf)
    return out


def legacy(plan: dict, deadline: bool, future_sum: bool) -> dict:
    """The plan as the engine replay built it before the referee: with `deadline`, a per-workflow deadline = 5 × the
    workflow's critical path alone on the engine from every stage's true length; with `future_sum`, Maestro's
    `workflow_remaining_s` = the sum of the later stages' predicted tokens."""
    out = {**plan, "workflows": []}
    for wf in plan["workflows"]:
        stages, finish = [dict(s) for s in wf["stages"]], {}
        for spec in stages:  # the stages come in order: parents first
            own = math.ceil(spec["prompt_tokens"] / 512) + spec["output_tokens"] - 1 + spec["tool_gap_steps"]
            finish[spec["index"]] = max((finish[p] for p in spec["parents"]), default=0) + own
        for i, spec in enumerate(stages):
            if future_sum and "hints" in spec:
                later = sum(s["hints"]["tokens_pred"] for s in stages[i + 1 :])
                spec["hints"] = {**spec["hints"], "workflow_remaining_s": later}
        slo = 5 * max(finish.values()) if deadline else wf["slo_steps"]
        out["workflows"].append({**wf, "slo_steps": slo, "stages": stages})
    return out


@pytest.mark.parametrize("change", [lengthen, truncate])
def test_no_plan_reads_the_future(sides, original, change):
    split, model_dir = sides
    targets = chains(split.test)
    assert targets, "the replayed side must hold chain workflows to cut"
    for workflow_id, cut in targets:
        changed = plans(split, model_dir, change(split.test, workflow_id, cut))
        for arm in original:
            assert any(wf["id"].split("#")[0] == workflow_id for wf in original[arm]["workflows"])
            before, after = told_before(original[arm], workflow_id, cut), told_before(changed[arm], workflow_id, cut)
            assert before == after, f"{arm}, {change.__name__} of {workflow_id} at {cut}: an earlier plan differs"


@pytest.mark.parametrize(
    "change, arm, leak", [(lengthen, "vllm-fcfs", "deadline"), (truncate, "maestro[model]", "future_sum")]
)
def test_the_check_catches_the_old_deadline_and_the_old_future_sum(sides, original, change, arm, leak):
    split, model_dir = sides
    workflow_id, cut = chains(split.test)[0]
    original = original[arm]
    changed = plans(split, model_dir, change(split.test, workflow_id, cut))[arm]
    assert told_before(original, workflow_id, cut) == told_before(changed, workflow_id, cut)
    old = {"deadline": leak == "deadline", "future_sum": leak == "future_sum"}
    assert told_before(legacy(original, **old), workflow_id, cut) != told_before(
        legacy(changed, **old), workflow_id, cut
    )


def test_every_arm_gets_the_same_deadlines_one_per_app_and_class(original):
    built = original
    deadlines = {arm: [wf["slo_steps"] for wf in plan["workflows"]] for arm, plan in built.items()}
    assert len({tuple(d) for d in deadlines.values()}) == 1
    by_app: dict[str, set] = {}
    for wf in built["vllm-fcfs"]["workflows"]:
        by_app.setdefault((wf["app"], wf["interactive"]), set()).add(wf["slo_steps"])
    assert all(len(slos) == 1 for slos in by_app.values()), "one SLO per (app, class)"
    none = {s["hints"]["tokens_pred"] for wf in built["maestro[none]"]["workflows"] for s in wf["stages"]}
    assert len(none) <= 2, "maestro[none] reads no prediction: one constant (capped by a stage's max_tokens)"
    assert all("hints" not in s and "priority" not in s for wf in built["vllm-fcfs"]["workflows"] for s in wf["stages"])


def test_a_maestro_variant_is_its_sources_arm_with_its_config_fields_set(original):
    """maestro[model/preempt]: maestro[model]'s workflows and hints, its plugin config the engine's with preemptive
    set, and its difference from maestro[model] reported; every other arm's config is the engine's."""
    variant, base = original["maestro[model/preempt]"], original["maestro[model]"]
    assert variant["workflows"] == base["workflows"]
    assert variant["arm"]["maestro_config"] == {**base["arm"]["maestro_config"], "preemptive": True}
    assert all("preemptive" not in plan["arm"]["maestro_config"] for arm, plan in original.items() if "/" not in arm)
    admit = original["maestro[model/admit]"]["arm"]["maestro_config"]
    assert admit == {**base["arm"]["maestro_config"], "preemptive": True, "victim": "remaining"}
    variants = ["maestro[model]", "maestro[model/preempt]", "maestro[model/admit]"]
    assert {("maestro[model/preempt]", "maestro[model]"), ("maestro[model/preempt]", "maestro[model/admit]")} <= set(
        pairs(variants)
    )
    with pytest.raises(ValueError, match="preempt"):
        engine_arm("maestro[model/preemptive]")


def test_only_maestro_arms_carry_sessions_and_a_next_turn_shares_its_parents(original):
    """vLLM's arms have the prefix cache alone; a Maestro arm's turn names its session, the same as the turn it
    continues, and a session's first turn names itself."""
    for plan in original.values():
        stages = [(wf, s) for wf in plan["workflows"] for s in wf["stages"]]
        if plan["arm"]["scheduler"] != "maestro":  # gateway+maestro[...] runs the plugin too
            assert all("session" not in s for _, s in stages)
            continue
        for wf, spec in stages:
            parent = spec["session_parent"]
            own = f"{wf['id']}/{spec['index']}"
            assert spec["session"]["id"] == (wf["stages"][parent]["session"]["id"] if parent >= 0 else own)
            assert spec["session"]["prior_steps"] > 0
        assert any(s["session_parent"] >= 0 for _, s in stages), "the replayed side must hold tool loops"


def test_figures_from_hand_built_step_records(original):
    """Two workflows measured, one met; preemptions and tokens per step as defined."""
    plan = original["vllm-fcfs"]
    plan = {**plan, "workflows": plan["workflows"][:4], "measured": [1, 3], "window": [0, 100]}
    records = []
    for w, wf in enumerate(plan["workflows"]):
        finish = wf["arrival_step"] + wf["slo_steps"] - 1 + (0 if w == 1 else 5)  # the first measured one in time
        records.append(
            [
                {
                    "ready_step": wf["arrival_step"],
                    "finish_step": finish,
                    "num_preemptions": w,
                    "cached_tokens": 0,
                    "window_tokens": 10,
                }
                for _ in wf["stages"]
            ]
        )
    figures = run_figures(
        plan, {"stages": records, "wall_s": 1.0, "num_engine_steps": 100, "recomputed_tokens": 0, "decisions": None}
    )
    assert figures["met"].tolist() == [True, False]
    assert figures["preemptions"].tolist() == [
        len(plan["workflows"][1]["stages"]),
        2 * len(plan["workflows"][2]["stages"]),
    ]
    results, differences = summarize_rate({"a": [figures], "b": [figures]}, ["a", "b"], 0.04)
    total_tokens = 10 * sum(len(wf["stages"]) for wf in plan["workflows"])
    assert results["a"]["tokens_per_step"]["mean"] == pytest.approx(total_tokens / 100, rel=1e-3)
    assert results["a"]["slo_attainment"]["mean"] == 0.5 and not differences
    assert np.isfinite(results["a"]["workflow_p95_steps"]["mean"])
    # a next turn's recomputed tokens: the previous turn's prompt and output it starts with, less what the cache served
    contexts = [
        sum(
            min(
                wf["stages"][s["session_parent"]]["prompt_tokens"] + wf["stages"][s["session_parent"]]["output_tokens"],
                s["prompt_tokens"] - 1,
            )
            for s in wf["stages"]
            if s["session_parent"] >= 0
        )
        for wf in plan["workflows"][1:3]
    ]
    assert sum(contexts) > 0 and figures["recomputed"].tolist() == figures["contexts"].tolist() == contexts
    whole = figures["counters"]["next_turns"]  # every workflow of the run, nothing cached
    turns = [(wf, s) for wf in plan["workflows"] for s in wf["stages"] if s["session_parent"] >= 0]
    block = plan["engine"]["block_size"]
    assert whole["recomputed"] == whole["context_tokens"] == sum(context_tokens(wf, s) for wf, s in turns)
    assert whole["recomputed_full_blocks"] == sum(context_tokens(wf, s) // block * block for wf, s in turns)
    assert whole["turns"] == len(turns) and whole["recomputed_full_blocks"] < whole["recomputed"]
    for workflow in records:
        for record in workflow:
            record["cached_tokens"] = 10**6  # more than any context: the new tokens are never counted
    served = run_figures(
        plan, {"stages": records, "wall_s": 1.0, "num_engine_steps": 100, "recomputed_tokens": 0, "decisions": None}
    )
    assert served["recomputed"].tolist() == [0, 0] and served["contexts"].tolist() == contexts
    assert (
        served["counters"]["next_turns"]["recomputed"]
        == served["counters"]["next_turns"]["recomputed_full_blocks"]
        == 0
    )


def test_resume_runs_only_the_plans_without_step_records_beside_the_same_plan(tmp_path, monkeypatch):
    """`--resume`: a plan already run (its step records beside the very same plan) is read back, not run again; a
    changed plan or one without records is run."""
    from benchmarks.referee import engine

    runs = []

    def fake_run(command, **kwargs):  # the engine: writes each OUT it is given
        paths = command[3:]
        runs.append([Path(p).name for p in paths[::2]])
        for out in paths[1::2]:
            Path(out).write_text(json.dumps({"ran": True}))

    monkeypatch.setattr(engine.subprocess, "run", fake_run)
    plans = {"a": {"x": 1}, "b": {"x": 2}}
    assert engine.run_plans(plans, tmp_path, Path("python")) == {"a": {"ran": True}, "b": {"ran": True}}
    (tmp_path / "steps_a.json").write_text(json.dumps({"kept": True}))
    steps = engine.run_plans({"a": {"x": 1}, "b": {"x": 3}}, tmp_path, Path("python"), resume=True)
    assert steps == {"a": {"kept": True}, "b": {"ran": True}} and runs[-1] == ["plan_b.json"]
    assert (
        engine.run_plans({"a": {"x": 1}, "b": {"x": 3}}, tmp_path, Path("python"), resume=True)["a"] == {"kept": True}
        and len(runs) == 2
    )  # nothing left to run: no engine started
    engine.run_plans({"a": {"x": 1}}, tmp_path, Path("python"))
    assert runs[-1] == ["plan_a.json"]  # without resume, everything runs
    assert engine.run_plans({"m[model/v]": {"x": 1}}, tmp_path, Path("python")) == {"m[model/v]": {"ran": True}}
    assert runs[-1] == ["plan_m[model+v].json"]  # a variant's '/' is no folder
