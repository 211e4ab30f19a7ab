"""The reserve level for an app training never saw, learnt from app-held-out out-of-fold scores.

The calibration groups of `pipelines.model` promise a miss rate for the apps training saw. A new app's
stages reach the model with their app (and often their roles and model name) unseen, so no group of
theirs was calibrated and the global level carries no promise for them. Here each training app is
left out in turn: the tool classifier and the reserve's bound model are fitted on the other apps, the
left-out app's rows are scored with its categories unseen (as a new app's rows arrive), and its
conformal level is taken per history condition. The level served to a new app is, per condition, the
largest of these: the level that would have held for the worst app had it been new.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import lightgbm as lgb
import numpy as np
import pandas as pd

from pipelines.features import UNKNOWN
from pipelines.history import HISTORY_CONDITIONS
from pipelines.model import TwoStageModel, _calibrate, _lgb_params, conformal_quantile

NEW_APP = "new_app"  # the fallback level of an answer for an app training never saw
MIN_APP_ROWS = 50  # an app with fewer training rows is not left out on its own: its level would be noise


@dataclass(frozen=True)
class NewAppLevels:
    """Log-space levels added to the bound model's output for a new app's stages, per history condition.

    `by_app`: each left-out app's own level per condition (what the worst was taken over); `num_apps`:
    how many apps were left out."""

    levels: dict[str, float]
    by_app: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def num_apps(self) -> int:
        return len(self.by_app)

    def level(self, history: str) -> float:
        """The level for one condition; a condition no app was scored in takes the largest level of any."""
        return self.levels.get(history, max(self.levels.values()))

    def describe(self) -> dict:
        """The levels as plain numbers (meta.json, MLflow)."""
        return {"levels": {k: round(v, 4) for k, v in self.levels.items()},
                "by_app": {a: {k: round(v, 4) for k, v in levels.items()} for a, levels in self.by_app.items()}}


def as_unseen(X: pd.DataFrame, seen: pd.DataFrame) -> pd.DataFrame:
    """`X` with every categorical value that `seen` does not hold set to UNKNOWN, and its app UNKNOWN:
    the rows as the featurizer makes them for an app training never saw."""
    X = X.copy()
    for column in X.columns:
        if not isinstance(X[column].dtype, pd.CategoricalDtype) or UNKNOWN not in X[column].cat.categories:
            continue
        known = set(seen[column].dropna().astype(str))
        is_new = ~X[column].astype(str).isin(known) | (column == "app")
        X.loc[is_new.to_numpy(), column] = UNKNOWN
    return X


def held_out_scores(model: TwoStageModel, X: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """Out-of-app scores (log actual − log bound) of every row whose app has MIN_APP_ROWS fitted rows, each
    from models fitted without its app; columns row (in X), app, history, p_tool (out of app), score."""
    fitted = ~labels["calibrate_only"].to_numpy(bool) if "calibrate_only" in labels else np.ones(len(X), bool)
    apps = labels["app"].astype(str).to_numpy()
    counts = pd.Series(apps[fitted]).value_counts()
    left_out = [a for a in counts.index if counts[a] >= MIN_APP_ROWS and a != UNKNOWN]
    if len(left_out) < 2:
        return pd.DataFrame(columns=["row", "app", "history", "p_tool", "score"])
    y_log, y_tool = np.log1p(labels["tokens"].to_numpy(float)), labels["is_tool"].to_numpy(int)
    p_tool_oof = model.oof_["p_tool"].to_numpy(float)  # what the bound model was fitted with
    parts = []
    for app in left_out:
        train, test = np.flatnonzero(fitted & (apps != app)), np.flatnonzero(apps == app)
        unseen = as_unseen(X.iloc[test], X.iloc[train])
        p_tool = _calibrate(model.calibrator_, _classifier_scores(model, X.iloc[train], y_tool[train], unseen))
        bound = _fit_bound(model, X.iloc[train].assign(p_tool=p_tool_oof[train]), y_log[train])
        scores = y_log[test] - bound.predict(unseen.assign(p_tool=p_tool))
        parts.append(pd.DataFrame({"row": test, "app": app, "history": model.oof_["history"].to_numpy()[test],
                                   "p_tool": p_tool, "score": scores}))
    return pd.concat(parts, ignore_index=True)


def _classifier_scores(model: TwoStageModel, X: pd.DataFrame, y_tool: np.ndarray, rows: pd.DataFrame) -> np.ndarray:
    cfg = model.config
    if len(set(y_tool)) < 2:
        return np.full(len(rows), float(y_tool.mean()) if len(y_tool) else 0.0)
    params = _lgb_params(cfg.classifier, cfg, objective="binary")
    return lgb.train(params, lgb.Dataset(X, y_tool), num_boost_round=cfg.classifier["n_estimators"]).predict(rows)


def _fit_bound(model: TwoStageModel, X2: pd.DataFrame, y_log: np.ndarray) -> lgb.Booster:
    cfg = model.config
    params = _lgb_params(cfg.quantile, cfg, objective="quantile", alpha=cfg.bound_level)
    return lgb.train(params, lgb.Dataset(X2, y_log), num_boost_round=cfg.quantile["n_estimators"])


def levels_of(scores: pd.DataFrame, alpha: float) -> NewAppLevels | None:
    """Each app's conformal level per condition, and per condition the largest finite one (None: no app had
    enough rows for a finite level in any condition)."""
    by_app: dict[str, dict[str, float]] = {}
    for (app, history), part in scores.groupby(["app", "history"]):
        level = conformal_quantile(part["score"].to_numpy(float), alpha)
        if np.isfinite(level):
            by_app.setdefault(str(app), {})[str(history)] = level
    levels = {h: max(v[h] for v in by_app.values() if h in v)
              for h in HISTORY_CONDITIONS if any(h in v for v in by_app.values())}
    return NewAppLevels(levels, by_app) if levels else None


def fit_new_app_levels(model: TwoStageModel, X: pd.DataFrame, labels: pd.DataFrame) -> NewAppLevels | None:
    """The new-app levels of a fitted model from its training frame and labels (Predictor.fit's); None where
    training holds fewer than two apps to leave out, or the model's reserve is not conformal."""
    if model.config.reserve_method != "conformal" or "app" not in X or not hasattr(model, "oof_"):
        return None
    return levels_of(held_out_scores(model, X, labels), model.config.alpha)


def new_app_reserve(levels: NewAppLevels, log_bound: float, history: str, tokens_pred: float) -> float:
    """The reserve of a new app's stage: the bound model's output lifted by the condition's level, never
    below the point prediction."""
    return max(float(np.expm1(log_bound + levels.level(history))), tokens_pred)
