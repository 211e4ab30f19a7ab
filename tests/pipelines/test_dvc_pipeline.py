"""dvc.yaml as DVC's users expect it (complete deps, metrics and plots in git), and the real `dvc repro` and
`dvc exp run` on a small synthetic sample, in a clone of this repo."""

import ast
import csv
import io
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from pipelines.register import may_promote
from tests.pipelines.clone import run

REPO = Path(__file__).resolve().parents[2]
DVC_YAML = yaml.safe_load((REPO / "dvc.yaml").read_text())
LIBRARIES = ("pipelines", "maestro")  # the folders a stage's deps name whole


def source_file(module: str) -> Path | None:
    """The file of a dotted module name in this repository (a package's __init__.py), or None."""
    base = REPO.joinpath(*module.split("."))
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)


def library_imports(module: str) -> set[str]:
    """The modules of pipelines/ and maestro/ a module imports, anywhere in it (function-level imports too)."""
    found = set()
    for node in ast.walk(ast.parse(source_file(module).read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARIES:
            named = {f"{node.module}.{alias.name}" for alias in node.names}  # `from pipelines import dask_train`
            found |= {node.module} | {m for m in named if source_file(m)}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] in LIBRARIES}
    return found


def imported_closure(module: str) -> set[str]:
    seen, todo = {module}, [module]
    while todo:
        for name in library_imports(todo.pop()) - seen:
            seen.add(name)
            todo.append(name)
    return seen


def paths(entries: list) -> list[str]:
    """A dvc.yaml list of outs/metrics/plots: plain paths or {path: options}."""
    return [e if isinstance(e, str) else next(iter(e)) for e in entries]


@pytest.mark.parametrize("name", sorted(DVC_YAML["stages"]))
def test_each_stage_runs_its_script_and_depends_on_it_and_the_folders_it_imports(name):
    stage = DVC_YAML["stages"][name]
    words = stage["cmd"].split()
    words = words[next(i for i, w in enumerate(words) if "=" not in w) :]  # after any environment settings
    assert words[:3] == ["python", "-m", f"pipelines.stages.{name}"]
    script = f"pipelines/stages/{name}.py"
    folders = {module.split(".")[0] for module in imported_closure(f"pipelines.stages.{name}")}
    missing = ({script} | folders) - set(stage["deps"])
    assert not missing, f"stage {name}: add to deps {sorted(missing)}"
    code = [d for d in stage["deps"] if d.split("/")[0] in LIBRARIES and d != script]
    assert set(code) == folders, f"stage {name}: name the library folders, not their files: {code}"


def test_metrics_and_plots_are_kept_in_git_so_experiments_carry_them():
    evaluate = DVC_YAML["stages"]["evaluate"]
    plotted = paths(DVC_YAML["plots"])
    small = paths(evaluate["metrics"]) + plotted
    assert set(plotted) <= set(paths(evaluate["outs"]))  # drawn from what evaluate writes
    assert {p for p in paths(evaluate["outs"]) if p.endswith(".png")} <= set(plotted)  # images as plots
    for entry in evaluate["metrics"] + evaluate["outs"]:
        if next(iter(entry)) in small:
            assert entry[next(iter(entry))] == {"cache": False}, entry
    ignored = subprocess.run(["git", "check-ignore", *small], cwd=REPO, capture_output=True, text=True).stdout
    assert ignored == "", f".gitignore hides what `dvc exp show` / `dvc plots diff` compare: {ignored}"


def test_register_promotes_in_dvc_repro_but_not_in_an_experiment_unless_asked():
    assert DVC_YAML["stages"]["register"]["params"][0] == "register"
    assert may_promote("auto", {}) == (True, [])
    assert not may_promote("auto", {"DVC_EXP_NAME": "exp-1"})[0]
    assert may_promote(True, {"DVC_EXP_NAME": "exp-1"}) == (True, [])
    assert not may_promote(False, {})[0]
    with pytest.raises(ValueError, match="register.promote"):
        may_promote("yes", {})


@pytest.mark.slow
def test_repro_trains_evaluates_and_registers_a_champion(reproduced):
    clone = reproduced
    metrics = json.loads((clone / "metrics.json").read_text())
    assert set(metrics) == {"with_history", "without_history"}  # the headline: one small table per condition
    for figures in metrics.values():
        assert figures["auc"] > 0.8 and figures["mae_vs_role_median"] < 1.0
        workflow = figures["workflow"]  # the workflow model, scored on the same test split
        assert set(workflow) == {
            f"{figure}_{target}{suffix}"
            for target in ("calls", "tokens")
            for figure, suffix in (("tau", ""), ("mae", "_vs_position_median"), ("above", ""), ("above", "_worst_app"))
        }
        assert workflow["tau_calls"] > 0.3 and workflow["tau_tokens"] > 0.2  # it ranks the work still to come
        assert 0 <= workflow["above_calls"] <= workflow["above_calls_worst_app"] < 0.5
    detail = json.loads((clone / "data/eval/metrics_detail.json").read_text())["with_history"]
    assert set(detail["baselines"]) == {
        "model_rho_reserve",
        "global_median",
        "role_median",
        "role_p90",
        "role_conformal",
        "single_stage",
    }
    registration = json.loads((clone / "data/eval/registration.json").read_text())
    assert str(registration["version"]) == "1" and registration["promoted"]
    for plot in (
        "calibration.png",
        "pred_vs_actual.png",
        "error_by_role.png",
        "reserve_tradeoff.png",
        "calibration.csv",
    ):
        assert (clone / "data/eval" / plot).stat().st_size > 0
    shown = run(["dvc", "metrics", "show"], clone)
    assert "without_history.above_reserve" in shown and "without_history.workflow.tau_calls" in shown
    assert set(detail["workflow"]["by_app"]) and "position_median" in detail["workflow"]["pooled"]


@pytest.mark.slow
def test_exp_runs_are_compared_and_do_not_move_the_champion(reproduced):
    clone = reproduced
    run(["dvc", "exp", "run", "-n", "alpha-02", "-S", "train.alpha=0.2"], clone)
    assert yaml.safe_load((clone / "params.yaml").read_text())["train"]["alpha"] == 0.2
    registration = json.loads((clone / "data/eval/registration.json").read_text())
    assert str(registration["version"]) == "2" and not registration["promoted"]  # register.promote: auto
    assert registration["champion_metrics_on_this_test"]["n"] > 0  # champion re-scored on this test split
    run(["dvc", "exp", "run", "-n", "rho-03", "-S", "train.rho=0.3"], clone)
    rows = list(csv.DictReader(io.StringIO(run(["dvc", "exp", "show", "--no-pager", "--csv"], clone))))
    experiments = {r["Experiment"]: r for r in rows if r["Experiment"] in ("alpha-02", "rho-03")}
    assert set(experiments) == {"alpha-02", "rho-03"}
    for row in experiments.values():  # numbers, not "!": each experiment's commit carries metrics.json
        assert float(row["with_history.auc"]) > 0.8 and float(row["without_history.above_reserve"]) >= 0
    assert experiments["alpha-02"]["train.alpha"] == "0.2" and experiments["rho-03"]["train.rho"] == "0.3"
    run(["dvc", "plots", "diff", "alpha-02", "rho-03", "-o", "plots-diff"], clone)
    page = (clone / "plots-diff" / "index.html").read_text()
    assert "reserve_tradeoff.png" in page and "Calibration of p_tool" in page
