r"""The referee: replay held-out workflows under SLOs a live system can know, every arm with the same information.

    python -m benchmarks.referee [--train TRAIN.jsonl --test TEST.jsonl | --traces FILE --folds K | --folds family]
        [--scenario maestro-paper|mars-swe|... [--regime medium|long]] [--cost fitted|datasheet] [--model DIR] \
        [--rates auto|R1,R2,...] [--seeds 3] [--arms fcfs,edf,vllm,vllm-edf,...] [--side dev|locked] [--json OUT] \
        [--compare-model DIR2 --arms ...,maestro[model],maestro[model@compare]]

Without --train/--test it splits ../shared/data's real traces by task: 70 % train, the rest halved into `dev` (choose
policies here) and `locked` (report once per change). It trains the predictor on the train side with `maestro train` (or
reads --model), fixes one SLO per (app, class) = --slo-scale × the median unloaded latency of that app's training
workflows, and replays the test side's workflows on --nodes simulated nodes (the scenario's) at each rate for seeds
0..N−1 (arrivals, workflow order, tool times); --scenario names the cluster and prepares every workflow
(`serving.sim.scenarios`; its extra baselines join the default arms). Predictions are made when a stage becomes ready,
from its finished ancestors only; nothing reads a future stage or a true length outside the oracle arm
(tests/benchmarks/test_referee_leaks.py). Rates `auto`: where EDF attains ≈ 0.99 / 0.9 / 0.7 / 0.5 of the ceiling (seed
0): light, knee, past, heavy. `--folds family` replays each app family with the predictor trained on the others
(`sides.FAMILIES`) and its apps' SLOs declared from a calibration pilot of its own tasks, never replayed (`folds`);
every fold goes in `folds`, and the top-level figures pool the folds by rate index (each fold finds its own rates), over
every fold's workflows.
With --compare-model, maestro[model@compare] is Maestro fed that second predictor, paired with maestro[model].

Writes OUT (JSON: scenario, regime, cost, slo, rates, rates_found_by, variants_tried, tool_times,
results.<rate>.{ceiling, <arm>}, differences.<rate>, counters.<rate>.<arm>, folds[*] with split, sides, slo_source and
model, model_answers_sha256, pooled), OUT.md and OUT.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.referee import folds, report
from benchmarks.referee.arms import DEFAULT_ARMS, SYSTEM_ARMS, parse_arms
from benchmarks.referee.grid import RATES_FOUND_BY, Replay, find_rates, run_grid
from benchmarks.referee.sides import (
    DEFAULT_TRACES,
    SIDES,
    Split,
    family_splits,
    fold_splits,
    read_all,
    side_split,
    split_model,
)
from benchmarks.referee.stats import mean_counters, summarize
from maestro.contract import read_traces
from serving.sim.costmodel import STEP_MODELS
from serving.sim.scenarios import SCENARIOS, get_scenario

# Policy variants tried on this referee (dev side) since it was built: raise it with every variant you try, and report
# it beside the figures (serving/EXPERIMENTS.md lists them). Adding a baseline arm is not a variant.
# 8: the triage variants of 2026-12-03 (serving/EXPERIMENTS.md); the slack order before them was run with 0.
# 9: the learned progressive re-prediction of 2026-12-03 (ablation `parametric`).
# 16: seven probes of what decides triage (capacity scale ×0.8 and ×1.25, a random shed, the upper quantile's
# work, first-stage-only sheds, sheds past the third stage only, SRPT among kept workflows; serving/EXPERIMENTS.md,
# 2026-12-03), none adopted.
# 22: six triage variants of 2026-12-04 on cross-family splits and the dev side (serving/EXPERIMENTS.md):
# past-deadline shedding whatever the load / only while saturated / while saturated or past the callers' patience
# (adopted); saturation read from stretch with a seeded capacity, the ready-stage check at the pool's stretch, and
# stretch-only windows that only raise the capacity (all three left off).
# 23: 2026-12-05, the batch-cost gate holding batch work only (interactive candidates always admitted), tried on the
# dev side in mixed-class (adopted; serving/EXPERIMENTS.md).
# 24: 2026-12-05, the same with an interactive candidate still held for the running interactive stages it would
# endanger (left off: interactive queueing p95 back to 1.1-2.9 s, SLO within 0.4 pp).
# 25: 2026-12-05, a triage capacity window stays open until it spans the longest stage it credits (adopted; dev
# side, serving/EXPERIMENTS.md).
# 32: 2026-12-05, why Maestro lost to vllm-edf at light load (dev side, serving/EXPERIMENTS.md): the ablations
# no-route, no-toolkv, no-headroom, on-demand and all four together; the fitness router's free KV read on its own
# [0, 1] scale (left off) and counting the sessions' kept tool-call KV as free (adopted).
# 35: 2026-12-05, tool time in triage (dev side, serving/EXPERIMENTS.md): the history fed service without tool time
# and the tool's wall time apart (alone), the tool time ahead moving the end a workflow's pool work must meet, and
# the ready stage's alone test with that tool time after it (adopted, with both before it).
# 36 (+1): 2026-12-05, the batch-cost gate judging a running stage on its predicted rest, not on the low bound mirrored
# from its reserve (adopted; dev side, mars-swe and maestro-paper, serving/EXPERIMENTS.md). The per-use arms
# (maestro[S/OTHER-USE]) and the scratch splits of the reserve's readers are measurement, not counted.
# 50 (+14): 2026-12-05, heavy mixed overload (dev side, serving/EXPERIMENTS.md): the capacity seeded from the stretch,
# the stage rule and the workflow at the pool's pace (two ways), one deadline order for both classes, a stage demoted
# once its workflow's latest start passed, late stages behind on-time ones of both classes (adopted); the ablations no-
# reject, no-gate, no-order, on-demand, no-toolkv, no-route, no-headroom; 51 (+1): multi-model, the capacity floored at
# the best rate a window showed.
# 54 (+3): 2026-12-05, the router and the tool calls' host CPU (dev side, docs/routing.md): T_ready plus the tool work
# per core queued or in service on the node's host (left off: moved mars-swe), plus the wait a tool call handed over
# now would see (adopted), and a session leaving a home whose host queue is 5 s longer than another's (left off).
# 59 (+5): 2026-12-05, the class order in heavy mixed overload (dev side, docs/triage.md): least slack across classes,
# batch first when its head would otherwise miss (with and without "can still make it"), interactive first within its
# share of the queued work, batch first by an earlier deadline while it can still make it; none adopted.
# 60 (+1): 2026-12-05, mars-swe long, where the model's reserve may cost (dev side, docs/scenarios.md): a released
# stage's prefix-cache entry sized by its written context, not its unused reserve; not adopted. The splits of the
# reserve's readers (KV map, router) are measurement, not counted.
# 63 (+3): 2026-12-05, the batch-cost gate's reading of a running stage (dev side, serving/EXPERIMENTS.md): a running
# stage blocks only while it meets its deadline at the measured pace; its slack at the low bound mirrored from its
# reserve; a candidate held only if its slack covers waiting until the last stage it endangers ends (kept as an option,
# BatchCostConfig.hold_while).
# 66 (+3): 2026-12-05, which candidate that cannot outwait the stages it endangers goes in (dev side,
# serving/EXPERIMENTS.md): only where every stage it endangers is behind at the measured pace; only where its workflow
# could still make its deadline after it; only on a node running interactive work (adopted, hold_while="by_class").
# 73 (+7): 2026-12-05, triage turning away workflows stock vLLM meets (dev side and the tau2-retail / chatdev folds,
# serving/EXPERIMENTS.md): Moore–Hodgson leaving out workflows that cannot end alone / past their pool deadline, the
# alone test without the tool time ahead, the pool charged its model's share of the remaining work, no Moore–Hodgson,
# the capacity × 1.5, and a pool backlogged only while a stage of its own model waits (adopted).
# 81 (+8): 2026-12-05, docs/folds.md: a NEW_APP reserve at the app's own conformal level (adopted); the router's host
# wait less the stage's service (reverted), less the GPU wait too; five router terms zeroed on retail (diagnostics).
# 194–232: 2026-12-06 (serving/EXPERIMENTS.md): tool-KV rules, triage, AIMD, tool pool, scale-out, its length, loads;
# 243: 2026-12-06 (midnight), a replica beside a full fleet's only copies: 9 rules, the hold and the cold route; +2.
VARIANTS_TRIED = 243  # to 2026-12-06 (serving/EXPERIMENTS.md): +31 router, +5 remaining, +47 mixed, +19 capacity
DEFAULT_REGIME = "long"  # for a scenario with several context regimes (mars-swe: medium | long)


def pairs(arms: list[str]) -> list[tuple[str, str]]:
    """The differences reported: Maestro's arms and edf+admission against max-len EDF and stock vLLM (deadline order,
    FCFS), the prediction sources against each other, each source against its variants (`maestro[S]` − its
    `maestro[S/...]`), and the model against a scenario's extra baselines."""
    challengers = [a for a in arms if a.startswith("maestro[") or a == "edf+admission"]
    out = [(a, base) for base in ("edf", "vllm-edf", "vllm") for a in challengers]
    out += [
        ("vllm-edf", "edf"),
        ("maestro[model]", "maestro[none]"),
        ("maestro[model]", "maestro[prior]"),
        ("maestro[oracle]", "maestro[none]"),
        ("maestro[oracle]", "maestro[model]"),
    ]
    out += [("maestro[model]", a) for a in arms if a.startswith("maestro[model/") or a.startswith("maestro[model@")]
    out += [  # another source's variants against that source's own arm
        (base, a)
        for a in arms
        if "/" in a and not a.startswith("maestro[model/") and (base := a.split("/")[0] + "]") in arms
    ]
    out += [("maestro[model]", a) for a in arms if a in SYSTEM_ARMS]
    return out


