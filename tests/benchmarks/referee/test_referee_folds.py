"""Leave-one-family-out: the sides of a fold, the left-out family's SLOs from its calibration tasks, its predictor."""

from __future__ import annotations

import pytest

from benchmarks.referee import folds
from benchmarks.referee.grid import Replay
from benchmarks.referee.sides import (
    CALIBRATION_FRACTION,
    Split,
    family_splits,
    is_calibration,
    split_model,
)
from maestro.contract import StageTrace, task_id
from serving.sim.ready import base_id
from serving.sim.slo import SLOTable
from serving.sim.workload import SimStage, SimWorkflow

APPS = {"tau2_retail": "tau2/retail", "tau2_telecom": "tau2/telecom", "tau2_telecom_solo": "tau2/telecom"}


def stage(workflow_id: str, app: str, output_tokens: int = 3) -> StageTrace:
    return StageTrace(
        workflow_id=workflow_id, stage_id="s0", role="agent", prompt="hi", output_tokens=output_tokens, app=app,
        call_index=0,
    )  # fmt: skip


def synthetic(num_tasks: int = 40) -> list[StageTrace]:
    """Every app with `num_tasks` tasks; telecom and telecom-solo run the same tasks (their workflow ids' task)."""
    return [
        stage(f"{prefix}/task{i}-run{run}", app, output_tokens=10 + 37 * i + 400 * run)
        for run, (app, prefix) in enumerate(APPS.items())
        for i in range(num_tasks)
    ]


def test_a_folds_replayed_calibration_and_train_sides_share_no_task():
    splits = family_splits(synthetic())
    assert [s.name for s in splits] == ["tau2-retail", "tau2-telecom"]
    for split in splits:
        train, test, calibration = ({task_id(s) for s in side} for side in (split.train, split.test, split.calibration))
        assert test and calibration and not test & train and not calibration & train and not test & calibration
        assert len(calibration) / len(test | calibration) == pytest.approx(CALIBRATION_FRACTION, abs=0.15)
        assert {s.app for s in split.calibration} == {s.app for s in split.test}
    telecom = splits[1]  # a shared task is calibration for both apps or for neither
    assert {task_id(s) for s in telecom.calibration if s.app == "tau2_telecom"} == {
        task_id(s) for s in telecom.calibration if s.app == "tau2_telecom_solo"
    }


def test_the_calibration_tasks_do_not_depend_on_the_rest_of_the_data():
    every = synthetic()
    assert [is_calibration(s) for s in every[:10]] == [is_calibration(s) for s in synthetic(10)[:10]]


def test_an_app_with_too_few_tasks_to_calibrate_and_replay_is_named():
    stages = synthetic() + [stage("chatdev/Gomoku_Org_20231228120934", "chatdev_warehouse")]
    with pytest.raises(ValueError, match="family 'chatdev': app 'chatdev_warehouse' has no task on the .* side"):
        family_splits(stages)


def workflow(app: str, output_tokens: int) -> SimWorkflow:
    w = SimWorkflow(f"{app}/{output_tokens}", app, False, 0.0)
    w.stages.append(SimStage(w, 0, "s0", "agent", "llama-3-8b", [], output_tokens, False, prompt_tokens=100))
    return w


def test_declared_slos_add_the_unseen_apps_by_the_training_rule_and_keep_the_rest():
    from serving.sim.costmodel import CostModel, CostModelConfig

    cost = CostModel(CostModelConfig())
    table = SLOTable.fit([workflow("a", 10), workflow("a", 30)], cost, 5.0)
    pilot = [workflow("b", 400), workflow("b", 800), workflow("a", 5000)]
    declared = table.declared(pilot, cost)
    assert declared.by_app["a"] == table.by_app["a"] and declared.global_s == table.global_s
    assert declared.by_app["b"] == SLOTable.fit(pilot[:2], cost, 5.0).by_app["b"]
    assert declared.by_app["b"]["batch"] > table.global_s


