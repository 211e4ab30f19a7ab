"""DVC stage `evaluate`: the model beside its baselines on the held-out test split, with and without history.

Writes metrics.json (DVC metrics: the headline figures the targets name, per condition, the workflow model's under
`workflow`), the detail (every metric, the baselines, per-app / per-role breakdowns) to metrics_detail.json, CSVs
for `dvc plots` and PNGs (calibration curve, predicted vs actual, error by role, reserve trade-off) that `register`
also logs to MLflow. What is measured, and how: pipelines/evaluate.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from pipelines.evaluate import add_workflow, evaluate
from pipelines.metrics import VERDICTS, target_checks
from pipelines.plots import write_plots
from pipelines.predictor import Predictor


def print_summary(metrics: dict, detail: dict) -> None:
    """Each condition's figures, the targets met or missed, and the workflow model's headline."""
    for name, d in detail.items():
        m, r = d["model"], d["ratios"]
        print(
            f"{name}: AUC {m['auc']}  MAE {m['mae']:.1f} ({r['mae_vs_role_median']}× role median)  "
            f"τ {m['kendall_tau']:.3f}  above reserve {m['under_rate']:.3f}  over-reservation "
            f"{m['over_reservation']:.3f} ({r['over_reservation_vs_role_p90']}× role p90, "
            f"{r['over_reservation_vs_role_conformal']}× the per-role conformal level at the same α)"
        )
        print(
            "  targets on this test split: "
            + ", ".join(f"{metric} {VERDICTS[ok]}" for metric, ok in target_checks(m, r).items())
        )
        if "workflow" in metrics[name]:
            print("  workflow: " + ", ".join(f"{k} {v}" for k, v in metrics[name]["workflow"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="models/predictor")
    parser.add_argument("--features", default="data/features")
    parser.add_argument(
        "--traces",
        default="data/traces/collected.jsonl",
        help="the traces featurize split: the workflow model is scored on the test stages",
    )
    parser.add_argument("--metrics", default="metrics.json")
    parser.add_argument("--detail", default="data/eval/metrics_detail.json")
    parser.add_argument("--out", default="data/eval")
    args = parser.parse_args()
    features, out = Path(args.features), Path(args.out)
    read = lambda name: pd.read_parquet(features / name)
    predictor = Predictor.load(args.model)
    if predictor.model is None:
        raise SystemExit("the trained predictor has no model (too few stages): nothing to evaluate")
    train_labels, test_labels = read("train_labels.parquet"), read("test_labels.parquet")
    metrics, detail, frames = evaluate(
        predictor, read("train_X.parquet"), train_labels, read("test_X.parquet"), test_labels
    )
    add_workflow(metrics, detail, predictor, args.traces, train_labels, test_labels)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.metrics).write_text(json.dumps(metrics, indent=1))
    Path(args.detail).write_text(json.dumps(detail, indent=1))
    write_plots(frames, out)
    print_summary(metrics, detail)


if __name__ == "__main__":
    main()