def figures(grid: dict[str, dict[str, list]], names: list[str], ceiling: float) -> dict:
    """Per rate: every arm's figures with intervals, the differences of `pairs`, the mean counters over seeds."""
    results, differences, counters = {}, {}, {}
    for rate, by_arm in grid.items():
        results[rate], differences[rate] = summarize(by_arm, pairs(names))
        results[rate]["ceiling"] = ceiling
        counters[rate] = {arm: mean_counters(runs) for arm, runs in by_arm.items()}
    return {"results": results, "differences": differences, "counters": counters}


def judge(split: Split, args: argparse.Namespace, work: Path) -> tuple[dict, dict]:
    """One split replayed: its JSON figures and its grid (`grid[rate][arm][seed]`, for pooling folds)."""
    model_dir = Path(args.model) if args.model else None
    arms = parse_arms(args.arms)
    if model_dir is None and any(a.needs_model for a in arms):
        model_dir = split_model(split, work, args.retrain)
    compare_dir = Path(args.compare_model) if args.compare_model else None
    replay = Replay(
        split.train,
        split.test,
        model_dir,
        args.nodes,
        args.workflows,
        args.slo_scale,
        compare_dir=compare_dir,
        scenario_name=args.scenario,
        regime=args.regime,
        step_model=args.step_model,
        calibration=split.calibration,
    )
    ceilings = [replay.ceiling(seed) for seed in range(args.seeds)]
    rates = find_rates(replay, ceilings[0]) if args.rates == "auto" else [float(r) for r in args.rates.split(",")]
    grid = run_grid(replay, arms, rates, args.seeds)
    run = {
        "split": split.name,
        "sides": folds.sides_record(split),
        "slo": replay.slo.to_json(),
        "slo_source": folds.slo_source(split),
        "rates": rates,
        **figures(grid, [a.name for a in arms], round(float(np.mean(ceilings)), 4)),
        "tool_times": replay.tool_times.to_json(),
        "num_test_workflows": len(replay.base),
        "model": str(model_dir) if model_dir else None,
        "model_answers_sha256": replay.source("model", 0).answers_sha256() if model_dir else None,  # which answered
        "compare_model": str(compare_dir) if compare_dir else None,
    }
    return run, grid


