"""The referee's parts: its JSON interface, its SLOs, its statistics, its arms."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from benchmarks.referee.__main__ import main, pairs
from benchmarks.referee.arms import parse_arm, parse_arms
from benchmarks.referee.stats import Outcomes, summarize


def outcomes(met, e2e, clusters=None) -> Outcomes:
    met = np.asarray(met, dtype=bool)
    clusters = np.arange(len(met)) if clusters is None else np.asarray(clusters)
    return Outcomes(met, np.asarray(e2e, dtype=float), clusters, {})


def test_a_small_run_writes_the_interface_and_no_arm_beats_the_ceiling(tmp_path):
    out = tmp_path / "referee.json"
    main(
        [
            "--rates",
            "0.5,8",
            "--seeds",
            "2",
            "--workflows",
            "60",
            "--nodes",
            "2",
            "--arms",
            "edf,maestro[none],maestro[oracle],maestro[oracle/no-gate]",
            "--json",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert report["slo"]["mode"] == "per-app-from-train" and report["slo"]["global"] > 0
    assert {"tau2_retail", "chatdev_warehouse"} <= set(report["slo"]["by_app"])  # fixed from the train side's apps
    assert report["rates"] == [0.5, 8.0] and set(report["results"]) == set(report["differences"]) == {"0.5", "8.0"}
    assert report["tool_times"]["distribution"] == "lognormal" and report["variants_tried"] >= 0
    for rate, row in report["results"].items():
        assert 0 < row["ceiling"] <= 1
        for arm in ("edf", "maestro[none]", "maestro[oracle]", "maestro[oracle/no-gate]"):
            stat = row[arm]["slo_attainment"]
            assert stat["lo"] <= stat["mean"] <= stat["hi"]
            # met implies the workflow's unloaded latency fits its SLO, so no arm can beat the ceiling
            assert stat["mean"] <= row["ceiling"] + 1e-9
        assert "maestro[oracle] - maestro[none]" in report["differences"][rate]
    assert out.with_suffix(".md").read_text().count("| arm |") == 2 and out.with_suffix(".png").exists()


def test_an_arm_against_itself_differs_by_exactly_nothing():
    runs = [outcomes([1, 0, 1, 1], [1, math.inf, 2, 3]), outcomes([1, 1, 0, 1], [2, 1, 9, 1])]
    results, differences = summarize({"a": runs, "b": runs}, [("a", "b")], draws=200)
    assert differences["a - b"]["slo_attainment"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0}
    assert results["a"]["slo_attainment"]["mean"] == pytest.approx((0.75 + 0.75) / 2)


def test_an_unfinished_workflow_counts_as_a_miss_and_as_infinite_latency():
    never = outcomes([0, 0, 0, 1], [math.inf, math.inf, math.inf, 5.0])
    results, _ = summarize({"a": [never]}, [], draws=100)
    assert results["a"]["slo_attainment"]["mean"] == 0.25
    assert results["a"]["e2e_p95_s"]["mean"] is None  # the p95 workflow never finished


def test_a_clear_difference_has_an_interval_that_excludes_zero():
    rng = np.random.default_rng(0)
    better = [outcomes(rng.random(400) < 0.8, np.ones(400)) for _ in range(3)]
    worse = [outcomes(rng.random(400) < 0.5, np.ones(400)) for _ in range(3)]
    _, differences = summarize({"good": better, "bad": worse}, [("good", "bad")], draws=500)
    assert differences["good - bad"]["slo_attainment"]["lo"] > 0.2


def test_arms_are_parsed_and_a_wrong_one_is_named():
    assert parse_arm("edf+admission").system.batch_cost and parse_arm("edf+admission").source == "model"
    ablated = parse_arm("maestro[prior/no-gate,no-remaining]")
    assert not ablated.system.batch_cost and ablated.fed == (("remaining", "none"),) and ablated.source == "prior"
    with pytest.raises(ValueError, match="maestro\\[modle\\]"):
        parse_arm("maestro[modle]")
    with pytest.raises(ValueError, match="no-gaet"):
        parse_arm("maestro[model/no-gaet]")


def test_the_parts_stock_vllm_lacks_switch_off_one_at_a_time_and_together():
    maestro, stock = parse_arm("maestro[model]").system, parse_arm("vllm-edf").system
    parts = {"no-route": "router", "no-toolkv": "tool_kv", "no-headroom": "admission_headroom_frac"}
    parts["on-demand"] = "reservation"
    for ablation, part in parts.items():
        system = parse_arm(f"maestro[model/{ablation}]").system
        assert getattr(maestro, part) != getattr(stock, part) == getattr(system, part)
        assert {p: getattr(system, p) for p in parts.values() if p != part} == {
            p: getattr(maestro, p) for p in parts.values() if p != part
        }
    arms = parse_arms("vllm-edf,maestro[model/no-route,no-toolkv,no-headroom,on-demand],maestro[none]")
    assert [a.name for a in arms][::2] == ["vllm-edf", "maestro[none]"]
    together = arms[1].system
    assert all(getattr(together, p) == getattr(stock, p) for p in parts.values())
    assert together.scheduler is maestro.scheduler and together.batch_cost


def test_a_second_predictor_is_an_arm_of_its_own_and_needs_its_directory(capsys):
    compare = parse_arm("maestro[model@compare]")
    assert compare.source == "model@compare" and compare.needs_compare_model and not compare.needs_model
    assert parse_arm("maestro[model@compare/no-gate]").system.batch_cost is False
    assert ("maestro[model]", "maestro[model@compare]") in pairs(["edf", "maestro[model]", "maestro[model@compare]"])
    with pytest.raises(SystemExit):
        main(["--arms", "edf,maestro[model@compare]", "--model", "unused"])
    assert "--compare-model" in capsys.readouterr().err
