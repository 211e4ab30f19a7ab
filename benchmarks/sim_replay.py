"""Maestro's predictor in the simulator on replayed real workflows: trained model vs oracle vs noise.

    .venv/bin/python benchmarks/sim_replay.py [--nodes 8] [--workflows 1600] [--rate 5] \
        [--out benchmarks/results/sim_replay.json] [--retrain]

The real traces (../shared/data dev-traces and agent-traces) are split by task: `maestro train`
learns on 70 % of the tasks, and `maestro simulate --scenario maestro-paper --policies edf,maestro`
replays the other 30 % with Maestro's predictions from that model (`--model`), from the true
lengths (`--predictions oracle`) and from the noise model (`--predictions noise`). The trace models
are spread over the scenario's placement with --model-map (MODEL_MAP below).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from pipelines.contract import read_traces, write_jsonl
from pipelines.featurize import grouped_split

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
TRACES = [SHARED / "dev-traces" / "dev_traces.jsonl", *sorted((SHARED / "agent-traces").glob("*.jsonl"))]
MODEL_MAP = {  # trace model -> cost profile: each large family on its own placed model
    "gpt-4.1": "llama-3-8b", "gpt-4.1-2025-04-14": "llama-3-8b", "gpt-4.1-mini": "llama-3-8b",
    "ft:gpt-4.1-2025-04-14:sierra:tau2-full-sft:BzrYdMNm": "qwen2-7b", "gpt-4o": "mistral-7b",
    "claude-opus-4-6": "qwen2.5-coder-32b", "ModelType.GPT_3_5_TURBO": "qwen2-72b",
    "ModelType.GPT_3_5_TURBO_NEW": "qwen2-72b"}
ARMS = {"model": ["--model"], "oracle": ["--predictions", "oracle"], "noise": ["--predictions", "noise"]}


def maestro(*args: str) -> None:
    command = [sys.executable, "-c", "import sys; from maestro.cli import main; sys.exit(main(sys.argv[1:]))", *args]
    subprocess.run(command, check=True)


def split(work: Path, test_fraction: float, seed: int) -> tuple[Path, Path]:
    """Write train.jsonl and replay.jsonl: no task on both sides."""
    stages = [s for path in TRACES for s in read_traces(path).stages]
    train_idx, replay_idx = grouped_split(stages, test_fraction, seed)
    train, replay = work / "train.jsonl", work / "replay.jsonl"
    write_jsonl((stages[i] for i in train_idx), train)
    write_jsonl((stages[i] for i in replay_idx), replay)
    return train, replay


def simulate(arm: str, replay: Path, model_dir: Path, out: Path, args: argparse.Namespace) -> dict:
    extra = [*ARMS[arm], str(model_dir)] if arm == "model" else ARMS[arm]
    mapping = [f for name, profile in MODEL_MAP.items() for f in ("--model-map", f"{name}={profile}")]
    started = time.perf_counter()
    maestro("simulate", "--scenario", "maestro-paper", "--nodes", str(args.nodes), "--traces", str(replay),
            "--workflows", str(args.workflows), "--rate", str(args.rate), "--policies", "edf,maestro",
            "--seed", str(args.seed), "--no-progress", "--json", str(out), *mapping, *extra)
    report = json.loads(out.read_text())
    return {"wall_s": round(time.perf_counter() - started, 1), **report["results"]["default"]}


def headline(arms: dict) -> dict:
    slo = {arm: r["maestro"]["slo_attainment"] for arm, r in arms.items()}
    return {"maestro_slo": slo, "edf_slo": arms["model"]["edf"]["slo_attainment"],
            "model_minus_oracle_pp": 100 * (slo["model"] - slo["oracle"]),
            "model_minus_edf_pp": 100 * (slo["model"] - arms["model"]["edf"]["slo_attainment"]),
            "maestro_oom_rate": {arm: r["maestro"]["oom_rate"] for arm, r in arms.items()},
            "maestro_kv_vs_maxlen": {arm: r["maestro"]["kv_reserved_frac_vs_maxlen"] for arm, r in arms.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--workflows", type=int, default=1600, help="replayed workflows (the 30 %% side, cycled)")
    parser.add_argument("--rate", type=float, default=5.0, help="workflow arrivals per second, whole cluster")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/sim_replay.json")
    parser.add_argument("--work", default="benchmarks/results/sim_replay",
                        help="split, model and per-arm JSON (the model is reused unless --retrain)")
    parser.add_argument("--retrain", action="store_true", help="train even if the model directory exists")
    args = parser.parse_args()
    out, work = Path(args.out), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    train, replay = split(work, 0.3, args.seed)
    model_dir = work / "model"
    started = time.perf_counter()
    if args.retrain or not model_dir.exists():
        maestro("train", "--traces", str(train), "--out", str(model_dir))
    train_s = round(time.perf_counter() - started, 1)
    arms = {arm: simulate(arm, replay, model_dir, work / f"{arm}_rate{args.rate:g}.json", args) for arm in ARMS}
    result = {"date": time.strftime("%Y-%m-%d"), "nodes": args.nodes, "workflows": args.workflows, "rate": args.rate,
              "seed": args.seed, "traces": [str(p) for p in TRACES], "model_map": MODEL_MAP, "train_s": train_s,
              "headline": headline(arms), "arms": arms}
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["headline"], indent=2))


if __name__ == "__main__":
    main()
