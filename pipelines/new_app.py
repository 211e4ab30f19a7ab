"""The reserve of an app training never saw: its own bound model, its level from app-held-out scores.

The calibration groups of `pipelines.model` promise a miss rate for the apps training saw. A new app's
stages reach the model with their app (and often their roles and model name) unseen, so no group of
theirs was calibrated and the global level carries no promise for them. A new app's reserve comes from
its own bound model: the reserve's (bound-quantile) LightGBM refitted on the two-stage model's features
plus NEW_APP_ONLY, the called model's own earlier turns in the prompt, a verbosity that reads the same in
every app. Its level: each training app is left out in turn, the tool classifier and this bound are fitted
on the other apps, the left-out app's rows are scored with its categories unseen (as a new app's rows
arrive), and its conformal level is taken per history condition. The level served to a new app is, per
condition, the largest of these: the level that would have held for the worst app had it been new.
Which columns the bound reads was chosen by inner leave-one-app-out (pipelines/EXPERIMENTS.md, 2026-12-02).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import lightgbm as lgb
import numpy as np
import pandas as pd

from maestro.prediction import FallbackLevel
from pipelines.calibration import calibrate_scores, conformal_quantile
from pipelines.features import UNKNOWN
from pipelines.history import HISTORY_CONDITIONS
from pipelines.model import TwoStageModel
from pipelines.model_config import lgb_params
from pipelines.turn_features import OWN_TURN_COLUMNS

NEW_APP = FallbackLevel.NEW_APP  # the fallback level of an answer for an app training never saw
MIN_APP_ROWS = 50  # an app with fewer training rows is not left out on its own: its level would be noise
# Read by a new app's bound only: in the two-stage model they cost a seen app's coverage (pipelines/EXPERIMENTS.md)
NEW_APP_ONLY = OWN_TURN_COLUMNS


def model_frame(X: pd.DataFrame) -> pd.DataFrame:
    """The columns of a featurizer's frame the two-stage model reads: all but NEW_APP_ONLY."""
    return X.drop(columns=[c for c in NEW_APP_ONLY if c in X])


@dataclass(frozen=True)
class NewAppLevels:
    """A new app's bound model and the log-space levels added to its output, per history condition.

    `bound`: the bound-quantile LightGBM on `columns` (the featurizer's: the model's and NEW_APP_ONLY) then p_tool,
    fitted on every training app; `by_app`: each left-out app's own level per condition (the worst is served)."""

    levels: dict[str, float]
    by_app: dict[str, dict[str, float]] = field(default_factory=dict)
    bound: lgb.Booster | None = field(default=None, compare=False)
    columns: tuple[str, ...] = ()

    def log_bound(self, matrix: np.ndarray, feature_names: list[str], p_tool: np.ndarray) -> np.ndarray:
        """The bound's output for rows of the model's float matrix (columns `feature_names`)."""
        index = {name: i for i, name in enumerate(feature_names)}
        return self.bound.predict(np.column_stack([matrix[:, [index[c] for c in self.columns]], p_tool]))

    @property
    def num_apps(self) -> int:
        return len(self.by_app)

    def level(self, history: str) -> float:
        """The level for one condition; a condition no app was scored in takes the largest level of any."""
        return self.levels.get(history, max(self.levels.values()))

    def describe(self) -> dict:
        """The levels as plain numbers (meta.json, MLflow)."""
        return {
            "levels": {k: round(v, 4) for k, v in self.levels.items()},
            "by_app": {a: {k: round(v, 4) for k, v in levels.items()} for a, levels in self.by_app.items()},
        }


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


