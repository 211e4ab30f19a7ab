"""The referee's stock-vLLM baselines, scenario arms, leave-one-family-out folds and scenario / cost options."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from benchmarks.referee import __main__ as referee
from benchmarks.referee.__main__ import main, pairs
from benchmarks.referee.arms import DEFAULT_ARMS, SYSTEM_ARMS, parse_arm
from benchmarks.referee.sides import DEFAULT_TRACES, FAMILIES, app_family, family_splits
from benchmarks.referee.stats import Outcomes, pool, pool_grids, summarize
from maestro.contract import StageTrace
from serving.core.admission.sizing import ReservationMode
from serving.core.scheduler import Policy
from serving.sim.scenarios import get_scenario

TWO_FAMILIES = [p for p in DEFAULT_TRACES if p.stem in ("tau2_medical_triage", "tau2_telecom", "tau2_telecom_solo")]


def stage(workflow_id: str, app: str | None) -> StageTrace:
    return StageTrace(
        workflow_id=workflow_id, stage_id="s0", role="agent", prompt="hi", output_tokens=3, app=app, call_index=0
    )


def test_stock_vllm_arms_allocate_on_demand_and_read_no_prediction():
    vllm, deadline = parse_arm("vllm"), parse_arm("vllm-edf")
    assert vllm.system.scheduler is Policy.FCFS and deadline.system.scheduler is Policy.EDF
    for arm in (vllm, deadline):
        assert arm.system.reservation is ReservationMode.ON_DEMAND and arm.source == "none" and not arm.needs_model
    assert parse_arm("edf").system.reservation is ReservationMode.MAX_LEN
    assert {"vllm", "vllm-edf"} <= set(DEFAULT_ARMS)


def test_a_scenarios_extra_baselines_are_arms_by_their_system_names():
    assert {"mars", "continuum", "continuum-dy", "infercept", "keep-always", "evict-always"} <= set(SYSTEM_ARMS)
    assert parse_arm("keep-always").system.name == "keep-always" and parse_arm("mars").source == "none"
    with pytest.raises(ValueError, match="unknown arm 'maestro-slack'"):  # Maestro's variants are maestro[...] arms
        parse_arm("maestro-slack")


def test_maestro_and_edf_with_admission_are_paired_against_stock_vllm_beside_edf():
    arms = ["edf", "vllm", "vllm-edf", "edf+admission", "maestro[model]", "maestro[none]", "keep-always"]
    found = pairs(arms)
    for challenger in ("maestro[model]", "maestro[none]", "edf+admission"):
        for base in ("edf", "vllm", "vllm-edf"):
            assert (challenger, base) in found
    assert ("vllm-edf", "edf") in found and ("maestro[model]", "keep-always") in found
    assert ("vllm", "edf") not in found and ("keep-always", "edf") not in found


def test_telecom_and_telecom_solo_are_one_family_and_no_family_is_on_both_sides():
    assert app_family(stage("a", "tau2_telecom")) == app_family(stage("b", "tau2_telecom_solo")) == "tau2-telecom"
    stages = [stage(f"{app}/w{i}", app) for app in FAMILIES for i in range(20)]
    splits = family_splits(stages)
    assert [s.name for s in splits] == ["chatdev", "autogen", "tau2-retail", "tau2-telecom", "tau2-medical-triage"]
    for split in splits:
        replayed = {app_family(s) for s in split.test}
        assert replayed == {split.name} and not replayed & {app_family(s) for s in split.train}
        assert len(split.train) + len(split.test) + len(split.calibration) == len(stages)
    telecom = next(s for s in splits if s.name == "tau2-telecom")
    assert {s.app for s in telecom.test} == {"tau2_telecom", "tau2_telecom_solo"}


def test_a_trace_of_no_known_family_is_named_with_what_to_do():
    with pytest.raises(ValueError, match="'x/w1' has app 'swe_bench'.*FAMILIES"):
        family_splits([stage("a/w0", "tau2_retail"), stage("x/w1", "swe_bench")])
    with pytest.raises(ValueError, match="has app None"):
        app_family(stage("y/w2", None))
    with pytest.raises(ValueError, match="two families or more"):
        family_splits([stage("a/w0", "tau2_retail")])


def test_pooled_folds_count_every_folds_workflows_and_keep_clusters_apart():
    a = Outcomes(np.array([1, 1, 0, 0], bool), np.ones(4), np.array([0, 0, 1, 1]), {"num_preemptions": 2})
    b = Outcomes(np.array([1, 1], bool), np.ones(2), np.array([0, 1]), {"num_preemptions": 4, "decisions": []})
    pooled = pool([a, b])
    assert list(pooled.clusters) == [0, 0, 1, 1, 2, 3] and pooled.met.mean() == pytest.approx(4 / 6)
    assert pooled.extra == {"num_preemptions": 3.0}  # the mean run; per-run logs are not pooled
    results, _ = summarize({"x": [pooled]}, [], draws=200)
    assert results["x"]["slo_attainment"]["mean"] == pytest.approx(4 / 6, abs=1e-4)


def test_folds_are_pooled_by_rate_index_even_where_a_fold_found_one_rate_twice():
    def grid(*rates):
        return {str(r): {"edf": [Outcomes(np.array([r > 2]), np.ones(1), np.zeros(1, int), {})]} for r in rates}

    # the second fold's search hit its bound twice: one run stands for both of its rates
    pooled = pool_grids([grid(1.0, 4.0), grid(64.0)], [[1.0, 4.0], [64.0, 64.0]], ["light", "heavy"])
    assert list(pooled) == ["light", "heavy"] and len(pooled["light"]["edf"]) == 1
    assert list(pooled["light"]["edf"][0].met) == [False, True] and list(pooled["heavy"]["edf"][0].met) == [True, True]


def test_family_folds_put_every_fold_in_folds_and_pool_them(tmp_path):
    out = tmp_path / "family.json"
    traces = ",".join(str(p) for p in TWO_FAMILIES)
    arms = "edf,vllm,vllm-edf,maestro[none],keep-always"
    main(["--folds", "family", "--traces", traces, "--rates", "1,6", "--seeds", "2", "--workflows", "40"]
         + ["--nodes", "2", "--arms", arms, "--work", str(tmp_path), "--json", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    assert [f["split"] for f in report["folds"]] == ["tau2-telecom", "tau2-medical-triage"]
    assert report["scenario"] == "maestro-paper" and report["regime"] is None and report["rates_found_by"] is None
    assert report["cost"] == "fitted"
    assert report["rates"] == ["1.0", "6.0"] and report["pooled"]["rates_by_fold"]["6.0"]["tau2-telecom"] == 6.0
    for fold in report["folds"]:  # the left-out apps' SLOs from their calibration tasks, which are not replayed
        left_out = fold["sides"]["test"]["apps"]
        assert fold["slo_source"]["by_apps"]["calibration"] == fold["sides"]["calibration"]["apps"] == left_out
        assert set(left_out) <= set(fold["slo"]["by_app"]) and not set(left_out) & set(fold["sides"]["train"]["apps"])
        assert fold["num_test_workflows"] == fold["sides"]["test"]["num_workflows"] and fold["model"] is None
        assert fold["model_answers_sha256"] is None
    for figures in (report, *report["folds"]):
        for rate, row in figures["results"].items():
            assert 0 < row["ceiling"] <= 1
            for arm in arms.split(","):
                stat = row[arm]["slo_attainment"]
                assert stat["lo"] <= stat["mean"] <= stat["hi"]
                counters = figures["counters"][rate][arm]
                assert {"num_preemptions", "oom_rate", "num_rejected", "num_abandoned"} <= set(counters)
            for pair in ("maestro[none] - vllm-edf", "maestro[none] - vllm", "maestro[none] - edf", "vllm-edf - edf"):
                assert set(figures["differences"][rate][pair]["slo_attainment"]) == {"mean", "lo", "hi"}
    # the pooled attainment weighs every fold's workflows alike (each fold replays as many)
    for rate in report["rates"]:
        by_fold = [f["results"][rate]["vllm"]["slo_attainment"]["mean"] for f in report["folds"]]
        assert report["results"][rate]["vllm"]["slo_attainment"]["mean"] == pytest.approx(np.mean(by_fold), abs=1e-3)
    assert report["pooled"]["results"] == report["results"]
    assert out.with_suffix(".md").read_text().count("| arm |") == 2 * 3 and out.with_suffix(".png").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--scenario", "nowhere"], "unknown scenario 'nowhere'; known scenarios: maestro-paper"),
        (["--regime", "long"], "scenario 'maestro-paper' has no regime 'long'"),
        (["--folds", "families"], "--folds takes a number of task folds"),
        (["--folds", "family", "--model", "somewhere"], "--model with --folds"),
        (["--folds", "3"], "--folds K needs --traces"),
        (["--cost", "guessed"], "invalid choice: 'guessed'"),
    ],
)
def test_a_wrong_option_is_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_a_scenarios_extra_baselines_join_the_default_arms_and_its_regime_defaults_to_long(monkeypatch):
    def scenario(name, num_nodes, regime=None):
        built = get_scenario("mars-swe", num_nodes, regime=regime)
        return dataclasses.replace(built, referee_arms=("keep-always", "mars"))

    monkeypatch.setattr(referee, "get_scenario", scenario)
    parser = referee.parser_of()
    args = parser.parse_args(["--scenario", "mars-swe"])
    referee.check(parser, args)
    assert args.arms.split(",")[-2:] == ["keep-always", "mars"] and args.regime == "long"
    args = parser.parse_args(["--scenario", "mars-swe", "--regime", "medium", "--arms", "vllm"])
    referee.check(parser, args)
    assert args.arms == "vllm" and args.regime == "medium"


def test_mixed_class_reports_its_interactive_turns_and_maestro_paper_has_none(tmp_path):
    out = tmp_path / "mixed.json"
    main(["--scenario", "mixed-class", "--rates", "0.5,8", "--seeds", "1", "--workflows", "60", "--nodes", "2"]
         + ["--arms", "vllm-edf,maestro[none]", "--json", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    for rate in ("0.5", "8.0"):
        for counters in report["counters"][rate].values():
            assert 0 <= counters["turn_attainment"] <= 1 and counters["interactive_turn_p95_s"] > 0
    light, heavy = (report["counters"][r]["vllm-edf"]["interactive_turn_p95_s"] for r in ("0.5", "8.0"))
    assert heavy > light  # turns wait behind more work
    assert "| turns on time | finished turns' p95 (s) |" in out.with_suffix(".md").read_text()
    paper = tmp_path / "paper.json"
    main(["--rates", "1", "--seeds", "1", "--workflows", "20", "--nodes", "2", "--arms", "edf", "--json", str(paper)])
    assert "turn_attainment" not in json.loads(paper.read_text())["counters"]["1.0"]["edf"]
    assert "turns on time" not in paper.with_suffix(".md").read_text()


def test_the_cost_option_names_the_step_model():
    parser = referee.parser_of()
    args = parser.parse_args(["--cost", "datasheet"])
    referee.check(parser, args)
    assert args.cost == "datasheet" and args.step_model == "datasheet"
    assert parser.parse_args([]).cost == "fitted"


def test_the_replay_is_priced_by_the_named_step_model():
    from benchmarks.referee.grid import Replay

    train, test = [stage("tau2_retail/w0", "tau2_retail")], [stage("tau2_retail/w1", "tau2_retail")]
    for step_model in ("fitted", "datasheet"):
        replay = Replay(train, test, None, nodes=1, workflows=2, step_model=step_model)
        assert replay.scenario.cluster.cost.step_model == step_model
