"""DVC stage `evaluate`: the model beside its baselines on the held-out test split.

Writes metrics.json (DVC metrics), per-app / per-role breakdowns, CSVs for `dvc plots` and PNGs
(calibration curve, predicted vs actual, error by role) that `register` also logs to MLflow.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.metrics import (VERDICTS, baseline_predictions, grouped_quality, quality, ratio, target_checks,
                               target_ratios)
from pipelines.plots import write_plots
from pipelines.predictor import Predictor


def model_predictions(predictor: Predictor, X: pd.DataFrame, labels: pd.DataFrame, rho: float) -> dict:
    out = predictor.model.predict(X)
    frame = labels[["tokens", "is_tool", "role", "app"]].assign(
        p_tool=out["p_tool"], tokens_pred=out["tokens_pred"], tokens_reserve=out["tokens_reserve"])
    return {"model": frame, "model_rho_reserve": frame.assign(tokens_reserve=frame["tokens_pred"] * (1 + rho))}


def evaluate(predictor: Predictor, X_train, train_labels, X_test, test_labels) -> tuple[dict, dict, dict]:
    rho = predictor.model.config.rho
    frames = model_predictions(predictor, X_test, test_labels, rho)
    frames.update(baseline_predictions(train_labels, test_labels, X_train, X_test, rho, predictor.model.config.alpha))
    scores = {name: quality(frame) for name, frame in frames.items()}
    model = scores["model"]
    ratios = {**target_ratios(model, scores),
              "mae_vs_single_stage": ratio(model["mae"], scores["single_stage"]["mae"])}
    metrics = {"model": model, "ratios": ratios, "baselines": {k: v for k, v in scores.items() if k != "model"}}
    breakdown = {by: {"model": grouped_quality(frames["model"], by), "role_median": grouped_quality(frames["role_median"], by)}
                 for by in ("app", "role")}
    return metrics, breakdown, frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="models/predictor")
    parser.add_argument("--features", default="data/features")
    parser.add_argument("--metrics", default="metrics.json")
    parser.add_argument("--out", default="data/eval")
    args = parser.parse_args()
    features, out = Path(args.features), Path(args.out)
    read = lambda name: pd.read_parquet(features / name)
    predictor = Predictor.load(args.model)
    if predictor.model is None:
        raise SystemExit("the trained predictor has no model (too few stages): nothing to evaluate")
    metrics, breakdown, frames = evaluate(predictor, read("train_X.parquet"), read("train_labels.parquet"),
                                          read("test_X.parquet"), read("test_labels.parquet"))
    out.mkdir(parents=True, exist_ok=True)
    Path(args.metrics).write_text(json.dumps(metrics, indent=1))
    (out / "breakdown.json").write_text(json.dumps(breakdown, indent=1))
    write_plots(frames, out)
    m, r = metrics["model"], metrics["ratios"]
    print(f"AUC {m['auc']}  MAE {m['mae']:.1f} ({r['mae_vs_role_median']}× role median)  τ {m['kendall_tau']:.3f}  "
          f"above reserve {m['under_rate']:.3f}  over-reservation {m['over_reservation']:.3f} "
          f"({r['over_reservation_vs_role_p90']}× role p90, {r['over_reservation_vs_role_conformal']}× the per-role "
          f"conformal level at the same α)")
    print("targets on this test split: " + ", ".join(f"{metric} {VERDICTS[ok]}"
                                                     for metric, ok in target_checks(m, r).items()))


if __name__ == "__main__":
    main()
