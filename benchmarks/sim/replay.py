r"""Replayed real workflows across loads: the baselines, and Maestro fed predictions of every quality.

Legacy: its SLOs are computed from the replayed workflows' own true lengths and its predictions are made up front;
serving claims are measured by `python -m benchmarks.referee` (no future, the same information for every arm).

    .venv/bin/python -m benchmarks.sim.replay [--rates auto | 3,4,5] [--slo scaled,scaled-app] \
        [--arms oracle,model,noise0.25,noise0.5,noise1,prior,none] [--baselines fcfs,edf,srtf] \
        [--out benchmarks/results/sim_replay.json] [--retrain]

The real traces (../shared/data dev-traces and agent-traces) are split by task: `maestro train` learns on 70 % of
the tasks, and the other 30 % are replayed (cycled to `--workflows`) on 8 `maestro-paper` nodes, the trace models
spread over the placement (MODEL_MAP). Each baseline runs once per (SLO definition, rate): none reads a prediction.
Maestro runs once per prediction arm: true lengths (`oracle`), the trained model (`model`), true × lognormal noise of
σ (`noiseσ`), the model's per-role priors (`prior`: median, (1−α) quantile) and no prediction (`none`: one constant
for every stage). Each arm's Kendall τ and MAE against the true lengths are reported beside its outcomes.

`--rates auto` picks the rates from the workload's own capacity: where EDF attains ≈ 0.99, 0.9, 0.5 and 0.3 of its
SLOs under the `scaled` definition (bisection on the arrival rate). Writes the JSON, a Markdown table and plots next
to `--out`.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau
from tqdm import tqdm

from maestro.contract import read_traces, write_jsonl
from pipelines.featurize import grouped_split
from serving.core.systems import get_system
from serving.sim.engine import Simulator
from serving.sim.predictions import PredictionConfig, annotate
from serving.sim.runner import RunConfig, build_workload
from serving.sim.scenarios import Scenario, get_scenario
from serving.sim.slo import SLOConfig
from serving.sim.workload import SimWorkflow, reset

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
TRACES = [SHARED / "dev-traces" / "dev_traces.jsonl", *sorted((SHARED / "agent-traces").glob("*.jsonl"))]
MODEL_MAP = {  # trace model -> cost profile: each large family on its own placed model
    "gpt-4.1": "llama-3-8b",
    "gpt-4.1-2025-04-14": "llama-3-8b",
    "gpt-4.1-mini": "llama-3-8b",
    "ft:gpt-4.1-2025-04-14:sierra:tau2-full-sft:BzrYdMNm": "qwen2-7b",
    "gpt-4o": "mistral-7b",
    "claude-opus-4-6": "qwen2.5-coder-32b",
    "ModelType.GPT_3_5_TURBO": "qwen2-72b",
    "ModelType.GPT_3_5_TURBO_NEW": "qwen2-72b",
}
EDF_TARGETS = (0.99, 0.9, 0.5, 0.3)
SUMMARY_KEYS = (
    "slo_attainment",
    "e2e_s",
    "oom_rate",
    "kv_reserved_frac_vs_maxlen",
    "queue_nonempty_at_ready",
    "num_demoted",
    "num_refused_by_batch_cost",
    "num_preemptions",
    "num_abandoned",
    "rejected_rate",
)


def split(work: Path, test_fraction: float, seed: int) -> tuple[Path, Path]:
    """Write train.jsonl and replay.jsonl: no task on both sides."""
    stages = [s for path in TRACES for s in read_traces(path).stages]
    train_idx, replay_idx = grouped_split(stages, test_fraction, seed)
    train, replay = work / "train.jsonl", work / "replay.jsonl"
    write_jsonl((stages[i] for i in train_idx), train)
    write_jsonl((stages[i] for i in replay_idx), replay)
    return train, replay


def arm_config(arm: str, model_dir: Path, seed: int) -> PredictionConfig:
    if arm.startswith("noise"):
        return PredictionConfig(source="noise", sigma=float(arm[len("noise") :]), seed=seed)
    return PredictionConfig(source=arm, model_dir=str(model_dir) if arm in ("model", "prior") else None, seed=seed)


class Replay:
    """One replayed workload: its workflows at any rate and SLO definition, and each arm's predictions (made once)."""

    def __init__(self, replay: Path, model_dir: Path, args: argparse.Namespace):
        self.scenario: Scenario = get_scenario("maestro-paper", args.nodes)
        self.scenario.cluster.show_progress = False
        self.replay, self.model_dir, self.args = replay, model_dir, args
        self.predictions: dict[str, dict[tuple[str, str], tuple[int, int]]] = {}

    def workload(self, rate: float, slo: str) -> list[SimWorkflow]:
        run = RunConfig(
            policies=("edf",),
            seed=self.args.seed,
            num_workflows=self.args.workflows,
            rate_per_s=rate,
            traces=str(self.replay),
            model_map=MODEL_MAP,
            predictions=PredictionConfig(source="none"),
            slo=SLOConfig(mode=slo),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unmapped trace models run as the default model (named once per run)
            return build_workload(self.scenario, run, self.scenario.regimes[0])

    def predict(self, arm: str, workflows: list[SimWorkflow]) -> None:
        """Set every stage's prediction from `arm` (computed on the first call, reused at every rate)."""
        if arm not in self.predictions:
            annotate(workflows, arm_config(arm, self.model_dir, self.args.seed))
            self.predictions[arm] = {(w.workflow_id, s.stage_id): s.size for w in workflows for s in w.stages}
        for workflow in workflows:
            for stage in workflow.stages:
                stage.size = self.predictions[arm][workflow.workflow_id, stage.stage_id]

    def run(self, system: str, workflows: list[SimWorkflow], max_batch_seqs: int | None = None) -> dict:
        cluster = self.scenario.cluster
        if max_batch_seqs:
            cluster = replace(cluster, max_batch_seqs=max_batch_seqs)
        reset(workflows)
        started = time.perf_counter()
        summary = Simulator(cluster, get_system(system), workflows).run().summary
        return {**{k: summary[k] for k in SUMMARY_KEYS}, "wall_s": round(time.perf_counter() - started, 2)}


def quality(workflows: list[SimWorkflow]) -> dict:
    """Kendall τ and MAE of the stages' predicted against their true output tokens (each replayed stage once)."""
    seen = {
        (w.workflow_id.split("#")[0], s.stage_id): (s.tokens_pred, s.output_tokens) for w in workflows for s in w.stages
    }
    pred, true = np.array(list(seen.values()), dtype=float).T
    return {
        "kendall_tau": float(kendalltau(pred, true).statistic),
        "mae_tokens": float(np.mean(np.abs(pred - true))),
        "num_stages": len(seen),
    }


def find_rates(replay: Replay, targets=EDF_TARGETS, iterations: int = 7) -> dict[float, float]:
    """For each EDF attainment target, the arrival rate (bisected in log space) where EDF attains about that."""
    cache: dict[float, float] = {}

    def edf_slo(rate: float) -> float:
        if rate not in cache:
            cache[rate] = replay.run("edf", replay.workload(rate, "scaled"))["slo_attainment"]
        return cache[rate]

    rates, low, high = {}, 0.25, 32.0
    for target in tqdm(sorted(targets, reverse=True), desc="capacity (EDF)", unit="target"):
        lo, hi = low, high
        for _ in range(iterations):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if edf_slo(mid) > target else (lo, mid)
        rates[target] = round(math.sqrt(lo * hi), 2)
        low = lo  # a lower target lies at a higher rate
    return rates


def run_all(replay: Replay, rates: list[float], args: argparse.Namespace) -> dict:
    slos, arms, baselines = args.slo.split(","), args.arms.split(","), args.baselines.split(",")
    caps = [int(c) for c in args.baseline_caps.split(",")] if args.baseline_caps else []
    jobs = [(slo, rate) for slo in slos for rate in rates]
    results: dict = {slo: {} for slo in slos}
    qualities: dict = {}
    bar = tqdm(total=len(jobs) * (len(baselines) * (1 + len(caps)) + len(arms)), desc="replay", unit="run")
    for slo, rate in jobs:
        workflows, row = replay.workload(rate, slo), {}
        for name in baselines:
            row[name] = replay.run(name, workflows)
            for cap in caps:
                row[f"{name}@{cap}"] = replay.run(name, workflows, max_batch_seqs=cap)
            bar.update(1 + len(caps))
        for arm in arms:
            replay.predict(arm, workflows)
            qualities.setdefault(arm, quality(workflows))
            row[f"maestro[{arm}]"] = replay.run(args.system, workflows)
            bar.update(1)
        results[slo][str(rate)] = row
    bar.close()
    return {"results": results, "quality": qualities}


def table(report: dict) -> str:
    """One Markdown table per SLO definition: a row per rate, SLO attainment and p95 workflow time per system."""
    lines = []
    for slo, by_rate in report["results"].items():
        systems = list(next(iter(by_rate.values())))
        lines += [
            f"\n**SLO `{slo}`** — SLO attainment / p95 workflow time (s)\n",
            "| rate/s | " + " | ".join(systems) + " |",
            "|---" * (len(systems) + 1) + "|",
        ]
        for rate, row in by_rate.items():
            cells = [f"{row[s]['slo_attainment']:.3f} / {row[s]['e2e_s']['p95'] or 0:.0f}" for s in systems]
            lines.append(f"| {rate} | " + " | ".join(cells) + " |")
    arms = report["quality"]
    lines += ["\n| arm | Kendall τ | MAE (tokens) |", "|---|---|---|"]
    lines += [f"| {arm} | {q['kendall_tau']:.3f} | {q['mae_tokens']:.0f} |" for arm, q in arms.items()]
    return "\n".join(lines)


def plot(report: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for slo, by_rate in report["results"].items():
        fig, (ax_rate, ax_slo, ax_p95) = plt.subplots(1, 3, figsize=(16, 4.5))
        rates = [float(r) for r in by_rate]
        for system in next(iter(by_rate.values())):
            ax_rate.plot(rates, [row[system]["slo_attainment"] for row in by_rate.values()], marker="o", label=system)
        ax_rate.set(xlabel="workflow arrivals/s (8 nodes)", ylabel="SLO attainment", title=f"SLO '{slo}' by load")
        ax_rate.legend(fontsize=7)
        arms = [
            a for a in report["quality"] if report["quality"][a]["kendall_tau"] == report["quality"][a]["kendall_tau"]
        ]
        taus = [report["quality"][a]["kendall_tau"] for a in arms]
        for rate, row in by_rate.items():
            order = np.argsort(taus)
            xs = [taus[i] for i in order]
            ax_slo.plot(
                xs, [row[f"maestro[{arms[i]}]"]["slo_attainment"] for i in order], marker="o", label=f"{rate}/s"
            )
            ax_p95.plot(xs, [row[f"maestro[{arms[i]}]"]["e2e_s"]["p95"] for i in order], marker="o", label=f"{rate}/s")
        for i, arm in enumerate(arms):
            ax_slo.annotate(arm, (taus[i], ax_slo.get_ylim()[0]), fontsize=6, rotation=90, va="bottom")
        ax_slo.set(xlabel="prediction Kendall τ", ylabel="Maestro SLO attainment", title="value of prediction")
        ax_p95.set(xlabel="prediction Kendall τ", ylabel="Maestro p95 workflow time (s)", title="value of prediction")
        ax_slo.legend(fontsize=7)
        fig.tight_layout()
        path = out.with_name(f"{out.stem}_{slo}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--workflows", type=int, default=1600, help="replayed workflows (the 30 %% side, cycled)")
    parser.add_argument("--rates", default="auto", help="comma-separated arrivals/s, or auto (EDF ≈ 0.99/0.9/0.5/0.3)")
    parser.add_argument("--slo", default="scaled,scaled-app", help="SLO definitions (serving/sim/slo.py)")
    parser.add_argument("--arms", default="oracle,model,noise0.25,noise0.5,noise1,prior,none")
    parser.add_argument("--baselines", default="fcfs,edf,srtf")
    parser.add_argument("--baseline-caps", default="", help="also run each baseline with these max_batch_seqs caps")
    parser.add_argument("--system", default="maestro", help="the system fed each prediction arm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/sim_replay.json")
    parser.add_argument(
        "--work", default="benchmarks/results/sim_replay", help="split and model (the model is reused unless --retrain)"
    )
    parser.add_argument("--retrain", action="store_true", help="train even if the model directory exists")
    args = parser.parse_args()
    out, work = Path(args.out), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    train, replay_path = split(work, 0.3, args.seed)
    model_dir = work / "model"
    if args.retrain or not model_dir.exists():
        from maestro.cli import main as maestro

        maestro(["train", "--traces", str(train), "--out", str(model_dir)])
    replay = Replay(replay_path, model_dir, args)
    started = time.perf_counter()
    found = find_rates(replay) if args.rates == "auto" else {}
    rates = sorted(found.values()) if found else [float(r) for r in args.rates.split(",")]
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "nodes": args.nodes,
        "workflows": args.workflows,
        "seed": args.seed,
        "system": args.system,
        "rates": rates,
        "edf_targets": {str(k): v for k, v in found.items()},
        **run_all(replay, rates, args),
        "wall_s": None,
    }
    report["wall_s"] = round(time.perf_counter() - started, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    text = table(report)
    out.with_suffix(".md").write_text(text + "\n")
    paths = plot(report, out)
    print(text)
    print("wrote " + ", ".join(str(p) for p in [out, out.with_suffix(".md"), *paths]))


if __name__ == "__main__":
    main()
