"""The model beside its baselines on the held-out test split, in both history conditions: the test stages with their
ancestors' outcomes known ("with_history"), and with every label stripped ("without_history": what a stage sent
alone gets).

`evaluate` gives the headline (the figures the targets name, per condition), the detail (every metric, the
baselines, per-app / per-role breakdowns) and the frames the plots draw; `add_workflow` adds the workflow-level
model's figures on the test split's stages (read from the traces) in the same two conditions
(pipelines.workflow_metrics). The DVC stage that writes them to metrics.json, metrics_detail.json and the plots:
pipelines/stages/evaluate.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from maestro.contract import read_traces
from pipelines.metrics import baseline_predictions, grouped_quality, quality, ratio, target_ratios
from pipelines.new_app import model_frame
from pipelines.predictor import Predictor, select_stages
from pipelines.workflow_metrics import evaluate_workflow


def model_predictions(predictor: Predictor, X: pd.DataFrame, labels: pd.DataFrame, rho: float) -> dict:
    out = predictor.model.predict(model_frame(X))
    frame = labels[["tokens", "is_tool", "role", "app"]].assign(
        p_tool=out["p_tool"], tokens_pred=out["tokens_pred"], tokens_reserve=out["tokens_reserve"]
    )
    return {"model": frame, "model_rho_reserve": frame.assign(tokens_reserve=frame["tokens_pred"] * (1 + rho))}


CONDITIONS = {"with_history": "full", "without_history": "none"}  # metrics name → training_frame copy


def evaluate(predictor: Predictor, X_train, train_labels, X_test, test_labels) -> tuple[dict, dict, dict]:
    """(headline, detail, the with-history prediction frames for the plots), each condition scored on
    the test copies of its name; the baselines are fitted on the training stages as they are."""
    train = _copy(train_labels, "full")
    detail, plotted = {}, None
    for name, copy in CONDITIONS.items():
        test = _copy(test_labels, copy)
        if test.any():
            metrics, breakdown, frames = evaluate_condition(
                predictor, X_train[train], train_labels[train], X_test[test], test_labels[test]
            )
            detail[name] = {**metrics, "breakdown": breakdown}
            plotted = frames if plotted is None else plotted
    return {name: headline(d) for name, d in detail.items()}, detail, plotted


def _copy(labels: pd.DataFrame, copy: str) -> np.ndarray:
    """Rows of one training_frame copy; a frame without copies holds the stages as they are."""
    if "copy" in labels:
        return labels["copy"].eq(copy).to_numpy()
    return np.full(len(labels), copy == "full")


def headline(metrics: dict) -> dict:
    """The figures the targets name: the model against the per-role baselines and the single-stage model."""
    m, r = metrics["model"], metrics["ratios"]
    return {
        "auc": m["auc"],
        "kendall_tau": m["kendall_tau"],
        "mae_vs_role_median": r["mae_vs_role_median"],
        "mae_vs_single_stage": r["mae_vs_single_stage"],
        "above_reserve": m["under_rate"],
        "waste_vs_role_p90": r["over_reservation_vs_role_p90"],
    }


def evaluate_condition(predictor: Predictor, X_train, train_labels, X_test, test_labels) -> tuple[dict, dict, dict]:
    rho = predictor.model.config.rho
    frames = model_predictions(predictor, X_test, test_labels, rho)
    frames.update(baseline_predictions(train_labels, test_labels, X_train, X_test, rho, predictor.model.config.alpha))
    scores = {name: quality(frame) for name, frame in frames.items()}
    model = scores["model"]
    ratios = {**target_ratios(model, scores), "mae_vs_single_stage": ratio(model["mae"], scores["single_stage"]["mae"])}
    metrics = {"model": model, "ratios": ratios, "baselines": {k: v for k, v in scores.items() if k != "model"}}
    breakdown = {
        by: {"model": grouped_quality(frames["model"], by), "role_median": grouped_quality(frames["role_median"], by)}
        for by in ("app", "role")
    }
    return metrics, breakdown, frames


def add_workflow(metrics: dict, detail: dict, predictor: Predictor, traces: str, train_labels, test_labels) -> None:
    """The workflow model's figures per condition into `metrics` (its headline) and `detail` (all of them)."""
    if predictor.workflow is None:  # a predictor saved without one
        return
    stages = read_traces(traces).stages
    scored = evaluate_workflow(
        predictor.workflow, select_stages(stages, train_labels), select_stages(stages, test_labels)
    )
    for name, figures in scored.items():
        if name in metrics:
            metrics[name]["workflow"], detail[name]["workflow"] = figures["headline"], figures