def test_the_left_out_familys_slo_comes_from_its_calibration_tasks_which_are_never_replayed():
    split = family_splits(synthetic())[0]
    assert split.name == "tau2-retail"
    replay = Replay(split.train, split.test, None, nodes=2, workflows=60, calibration=split.calibration)
    pilot = Replay(split.calibration, split.test, None, nodes=2)  # the same rule on the pilot alone
    trained = Replay(split.train, split.test, None, nodes=2)
    assert replay.slo.by_app["tau2_retail"] == pilot.slo.by_app["tau2_retail"] != {"batch": trained.slo.global_s}
    assert replay.slo.by_app["tau2_telecom"] == trained.slo.by_app["tau2_telecom"]
    assert replay.slo.global_s == trained.slo.global_s
    replayed = {base_id(w) for w in replay.workload(1.0, 0)}
    assert replayed == {s.workflow_id for s in split.test}
    assert not replayed & {s.workflow_id for s in split.calibration}
    record = folds.slo_source(split)
    assert record["by_apps"] == {"train side": [], "calibration": ["tau2_retail"]} and record["calibration"]
    assert folds.sides_record(split)["calibration"]["num_tasks"] == len({task_id(s) for s in split.calibration})


def test_a_folds_predictor_is_trained_on_its_train_side_only_and_reused_until_that_changes(tmp_path, monkeypatch):
    import maestro.cli

    trained = []

    def fake_train(argv):
        out = tmp_path / argv[argv.index("--out") + 1]
        out.mkdir(parents=True, exist_ok=True)
        (out / "predictor.joblib").write_text("x")
        trained.append(open(argv[argv.index("--traces") + 1]).read())

    monkeypatch.setattr(maestro.cli, "main", fake_train)
    split = family_splits(synthetic())[0]
    model = split_model(split, tmp_path)
    assert model == tmp_path / "tau2-retail" / "model" and len(trained) == 1
    assert "tau2_telecom" in trained[0] and "tau2_retail" not in trained[0]
    split_model(split, tmp_path)
    assert len(trained) == 1  # the same train side: cached
    split_model(Split(split.name, split.train[1:], split.test), tmp_path)
    assert len(trained) == 2  # another train side: trained again
    split_model(Split(split.name, split.train[1:], split.test), tmp_path, retrain=True)
    assert len(trained) == 3


def test_a_fold_without_interactive_turns_reports_none_for_them_and_the_rest_as_means():
    """mixed-class's ChatDev fold has no interactive workflow: its turn counters are None in every run (the referee
    crashed on them after the fold's whole run); a counter some runs lack is the mean of those that have it."""
    import numpy as np

    from benchmarks.referee.__main__ import figures
    from benchmarks.referee.stats import Outcomes

    def run(preemptions: float, turns: float | None) -> Outcomes:
        met = np.array([True, False, True])
        extra = {"num_preemptions": preemptions, "turn_attainment": None, "interactive_turn_p95_s": turns}
        return Outcomes(met, np.array([1.0, np.inf, 2.0]), np.array([0, 1, 2]), extra)

    grid = {"1.0": {"edf": [run(2.0, None), run(4.0, 3.0)], "maestro[model]": [run(0.0, None), run(0.0, None)]}}
    counters = figures(grid, ["edf", "maestro[model]"], 0.9)["counters"]["1.0"]
    assert counters["edf"] == {"num_preemptions": 3.0, "turn_attainment": None, "interactive_turn_p95_s": 3.0}
    assert counters["maestro[model]"]["interactive_turn_p95_s"] is None


def test_pooled_folds_keep_a_counter_the_first_fold_did_not_count():
    """The pooled figures took their counters from the first fold's; mixed-class's first fold (ChatDev) counts no
    turn, so the pooled report had none: each counter is the mean over the folds that counted it."""
    import numpy as np

    from benchmarks.referee.stats import Outcomes, pool

    def fold(turns: float | None, preemptions: int) -> Outcomes:
        extra = {"num_preemptions": preemptions, "turn_attainment": turns, "decisions": [("s0", "n0")]}
        return Outcomes(np.array([True]), np.array([1.0]), np.array([0]), extra)

    pooled = pool([fold(None, 2), fold(0.5, 4), fold(0.7, 0)]).extra
    assert pooled == {"num_preemptions": 2.0, "turn_attainment": pytest.approx(0.6)}
