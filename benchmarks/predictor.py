"""Predictor benchmark: Maestro's recipe against the straightforward one, measured in the same run.

Straightforward recipe (the seed paper, as first implemented): MiniLM on the whole prompt
(max_seq_length 256) → PCA 32 + the basic structural features → calibrated LightGBM classifier →
asymmetric LightGBM regressor, reserve = prediction × (1+ρ). Maestro's recipe: params.yaml.

Measures training time, single-stage predict latency (p50/p99, cold and with warm caches),
batched throughput, and quality on held-out workflows of the real dev traces (grouped splits,
several seeds) beside the per-role baselines: median, p90, and the per-role conformal level that
promises the same miss rate as the model's reserve. Writes JSON.

    python benchmarks/predictor.py [--traces FILE] [--splits 5] [--out benchmarks/results/predictor.json]
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.contract import StageTrace, read_traces
from pipelines.embedding import EmbedderConfig
from pipelines.featurize import featurizer_config, grouped_split
from pipelines.metrics import grouped_quality, quality, role_baselines, target_ratios
from pipelines.params import load_params
from pipelines.predictor import Predictor, label_frame
from pipelines.train import model_config

REPO = Path(__file__).resolve().parent.parent
DEV_TRACES = REPO.parent / "shared" / "data" / "dev-traces" / "dev_traces.jsonl"


def recipes() -> dict:
    params = REPO / "params.yaml"
    ours = (featurizer_config(load_params("featurize", params)), model_config(load_params("train", params)))
    plain_features = replace(ours[0], feature_set="basic", embedder=EmbedderConfig(tail_chars=0, max_seq_length=256))
    seed_recipe = replace(ours[1], reserve_method="rho", calibration="isotonic")
    return {"maestro": ours, "straightforward": (plain_features, seed_recipe)}


def predictions_frame(predictor: Predictor, test: list[StageTrace]) -> pd.DataFrame:
    answers = predictor.predict(test)
    return label_frame(test).assign(**{k: [getattr(a, k) for a in answers]
                                       for k in ("p_tool", "tokens_pred", "tokens_reserve")})


def throughput(predictor: Predictor, test: list[StageTrace], passes: int = 3) -> tuple[float, pd.DataFrame]:
    """Stages per second of one batched predict from a cold embedding cache: the median of `passes`
    passes (one pass swings ±20 % on a shared 2-core machine), and the predictions."""
    rates = []
    for _ in range(passes):
        predictor.featurizer.embedder.clear_cache()
        started = time.perf_counter()
        frame = predictions_frame(predictor, test)
        rates.append(len(test) / (time.perf_counter() - started))
    return round(float(np.median(rates)), 1), frame


def latency_ms(predictor: Predictor, stages: list[StageTrace]) -> dict:
    def run() -> np.ndarray:
        times = []
        for stage in stages:
            start = time.perf_counter()
            predictor.predict([stage])
            times.append((time.perf_counter() - start) * 1000)
        return np.array(times)

    cold, warm = run(), run()  # second pass: every prompt's embedding is cached
    pct = lambda a: {"p50": round(float(np.percentile(a, 50)), 2), "p99": round(float(np.percentile(a, 99)), 2)}
    return {"cold": pct(cold), "warm": pct(warm)}


def one_split(stages: list[StageTrace], seed: int, measure_speed: bool) -> dict:
    train_idx, test_idx = grouped_split(stages, 0.25, seed)
    train, test = [stages[i] for i in train_idx], [stages[i] for i in test_idx]
    out = {"quality": {}, "quality_by_app": {}, "train_s": {}, "throughput_stages_per_s": {}, "latency_ms": {}}
    for name, (feat, model) in recipes().items():
        started = time.perf_counter()
        predictor = Predictor.train(train, feat, model)
        out["train_s"][name] = round(time.perf_counter() - started, 2)
        out["throughput_stages_per_s"][name], frame = throughput(predictor, test)
        out["quality"][name] = quality(frame)
        out["quality_by_app"][name] = grouped_quality(frame, "app")
        if measure_speed:
            predictor.featurizer.embedder.clear_cache()
            out["latency_ms"][name] = latency_ms(predictor, test[:200])
    config = recipes()["maestro"][1]
    for name, frame in role_baselines(label_frame(train), label_frame(test), config.rho, config.alpha).items():
        out["quality"][name] = quality(frame)
        out["quality_by_app"][name] = grouped_quality(frame, "app")
    return out


def _mean(values: list, digits: int) -> float | None:
    """Mean of the values that are not None; None (not NaN, which is invalid JSON) where none is."""
    values = [v for v in values if v is not None]
    return round(float(np.mean(values)), digits) if values else None


def summarise(splits: list[dict]) -> dict:
    table = {name: {m: _mean([s["quality"][name][m] for s in splits], 4)
                    for m in ("auc", "ece", "mae", "kendall_tau", "under_rate", "over_reservation", "r2_log")}
             for name in splits[0]["quality"]}
    ours, median, p90, plain = (table[k] for k in ("maestro", "role_median", "role_p90", "straightforward"))
    return {"quality_mean_over_splits": table, "ratios": {
        "mae_vs_role_median": round(ours["mae"] / median["mae"], 3),
        "mae_vs_straightforward": round(ours["mae"] / plain["mae"], 3),
        "over_reservation_vs_role_p90": round(ours["over_reservation"] / p90["over_reservation"], 3),
        "over_reservation_vs_role_conformal": round(ours["over_reservation"] / table["role_conformal"]["over_reservation"], 3),
        "throughput_vs_straightforward": round(float(np.mean([s["throughput_stages_per_s"]["maestro"] /
                                                              s["throughput_stages_per_s"]["straightforward"]
                                                              for s in splits])), 2),
        "train_time_vs_straightforward": round(float(np.mean([s["train_s"]["maestro"] / s["train_s"]["straightforward"]
                                                              for s in splits])), 2)},
        "by_app_mean_over_splits": by_app(splits)}


def by_app(splits: list[dict]) -> dict:
    """The issue's target figures per app (the held-out workflows of one app differ from the whole mix),
    each the mean over the splits of that split's value; AUC is None for an app without tool calls."""
    mean = lambda values: _mean(values, 3)
    apps = sorted(set.intersection(*(set(s["quality_by_app"]["maestro"]) for s in splits)))
    table = {}
    for app in apps:
        per = [{name: s["quality_by_app"][name][app] for name in s["quality_by_app"]} for s in splits]
        ratios = [target_ratios(q["maestro"], q) for q in per]
        table[app] = {
            "stages_per_split": mean([q["maestro"]["n"] for q in per]),
            "auc": mean([q["maestro"]["auc"] for q in per]),
            "kendall_tau": mean([q["maestro"]["kendall_tau"] for q in per]),
            "mae_vs_role_median": mean([r["mae_vs_role_median"] for r in ratios]),
            "under_rate": mean([q["maestro"]["under_rate"] for q in per]),
            "role_p90_under_rate": mean([q["role_p90"]["under_rate"] for q in per]),
            "over_reservation_vs_role_p90": mean([r["over_reservation_vs_role_p90"] for r in ratios]),
        }
    return table


def split_arguments(description: str, result_name: str) -> argparse.Namespace:
    """--traces (the dev traces), --splits (grouped splits, 5) and --out (benchmarks/results/<result_name>),
    for the benchmarks that train on grouped splits of a trace file."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=str(DEV_TRACES))
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / result_name))
    return parser.parse_args()


def main() -> None:
    args = split_arguments(__doc__, "predictor.json")
    stages = read_traces(args.traces).stages
    splits = [one_split(stages, seed, measure_speed=seed == 0) for seed in range(args.splits)]
    result = {"traces": args.traces, "stages": len(stages), **summarise(splits), "splits": splits}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("quality_mean_over_splits", "ratios", "by_app_mean_over_splits")}, indent=1))
    print(json.dumps(splits[0]["latency_ms"], indent=1))


if __name__ == "__main__":
    main()
