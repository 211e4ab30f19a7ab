"""The whole grid: every scenario's referee run, side by side, and the index that puts Maestro against each best
baseline."""

import json
import sys

import pytest

from benchmarks.referee import grid_all


def test_the_grid_runs_every_scenario_and_regime_and_indexes_them(tmp_path):
    grid_all.main(["--arms", "edf,vllm-edf,maestro[none]", "--workflows", "20", "--nodes", "2", "--rates", "1"]
                  + ["--seeds", "1", "--jobs", "2", "--out", str(tmp_path)])  # fmt: skip
    names = {"mixed-class", "maestro-paper", "mars-swe-long", "mars-swe-medium", "multi-model"}
    assert {run.name for run in grid_all.GRID} == names
    for run in grid_all.GRID:
        report = json.loads((tmp_path / f"{run.name}.json").read_text())
        assert (report["scenario"], report["regime"]) == (run.scenario, run.regime)
        assert set(report["results"]["1.0"]) == {"edf", "vllm-edf", "maestro[none]", "ceiling"}
        assert (tmp_path / f"{run.name}.md").exists()
    rows = [line for line in (tmp_path / "index.md").read_text().splitlines() if line.startswith("| ")][
        1:
    ]  # less the header
    assert sorted(row.split(" | ")[0][2:] for row in rows) == sorted(names)
    assert set(json.loads((tmp_path / "grid.json").read_text())["runs"]) == names


def test_a_scenarios_default_arms_are_the_baselines_its_extras_and_the_four_sources():
    mars = grid_all.GridRun("mars-swe", "long", 400).arms().split(",")
    assert mars[:5] == ["fcfs", "edf", "srtf", "vllm", "vllm-edf"] and "mars" in mars and "continuum" in mars
    assert mars[-4:] == ["maestro[model]", "maestro[prior]", "maestro[none]", "maestro[oracle]"]
    assert "mars" not in grid_all.GridRun("mixed-class", None, 1600).arms().split(",")
    lean = grid_all.GridRun("mars-swe", "long", 400).arms(lean=True).split(",")
    assert lean[:3] == ["edf", "vllm", "vllm-edf"] and "mars" in lean and "fcfs" not in lean
    assert lean[-2:] == ["maestro[model]", "maestro[none]"]


def test_the_best_baseline_is_the_highest_and_its_paired_difference_is_read_where_the_referee_pairs_it():
    def arm(mean):
        return {"slo_attainment": {"mean": mean, "lo": mean - 0.01, "hi": mean + 0.01}}

    results = {"edf": arm(0.5), "fcfs": arm(0.7), "vllm-edf": arm(0.6), "maestro[model]": arm(0.8), "ceiling": 0.9}
    best, diff = grid_all.best_baseline(results, {"maestro[model] - vllm-edf": arm(0.2)})
    assert best == "fcfs" and abs(diff["mean"] - 0.1) < 1e-12 and diff["lo"] is None  # not paired: the mean alone
    results["fcfs"] = arm(0.55)
    best, diff = grid_all.best_baseline(results, {"maestro[model] - vllm-edf": arm(0.2)})
    assert best == "vllm-edf" and diff == arm(0.2)["slo_attainment"]


def test_with_family_folds_every_scenario_leaves_a_family_out_and_no_shared_model_is_taken(tmp_path, capsys):
    args = grid_all.parser_of().parse_args(["--folds", "family", "--work", "w"])
    cmd = grid_all.command(grid_all.GRID[0], args, tmp_path)
    assert cmd[cmd.index("--folds") + 1] == "family" and "--side" not in cmd and "--model" not in cmd
    try:
        grid_all.main(["--folds", "family", "--model", "m", "--out", str(tmp_path)])
    except SystemExit as refused:
        assert refused.code == 2
    assert "saw every family" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before anything ran


def test_a_folds_index_has_the_pooled_loads_and_each_familys_rates(tmp_path):
    def figures(rate: str, maestro: float) -> dict:
        stat = {"slo_attainment": {"mean": maestro, "lo": maestro - 0.01, "hi": maestro + 0.01}}
        edf = {"slo_attainment": {"mean": 0.5, "lo": 0.49, "hi": 0.51}}
        diff = {"slo_attainment": {"mean": maestro - 0.5, "lo": maestro - 0.52, "hi": maestro - 0.48}}
        return {"results": {rate: {"edf": edf, "maestro[model]": stat, "ceiling": 0.9}},
                "differences": {rate: {"maestro[model] - edf": diff}}}  # fmt: skip

    report = {**figures("knee", 0.6), "folds": [{"split": "chatdev", **figures("2.5", 0.7)}]}
    (tmp_path / "multi-model.json").write_text(json.dumps(report))
    text = grid_all.index(tmp_path, {"multi-model": 60.0}, 60.0, "family folds")
    rows = [row.split(" | ") for row in text.splitlines() if row.startswith("| multi-model")]
    assert [(row[1], row[2], row[3], row[5]) for row in rows] == [
        ("pooled", "knee", "edf", "+10.0 [+8.0, +12.0]"),
        ("chatdev", "2.5", "edf", "+20.0 [+18.0, +22.0]"),
    ]
    assert text.startswith("# The referee's grid, family folds")


def test_a_scenario_that_fails_is_named_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    real = grid_all.command

    def command(run, args, out):
        if run.name == "mixed-class":  # a referee that dies, as mixed-class's folds did on a family with no turns
            return [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
        return real(run, args, out)

    monkeypatch.setattr(grid_all, "command", command)
    argv = ["--scenarios", "mixed-class,multi-model", "--arms", "edf,maestro[none]", "--workflows", "20"]
    argv += ["--nodes", "2", "--rates", "1", "--seeds", "1", "--jobs", "1", "--out", str(tmp_path)]
    with pytest.raises(SystemExit, match="failed: mixed-class"):
        grid_all.main(argv)
    assert (tmp_path / "mixed-class.log").read_text().strip() == "boom"
    text = (tmp_path / "index.md").read_text()
    assert "| multi-model | – | 1 | edf |" in text and "Failed (see `<scenario>.log`): mixed-class." in text
    assert not (tmp_path / "maestro-paper.log").exists()  # not among --scenarios


def test_an_unknown_scenario_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        grid_all.main(["--scenarios", "multi-model,mars-swe"])
    assert "unknown mars-swe; known: mixed-class" in capsys.readouterr().err