def held_out_scores(
    model: TwoStageModel, X: pd.DataFrame, labels: pd.DataFrame, columns: list[str] | None = None
) -> pd.DataFrame:
    """Out-of-app scores (log actual − log bound on `columns`, all of X's by default) of every row whose app has
    MIN_APP_ROWS fitted rows, each from models fitted without its app; columns row (in X), app, history, p_tool
    (out of app), score."""
    columns = list(X.columns) if columns is None else columns
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
        raw = _classifier_scores(model, model_frame(X.iloc[train]), y_tool[train], model_frame(unseen))
        p_tool = calibrate_scores(model.calibrator_, raw)
        bound = _fit_bound(model, X.iloc[train][columns].assign(p_tool=p_tool_oof[train]), y_log[train])
        scores = y_log[test] - bound.predict(unseen[columns].assign(p_tool=p_tool))
        parts.append(
            pd.DataFrame(
                {
                    "row": test,
                    "app": app,
                    "history": model.oof_["history"].to_numpy()[test],
                    "p_tool": p_tool,
                    "score": scores,
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


def _classifier_scores(model: TwoStageModel, X: pd.DataFrame, y_tool: np.ndarray, rows: pd.DataFrame) -> np.ndarray:
    cfg = model.config
    if len(set(y_tool)) < 2:
        return np.full(len(rows), float(y_tool.mean()) if len(y_tool) else 0.0)
    params = lgb_params(cfg.classifier, cfg, objective="binary")
    return lgb.train(params, lgb.Dataset(X, y_tool), num_boost_round=cfg.classifier["n_estimators"]).predict(rows)


def _fit_bound(model: TwoStageModel, X2: pd.DataFrame, y_log: np.ndarray) -> lgb.Booster:
    cfg = model.config
    params = lgb_params(cfg.quantile, cfg, objective="quantile", alpha=cfg.bound_level)
    return lgb.train(params, lgb.Dataset(X2, y_log), num_boost_round=cfg.quantile["n_estimators"])


def levels_of(scores: pd.DataFrame, alpha: float) -> NewAppLevels | None:
    """Each app's conformal level per condition, and per condition the largest finite one (None: no app had
    enough rows for a finite level in any condition)."""
    by_app: dict[str, dict[str, float]] = {}
    for (app, history), part in scores.groupby(["app", "history"]):
        level = conformal_quantile(part["score"].to_numpy(float), alpha)
        if np.isfinite(level):
            by_app.setdefault(str(app), {})[str(history)] = level
    levels = {
        h: max(v[h] for v in by_app.values() if h in v)
        for h in HISTORY_CONDITIONS
        if any(h in v for v in by_app.values())
    }
    return NewAppLevels(levels, by_app) if levels else None


def fit_new_app_levels(model: TwoStageModel, X: pd.DataFrame, labels: pd.DataFrame) -> NewAppLevels | None:
    """A fitted model's new-app bound and levels from its training frame and labels (Predictor.fit's); None
    where training holds fewer than two apps to leave out, or the model's reserve is not conformal."""
    if model.config.reserve_method != "conformal" or "app" not in X or not hasattr(model, "oof_"):
        return None
    columns = list(X.columns)
    levels = levels_of(held_out_scores(model, X, labels, columns), model.config.alpha)
    if levels is None:
        return None
    fitted = ~labels["calibrate_only"].to_numpy(bool) if "calibrate_only" in labels else np.ones(len(X), bool)
    X2 = X[columns].assign(p_tool=model.oof_["p_tool"].to_numpy(float))
    bound = _fit_bound(model, X2[fitted], np.log1p(labels["tokens"].to_numpy(float))[fitted])
    return NewAppLevels(levels.levels, levels.by_app, bound, tuple(columns))


def new_app_reserves(
    levels: NewAppLevels, matrix: np.ndarray, feature_names: list[str], out: dict, rows: np.ndarray
) -> np.ndarray:
    """The reserves of a new app's stages (`rows` of the model's matrix and of its answers `out`): the new-app
    bound lifted by each row's condition level, never below the point prediction."""
    log_bound = levels.log_bound(matrix[rows], feature_names, out["p_tool"][rows])
    lift = np.array([levels.level(str(h)) for h in out["history"][rows]])
    return np.maximum(np.expm1(log_bound + lift), out["tokens_pred"][rows])
