"""Quality metrics of a length predictor, overall and per group, and the baselines it must beat."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pandas as pd
from scipy.stats import kendalltau
from sklearn.metrics import r2_score, roc_auc_score

from pipelines.calibration import conformal_quantile


def expected_calibration_error(is_tool: np.ndarray, p_tool: np.ndarray, bins: int = 10) -> float:
    """Mean |observed rate − predicted probability| over equal-width bins, weighted by bin size."""
    edges = np.linspace(0, 1, bins + 1)
    index = np.clip(np.digitize(p_tool, edges[1:-1]), 0, bins - 1)
    total = 0.0
    for b in range(bins):
        member = index == b
        if member.any():
            total += member.sum() * abs(is_tool[member].mean() - p_tool[member].mean())
    return float(total / max(len(p_tool), 1))


def _safe(fn, *args) -> float | None:
    try:
        value = float(fn(*args))
    except ValueError:
        return None
    return None if np.isnan(value) else value


def quality(frame: pd.DataFrame) -> dict:
    """Metrics of one set of predictions: columns tokens, is_tool, p_tool, tokens_pred, tokens_reserve."""
    y, pred, reserve = (frame[c].to_numpy(float) for c in ("tokens", "tokens_pred", "tokens_reserve"))
    is_tool, p_tool = frame["is_tool"].to_numpy(int), frame["p_tool"].to_numpy(float)
    has_both = len(set(is_tool)) > 1
    return {
        "n": int(len(frame)),
        "auc": _safe(roc_auc_score, is_tool, p_tool) if has_both else None,
        "ece": expected_calibration_error(is_tool, p_tool) if len(frame) else None,
        "mae": float(np.mean(np.abs(pred - y))) if len(frame) else None,
        "r2": _safe(r2_score, y, pred) if len(frame) > 1 else None,
        "r2_log": _safe(r2_score, np.log1p(y), np.log1p(pred)) if len(frame) > 1 else None,
        "kendall_tau": _safe(lambda a, b: kendalltau(a, b)[0], pred, y) if len(frame) > 1 else None,
        "under_rate": float(np.mean(y > reserve)) if len(frame) else None,
        "over_reservation": float(np.maximum(0, reserve - y).sum() / max(y.sum(), 1)),
    }


def grouped_quality(frame: pd.DataFrame, by: str) -> dict[str, dict]:
    return {str(key): quality(group) for key, group in frame.groupby(by, observed=True)}


def _per_role(train: pd.DataFrame, test: pd.DataFrame, stat, last_resort: float = np.nan) -> np.ndarray:
    """stat of each test row's role in train; where a role is unseen (or stat is NaN) stat of all of train,
    and where that is NaN too, last_resort."""
    table = train.groupby("role", observed=True)["tokens"].agg(stat)
    fallback = float(stat(train["tokens"]))
    fallback = last_resort if np.isnan(fallback) else fallback
    return test["role"].astype(str).map(table.rename(index=str)).fillna(fallback).to_numpy(float)


def _conformal_level(alpha: float):
    """Per-group stat: the split-conformal (1−α) level of the tokens; NaN where the group is too small
    for it (fewer than ~1/α members)."""

    def stat(tokens: pd.Series) -> float:
        level = conformal_quantile(tokens.to_numpy(float), alpha)
        return level if np.isfinite(level) else np.nan

    return stat


def role_baselines(train: pd.DataFrame, test: pd.DataFrame, rho: float, alpha: float) -> dict[str, pd.DataFrame]:
    """The answers that need no model, as prediction frames over `test` (label frames: tokens, is_tool, role).

    global_median / role_median: reserve = point × (1+ρ); role_p90: point = role median, reserve =
    role p90; role_conformal: point = role median, reserve = the role's split-conformal (1−α) level,
    the per-role constant that promises the model's miss rate (global level for roles too small to).
    """
    p_tool_role = _per_role(train.assign(tokens=train["is_tool"].astype(float)), test, np.mean)
    glob = np.full(len(test), float(np.median(train["tokens"])))
    role_median = _per_role(train, test, np.median)
    base = test[["tokens", "is_tool", "role", "app"]]
    make = lambda point, reserve, p: base.assign(tokens_pred=point, tokens_reserve=reserve, p_tool=p)
    return {
        "global_median": make(glob, glob * (1 + rho), np.full(len(test), train["is_tool"].mean())),
        "role_median": make(role_median, role_median * (1 + rho), p_tool_role),
        "role_p90": make(role_median, _per_role(train, test, lambda s: np.quantile(s, 0.9)), p_tool_role),
        "role_conformal": make(
            role_median, _per_role(train, test, _conformal_level(alpha), train["tokens"].max()), p_tool_role
        ),
    }


def baseline_predictions(
    train: pd.DataFrame,
    test: pd.DataFrame,
    X_train: pd.DataFrame,
    X_test: pd.DataFrame,
    rho: float,
    alpha: float,
    seed: int = 0,
) -> dict[str, pd.DataFrame]:
    """role_baselines, and single_stage: one LightGBM L2 regressor on log(1+tokens), no classifier,
    reserve ×(1+ρ)."""
    params = {
        "objective": "l2",
        "verbosity": -1,
        "seed": seed,
        "num_threads": 1,
        "learning_rate": 0.05,
        "num_leaves": 31,
        "min_child_samples": 10,
    }
    booster = lgb.train(params, lgb.Dataset(X_train, np.log1p(train["tokens"].to_numpy(float))), num_boost_round=500)
    single = np.expm1(booster.predict(X_test))
    out = role_baselines(train, test, rho, alpha)
    out["single_stage"] = out["role_median"].assign(tokens_pred=single, tokens_reserve=single * (1 + rho))
    return out


# The targets for a predictor on workflows it has not seen: (metric, comparison, bound), the
# metric read from target_ratios() or from the model's quality().
TARGETS = (
    ("auc", ">=", 0.95),
    ("mae_vs_role_median", "<=", 0.80),
    ("kendall_tau", ">=", 0.60),
    ("under_rate", "<=", 0.05),
    ("over_reservation_vs_role_p90", "<=", 0.75),
)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 4)


def target_ratios(model: dict, baselines: dict[str, dict]) -> dict:
    """The model's quality against the per-role baselines' (quality() dicts of the same stages)."""
    return {
        "mae_vs_role_median": ratio(model["mae"], baselines["role_median"]["mae"]),
        "over_reservation_vs_role_p90": ratio(model["over_reservation"], baselines["role_p90"]["over_reservation"]),
        # the per-role constant promising the same miss rate: what the reserve saves at equal risk
        "over_reservation_vs_role_conformal": ratio(
            model["over_reservation"], baselines["role_conformal"]["over_reservation"]
        ),
    }


VERDICTS = {True: "met", False: "MISSED", None: "not measurable"}  # how a target_checks() value reads


def target_checks(model: dict, ratios: dict) -> dict[str, bool | None]:
    """Each target met (True), missed (False) or not measurable here (None: no tool calls for an AUC)."""
    out = {}
    for metric, op, bound in TARGETS:
        value = ratios.get(metric, model.get(metric))
        out[metric] = None if value is None else (value >= bound if op == ">=" else value <= bound)
    return out


def scoring_frames(
    predictions: pd.DataFrame, test: pd.DataFrame, train: pd.DataFrame, rho: float, alpha: float
) -> dict[str, pd.DataFrame]:
    """Predictions (workflow_id, stage_id, p_tool, tokens_pred, tokens_reserve) of labelled `test` stages
    as the prediction frame "model", beside the per-role baselines fitted on `train` (label frames) over
    the same stages."""
    keys = ["workflow_id", "stage_id"]
    frame = test.merge(
        predictions[keys + ["p_tool", "tokens_pred", "tokens_reserve"]], on=keys, how="inner", validate="one_to_one"
    )
    return {"model": frame, **role_baselines(train, frame, rho, alpha)}


def score_frames(frames: dict[str, pd.DataFrame]) -> dict:
    """scoring_frames() against the targets and the baselines, overall and per app."""

    def table(parts: dict[str, pd.DataFrame]) -> dict:
        scores = {name: quality(f) for name, f in parts.items()}
        model, baselines = scores.pop("model"), scores
        ratios = target_ratios(model, baselines)
        return {"model": model, "ratios": ratios, "targets": target_checks(model, ratios), "baselines": baselines}

    by_app = {
        str(app): table({name: f[f["app"] == app] for name, f in frames.items()})
        for app in sorted(frames["model"]["app"].unique())
    }
    return {**table(frames), "by_app": by_app}
