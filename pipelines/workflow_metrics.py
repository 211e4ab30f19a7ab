"""How well a workflow predictor ranks and bounds remaining work, per app and pooled, against the answers that
need no model: the per-(app, position) median of the training side, and the app's median length minus the
position. `evaluate_workflow` is what the DVC evaluate stage reports (metrics.json: its `headline`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from maestro.contract import StageTrace
from pipelines.features import UNKNOWN
from pipelines.history import without_labels
from pipelines.workflow_features import remaining_targets

CONDITIONS = ("with_history", "without_history")


def truth_frame(stages: list[StageTrace]) -> pd.DataFrame:
    """Each stage's app, position and remaining calls / tokens."""
    calls, tokens = remaining_targets(stages)
    return pd.DataFrame(
        {
            "workflow_id": [s.workflow_id for s in stages],
            "stage_id": [s.stage_id for s in stages],
            "app": [s.app or UNKNOWN for s in stages],
            "position": [s.call_index for s in stages],
            "calls": calls,
            "tokens": tokens,
        }
    )


def baselines(train: pd.DataFrame, test: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Point answers for `test` (truth_frame) from `train`'s: "position_median", the (app, position) median
    (where the training side never reached that position in that app: the app's length-minus-position answer),
    and "length_minus_position": the app's median number of calls minus the position minus one (at least 0), with
    tokens as many times the app's median output tokens per remaining call."""
    lengths = train[train["position"].eq(0)].groupby("app")["calls"].median() + 1
    per_call = train.groupby("app")["tokens"].sum() / train.groupby("app")["calls"].sum().clip(lower=1)
    apps = test["app"]
    pooled_length = float(lengths.median()) if len(lengths) else 1.0
    left = np.maximum(apps.map(lengths).fillna(pooled_length).to_numpy() - test["position"].to_numpy() - 1, 0)
    minus = test.assign(calls_pred=left, tokens_pred=left * apps.map(per_call).fillna(per_call.median()).to_numpy())
    table = train.groupby(["app", "position"])[["calls", "tokens"]].median()
    keys = pd.MultiIndex.from_arrays([apps, test["position"]])
    median = test.assign(
        calls_pred=table["calls"].reindex(keys).to_numpy(), tokens_pred=table["tokens"].reindex(keys).to_numpy()
    )
    for column in ("calls_pred", "tokens_pred"):
        median[column] = median[column].fillna(minus[column])
    return {"position_median": median, "length_minus_position": minus}


def model_frame(model, stages: list[StageTrace], truth: pd.DataFrame, condition: str) -> pd.DataFrame:
    """The model's answers for `stages` as they are ("with_history") or with every label stripped."""
    given = stages if condition == "with_history" else [without_labels(s) for s in stages]
    answers = pd.DataFrame([p.to_dict() for p in model.predict(given)])
    return truth.assign(
        calls_pred=answers["wf_remaining_calls"].to_numpy(),
        tokens_pred=answers["wf_remaining_tokens"].to_numpy(),
        calls_upper=answers["wf_remaining_calls_upper"].to_numpy(),
        tokens_upper=answers["wf_remaining_tokens_upper"].to_numpy(),
        level=answers["wf_fallback_level"].to_numpy(),
    )


def _tau(pred: np.ndarray, true: np.ndarray) -> float | None:
    if len(pred) < 2:
        return None
    value = kendalltau(pred, true)[0]
    return None if np.isnan(value) else round(float(value), 4)


def quality(frame: pd.DataFrame, reference: pd.DataFrame | None = None) -> dict:
    """τ and MAE of the point answers on both targets; with upper bounds, the share of stages above them; with a
    `reference` (the position-median baseline over the same rows), MAE as a multiple of its MAE."""
    out = {"n": int(len(frame))}
    for target in ("calls", "tokens"):
        pred, true = frame[f"{target}_pred"].to_numpy(float), frame[target].to_numpy(float)
        out[f"tau_{target}"] = _tau(pred, true)
        out[f"mae_{target}"] = round(float(np.mean(np.abs(pred - true))), 3) if len(frame) else None
        if reference is not None and len(frame):
            base = float(np.mean(np.abs(reference[f"{target}_pred"].to_numpy(float) - true)))
            out[f"mae_{target}_vs_position_median"] = round(out[f"mae_{target}"] / base, 4) if base else None
        if f"{target}_upper" in frame and len(frame):
            out[f"over_{target}"] = round(float(np.mean(true > frame[f"{target}_upper"].to_numpy(float))), 4)
    return out


def score(frame: pd.DataFrame, base: dict[str, pd.DataFrame]) -> dict:
    """quality() of the model and of each baseline, pooled over stages and per app (rows aligned by index)."""

    def table(rows: pd.Index) -> dict:
        reference = base["position_median"].loc[rows]
        return {
            "model": quality(frame.loc[rows], reference),
            **{name: quality(b.loc[rows], reference) for name, b in base.items()},
        }

    return {"pooled": table(frame.index), "by_app": {str(app): table(rows.index) for app, rows in frame.groupby("app")}}


def evaluate_workflow(model, train: list[StageTrace], test: list[StageTrace]) -> dict:
    """Per condition ("with_history", "without_history"): score() of `model` on the test stages beside the
    baselines fitted on the training stages, and its headline."""
    truth = truth_frame(test)
    base = baselines(truth_frame(train), truth)
    out = {}
    for condition in CONDITIONS:
        scored = score(model_frame(model, test, truth, condition), base)
        out[condition] = {"headline": headline(scored), **scored}
    return out


def headline(scored: dict) -> dict:
    """The figures metrics.json shows: Kendall τ pooled over stages, MAE as a multiple of the position median's,
    and the share of stages above the upper bound, pooled and in the app with the largest share."""
    pooled, apps = scored["pooled"]["model"], [part["model"] for part in scored["by_app"].values()]
    worst = lambda key: max((q[key] for q in apps if q.get(key) is not None), default=None)
    out = {}
    for target in ("calls", "tokens"):
        out[f"tau_{target}"] = pooled[f"tau_{target}"]
        out[f"mae_{target}_vs_position_median"] = pooled.get(f"mae_{target}_vs_position_median")
        out[f"above_{target}"] = pooled.get(f"over_{target}")
        out[f"above_{target}_worst_app"] = worst(f"over_{target}")
    return out
