"""Calibration of the two-stage model's outputs: P(tool call) from the classifier's raw score (sigmoid or
isotonic), and the reserve's split-conformal levels per calibration group (history condition × app × role ×
mode, falling back to coarser groups)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

if TYPE_CHECKING:
    from pipelines.model import ModelConfig

_LEVELS = (("app", "role", "mode"), ("app", "role"), ("role", "mode"), ("role",), ("app",), ("mode",), ())


def conformal_quantile(scores: np.ndarray, alpha: float) -> float:
    """Split-conformal level: the ⌈(n+1)(1−α)⌉-th smallest score (inf when n is too small)."""
    n = len(scores)
    rank = int(np.ceil((n + 1) * (1 - alpha)))
    return float(np.sort(scores)[rank - 1]) if 0 < rank <= n else float("inf")


def group_keys(history: str, role: str, mode: str, app: str | None = None) -> list[str]:
    """One row's calibration-group keys, most specific first, e.g. "full|app=2|role=coder|mode=tool"; the
    levels naming the app are left out where the model reads no app."""
    parts = {"role": role, "mode": mode} if app is None else {"app": app, "role": role, "mode": mode}
    return [
        history + "".join(f"|{name}={parts[name]}" for name in level)
        for level in _LEVELS
        if all(name in parts for name in level)
    ]


def calibration_keys(
    roles: list[str], p_tool: np.ndarray, apps: np.ndarray | None = None, history: np.ndarray | None = None
) -> list[np.ndarray]:
    """Calibration groups from most to least specific, each within a history condition ("full" where
    not given): (app, role, mode) → (app, role) → (role, mode) → role → app → mode → the condition.
    One array of keys per level (group_keys of each row)."""
    history = ["full"] * len(roles) if history is None else history
    modes = ["tool" if p >= 0.5 else "text" for p in np.asarray(p_tool, float)]
    app_of = [None] * len(roles) if apps is None else apps
    rows = [
        group_keys(str(h), str(r), m, None if a is None else str(a))
        for h, r, m, a in zip(history, roles, modes, app_of)
    ]
    return [np.array(level, dtype=object) for level in zip(*rows)] if rows else []


def group_levels(
    roles: list[str],
    p_tool: np.ndarray,
    apps: np.ndarray | None,
    history: np.ndarray | None,
    groups: dict[str, float],
    global_level: float,
) -> np.ndarray:
    """Each row's calibrated level: that of its most specific group (calibration_keys' order) with one, else
    `global_level`; the groups are looked up once per distinct (condition, role, mode, app) of the rows."""
    n = len(roles)
    history = ["full"] * n if history is None else history
    modes = ["tool" if p >= 0.5 else "text" for p in np.asarray(p_tool, float).tolist()]
    rows = [
        (str(h), str(r), m, None if a is None else str(a))
        for h, r, m, a in zip(history, roles, modes, [None] * n if apps is None else apps)
    ]
    levels = {
        row: next((q for q in map(groups.get, group_keys(*row)) if q is not None and q == q), global_level)
        for row in set(rows)
    }  # q == q: a NaN level counts as none
    return np.fromiter(map(levels.__getitem__, rows), np.float64, n)


def calibrate_groups(scores: np.ndarray, levels: list[np.ndarray], config: ModelConfig) -> tuple[float, dict]:
    """Split-conformal levels of out-of-fold scores (log actual − log bound): over all rows, and per
    group key of each level (calibration_keys) with at least `min_group_calibration` rows."""
    groups = {}
    for level_keys in levels:
        for key in set(level_keys):
            member = scores[level_keys == key]
            if len(member) >= config.min_group_calibration:
                groups[key] = conformal_quantile(member, config.alpha)
    return conformal_quantile(scores, config.alpha), groups


def app_keys(codes: np.ndarray) -> np.ndarray:
    """App category codes as calibration-key text (the same in the frame and the matrix path)."""
    return np.array(["-" if np.isnan(c) else str(int(c)) for c in codes], dtype=object)


class SigmoidCalibrator:
    """Platt scaling of a probability score: p = σ(a·logit(raw) + b), fitted by logistic regression on
    out-of-fold scores. Strictly increasing for a > 0, so the ranking (AUC) of the raw score is kept;
    a constant (the base rate) when the labels hold one class only."""

    def fit(self, raw: np.ndarray, y: np.ndarray) -> SigmoidCalibrator:
        y = np.asarray(y, int)
        rate = float(np.clip(y.mean(), 1e-6, 1 - 1e-6)) if len(y) else 0.5
        self.coef_, self.intercept_ = 0.0, float(np.log(rate / (1 - rate)))
        if len(set(y)) > 1:
            fit = LogisticRegression(C=1e6).fit(self._logit(raw).reshape(-1, 1), y)
            self.coef_, self.intercept_ = float(fit.coef_[0, 0]), float(fit.intercept_[0])
        return self

    @staticmethod
    def _logit(raw: np.ndarray) -> np.ndarray:
        p = np.clip(np.asarray(raw, np.float64), 1e-9, 1 - 1e-9)
        return np.log(p / (1 - p))

    def predict(self, raw: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(self.coef_ * self._logit(raw) + self.intercept_)))


def new_calibrator(method: str) -> SigmoidCalibrator | IsotonicRegression:
    """An unfitted p_tool calibrator: sigmoid (keeps the ranking) or isotonic (steps: ties scores)."""
    return SigmoidCalibrator() if method == "sigmoid" else IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1)


def calibrate_scores(calibrator: SigmoidCalibrator | IsotonicRegression, raw: np.ndarray) -> np.ndarray:
    """P(tool call) from the classifier's raw scores, through the fitted calibrator."""
    if isinstance(calibrator, SigmoidCalibrator):
        return calibrator.predict(raw)
    # IsotonicRegression.predict (clip, then linear between thresholds) without its input checks
    return np.interp(
        np.clip(raw, calibrator.X_min_, calibrator.X_max_), calibrator.X_thresholds_, calibrator.y_thresholds_
    )