def pooled(runs: list[dict], grids: list[dict], args: argparse.Namespace) -> dict:
    names = [a.name for a in parse_arms(args.arms)]
    keys = None if args.rates == "auto" else list(grids[0])
    return folds.pooled(runs, grids, keys, lambda grid, ceiling: figures(grid, names, ceiling), args.slo_scale)


def folds_arg(text: str) -> int | str:
    if text == "family":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--folds takes a number of task folds (>= 2) or 'family', got '{text}'"
        ) from None


def splits_of(args: argparse.Namespace) -> list[Split]:
    if args.train:
        return [Split("given", read_traces(args.train).stages, read_traces(args.test).stages)]
    if args.folds == "family":
        return family_splits(read_all(args.traces.split(",") if args.traces else DEFAULT_TRACES))
    if args.folds:
        return fold_splits(read_all([args.traces]), args.folds)
    return [side_split(read_all(DEFAULT_TRACES), args.side)]


def parser_of() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--engine", action="store_true", help="replay on vLLM-CPU instead: --engine --help")
    add("--train", help="labelled stages to train on and fix the SLOs from")
    add("--test", help="labelled stages to replay (no task in common with --train)")
    add(
        "--traces", help="with --folds K: one file split into K task folds; with --folds family: files, comma-separated"
    )
    add("--folds", type=folds_arg, default=0, help="K task folds, or 'family': leave one app family out")
    add("--scenario", default="maestro-paper", help=f"the cluster and workload preparation: {', '.join(SCENARIOS)}")
    add("--regime", help=f"the scenario's context regime, where it has several (default {DEFAULT_REGIME})")
    add("--cost", default="fitted", choices=STEP_MODELS, help="the cost model's step pricing")
    add("--model", help="a trained predictor directory (default: train one on the train side)")
    add(
        "--compare-model",
        help="a second trained predictor, fed to the arm maestro[model@compare] "
        "(its difference from maestro[model] is reported, paired on the same workloads)",
    )
    add("--side", default="dev", choices=SIDES, help="which half of the held-out tasks to replay")
    add("--rates", default="auto")
    add("--seeds", type=int, default=3)
    add("--arms", help="comma-separated (default: the standard arms and the scenario's extra baselines)")
    add("--nodes", type=int, default=8)
    add("--workflows", type=int, default=1600)
    add("--slo-scale", type=float, default=5.0)
    add("--work", default="benchmarks/results/referee", help="splits and models")
    add("--retrain", action="store_true")
    add("--json", default="benchmarks/results/referee.json")
    return parser


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options that do not go together, a scenario or regime unknown; fills the scenario's arms, regime and cost."""
    if bool(args.train) != bool(args.test):
        parser.error("--train and --test go together")
    if isinstance(args.folds, int) and args.folds and not args.traces:
        parser.error("--folds K needs --traces")
    if args.folds and args.model:
        parser.error("--model with --folds: that predictor saw every fold; leave --model out to train one per fold")
    try:
        scenario = get_scenario(args.scenario, args.nodes, regime=args.regime)
    except ValueError as error:
        parser.error(str(error))
    if args.regime is None and len(scenario.regimes) > 1:
        args.regime = DEFAULT_REGIME
        get_scenario(args.scenario, args.nodes, regime=args.regime)
    if args.arms is None:
        args.arms = ",".join(dict.fromkeys(DEFAULT_ARMS + tuple(scenario.referee_arms)))
    if not args.compare_model and any(a.needs_compare_model for a in parse_arms(args.arms)):
        parser.error("the arm maestro[model@compare] needs --compare-model DIR (a second trained predictor)")
    args.step_model = args.cost


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--engine" in argv:  # the engine-replay mode has options of its own (benchmarks/referee/engine.py)
        from benchmarks.referee import engine

        engine.main([a for a in argv if a != "--engine"])
        return
    parser = parser_of()
    args = parser.parse_args(argv)
    check(parser, args)
    started = time.perf_counter()
    splits = splits_of(args)
    judged = [judge(split, args, Path(args.work)) for split in splits]
    runs, grids = [run for run, _ in judged], [grid for _, grid in judged]
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "side": args.side if not (args.train or args.folds) else "given" if args.train else f"folds-{args.folds}",
        "scenario": args.scenario,
        "regime": args.regime,
        "cost": args.cost,
        "seeds": args.seeds,
        "nodes": args.nodes,
        "workflows": args.workflows,
        "rates_found_by": RATES_FOUND_BY if args.rates == "auto" else None,
        "variants_tried": VARIANTS_TRIED,
        **(pooled(runs, grids, args) if args.folds else runs[0]),
        "folds": runs if args.folds else [],
    }
    out["wall_s"] = round(time.perf_counter() - started, 1)
    paths = report.write(out, Path(args.json))
    print("wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
