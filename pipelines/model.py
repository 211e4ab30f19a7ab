"""The two-stage length model: calibrated tool-call classifier → asymmetric-loss regressor → calibrated reserve.

Stage 1, LightGBM classifier for P(tool call), calibrated on out-of-fold scores (folds grouped by
workflow/task) by a sigmoid (Platt) on the raw score's logit: strictly increasing, so it keeps the
classifier's ranking, where isotonic regression's flat steps tie most scores. Stage 2, LightGBM on
log(1+tokens) with an asymmetric loss in which under-estimation weighs `under_weight` times more, and the
calibrated p_tool as a feature. The loss is absolute (`pinball`: the w/(1+w) quantile) or squared (`squared`:
an expectile, the seed recipe); heavy-tailed lengths favour the absolute one. The regressor draws its split
thresholds at random (LightGBM extra_trees) and the point prediction averages `regressor_bags` of them (seeds
differ): with ~1k training stages its variance is what costs ranking. What each choice measured:
pipelines/EXPERIMENTS.md, "What moved the figures".
Reserve: conformalised quantile regression (a LightGBM (1−α)-quantile model whose out-of-fold
misses are calibrated per group: history condition × app × role × mode, falling back to coarser
groups), so that at most `alpha` of stages exceed their reserve in each history condition; every
quantity used for calibration is out-of-fold. Rows marked `calibrate_only` (e.g. copies with part of
their history hidden) are predicted out of fold and calibrated on, never fitted on. The configuration and the
LightGBM parameters it gives the boosters: pipelines/model_config.py.
"""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold

from pipelines.boosters import Regressor, RowPredictor, as_matrix, raw_score
from pipelines.calibration import (
    SigmoidCalibrator,  # noqa: F401 (models pickled when it lived here still load)
    app_keys,
    calibrate_groups,
    calibrate_scores,
    calibration_keys,
    group_levels,
    new_calibrator,
)
from pipelines.features import EMBEDDING_PREFIX, UNKNOWN
from pipelines.history import history_conditions
from pipelines.model_config import ModelConfig, lgb_params, regression_objective

# Predictors pickled before pipelines/boosters.py, pipelines/calibration.py and pipelines/model_config.py existed look
# these classes up here: SigmoidCalibrator and ModelConfig (imported above) and the bagged regressor under its old name.
_Regressor = Regressor


class TwoStageModel:
    """fit(X, tokens, is_tool, groups) → predict(X) giving p_tool, tokens_pred, tokens_reserve."""

    def __init__(self, config: ModelConfig | None = None):
        self.config = config or ModelConfig()

    # ---- fitting ------------------------------------------------------------------------
    def fit(
        self,
        X: pd.DataFrame,
        tokens: np.ndarray,
        is_tool: np.ndarray,
        groups: np.ndarray,
        calibrate_only: np.ndarray | None = None,
    ) -> TwoStageModel:
        """`groups`: each row's task (folds never split one); `calibrate_only`: rows predicted out of fold
        for calibration but left out of every fit."""
        cfg = self.config
        roles = _roles(X)  # before dropout: the online correction's per-role margins (oof_)
        fitted = np.ones(len(X), bool) if calibrate_only is None else ~np.asarray(calibrate_only, bool)
        X = self._drop_roles(X, np.random.default_rng(cfg.seed))
        y_log, y_tool = np.log1p(np.asarray(tokens, float)), np.asarray(is_tool, int)
        folds = [
            (train[fitted[train]], test)
            for train, test in GroupKFold(n_splits=min(cfg.folds, len(set(groups)))).split(X, groups=groups)
        ]
        X1 = X[classifier_columns(list(X.columns), cfg)]
        raw_oof = self._oof(
            folds, lambda tr: self._fit_classifier(X1.iloc[tr], y_tool[tr]), lambda m, te: raw_score(m, X1.iloc[te])
        )
        self.calibrator_ = new_calibrator(cfg.calibration).fit(raw_oof, y_tool)
        self.classifier_ = self._fit_classifier(X1[fitted], y_tool[fitted])
        X2 = X.assign(p_tool=self.calibrator_.predict(raw_oof))
        pred_oof = self._oof(
            folds, lambda tr: self._fit_regressor(X2.iloc[tr], y_log[tr]), lambda m, te: m.predict(X2.iloc[te])
        )
        self.regressor_ = self._fit_regressor(X2[fitted], y_log[fitted])
        history = history_conditions(lambda c: X[c].to_numpy(float) if c in X else None, len(X))
        self.oof_ = pd.DataFrame(
            {"p_tool": X2["p_tool"], "log_pred": pred_oof, "log_true": y_log, "role": roles, "history": history}
        )
        self.fit_reserve(X2, y_log, folds, fitted, history)
        return self

    @staticmethod
    def _oof(folds, fit, predict) -> np.ndarray:
        out = np.zeros(sum(len(te) for _, te in folds))
        for train_idx, test_idx in folds:
            out[test_idx] = predict(fit(train_idx), test_idx)
        return out

    def _drop_roles(self, X: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
        if self.config.role_dropout <= 0 or "role" not in X:
            return X
        mask = rng.random(len(X)) < self.config.role_dropout
        X = X.copy()
        X.loc[mask, "role"] = UNKNOWN
        return X

    def _fit_classifier(self, X: pd.DataFrame, y: np.ndarray):
        if len(set(y)) < 2:  # one class only (e.g. traces without any tool call): a constant
            return float(y.mean()) if len(y) else 0.0
        params = lgb_params(self.config.classifier, self.config, objective="binary")
        return lgb.train(params, lgb.Dataset(X, y), num_boost_round=self.config.classifier["n_estimators"])

    def _fit_regressor(self, X: pd.DataFrame, y_log: np.ndarray) -> Regressor:
        cfg = self.config
        base = float(np.mean(y_log))
        params = lgb_params(cfg.regressor, cfg, **regression_objective(cfg.loss, cfg.under_weight))
        boosters = [
            lgb.train(
                {**params, "seed": cfg.seed + b},
                lgb.Dataset(X, y_log, init_score=np.full(len(y_log), base)),
                num_boost_round=cfg.regressor["n_estimators"],
            )
            for b in range(cfg.regressor_bags)
        ]
        return Regressor(boosters[0], base, boosters[1:])

    def fit_reserve(self, X2: pd.DataFrame, y_log: np.ndarray, folds, fitted: np.ndarray, history: np.ndarray) -> None:
        """Conformalised quantile regression: a LightGBM (1−α)-quantile model, its out-of-fold
        misses calibrated per group, so that each group's share above its reserve is ≤ α. fit() calls it last
        with the frame with p_tool, log labels, folds, fitted rows and history conditions; calling it again with
        another config refits the reserve alone (benchmarks/predictor/reserve_cv.py)."""
        cfg = self.config
        params = lgb_params(cfg.quantile, cfg, objective="quantile", alpha=cfg.bound_level)
        fit = lambda idx: lgb.train(
            params, lgb.Dataset(X2.iloc[idx], y_log[idx]), num_boost_round=cfg.quantile["n_estimators"]
        )
        upper_oof = self._oof(folds, fit, lambda m, te: m.predict(X2.iloc[te]))
        self.upper_ = fit(np.flatnonzero(fitted))
        apps = app_keys(X2["app"].cat.codes.to_numpy(float)) if "app" in X2 else None
        self.global_q_, self.group_q_ = calibrate_groups(
            y_log - upper_oof, calibration_keys(_roles(X2), X2["p_tool"].to_numpy(), apps, history), cfg
        )

    # ---- prediction -----------------------------------------------------------------------
    def predict(self, X: pd.DataFrame) -> dict[str, np.ndarray]:
        """Predict for a feature frame (Featurizer.transform)."""
        if not hasattr(self, "regressor_"):
            raise RuntimeError("TwoStageModel is not fitted: call fit() first")
        return self.predict_matrix(as_matrix(X, self.regressor_.booster.pandas_categorical), _roles(X))

    @property
    def feature_names(self) -> list[str]:
        """The columns predict_matrix reads, in order (the regressor reads p_tool after them)."""
        names = self.__dict__.get("_feature_names")
        if names is None:  # asked on every live call: the booster's own answer is a C call and 100 string buffers
            names = self.__dict__["_feature_names"] = self.regressor_.booster.feature_name()[:-1]
        return names

    def predict_matrix(self, matrix: np.ndarray, roles: list[str]) -> dict[str, np.ndarray]:
        """Predict for the float matrix LightGBM reads (columns `feature_names`, categoricals as codes)
        and each row's role category. One call per booster for the whole matrix (one row through
        LightGBM's single-row C API: RowPredictor); LightGBM's own pandas conversion, per call, costs more
        than the trees themselves on a live service's small batches."""
        rows = self._rows
        p_tool = calibrate_scores(self.calibrator_, rows["classifier"](self._classifier_matrix(matrix)))
        matrix2 = np.column_stack([matrix, p_tool])
        log_pred = sum(predict(matrix2) for predict in rows["regressors"]) / len(rows["regressors"])
        tokens_pred = np.expm1(log_pred + self.regressor_.base)
        column = self._matrix_column(matrix)
        history = history_conditions(column, len(matrix))
        if self.config.reserve_method == "rho":
            reserve = tokens_pred * (1 + self.config.rho)
        else:
            apps = None if column("app") is None else app_keys(column("app"))
            reserve = np.expm1(rows["upper"](matrix2) + self._quantiles(roles, p_tool, apps, history))
        return {
            "p_tool": p_tool,
            "tokens_pred": tokens_pred,
            "tokens_reserve": np.maximum(reserve, tokens_pred),
            "history": history,
        }

    @property
    def _rows(self) -> dict:
        """The boosters as RowPredictors, made on first use (not pickled: they hold LightGBM handles)."""
        rows = self.__dict__.get("_row_predictors")
        if rows is None:
            classifier = self.classifier_
            rows = self.__dict__["_row_predictors"] = {
                "classifier": (lambda m: np.full(len(m), classifier))
                if isinstance(classifier, float)
                else RowPredictor(classifier),
                "regressors": [RowPredictor(b) for b in self.regressor_.boosters],
                "upper": RowPredictor(self.upper_) if hasattr(self, "upper_") else None,
            }
        return rows

    def use_row_predictors(self, classifier=None, regressors: list | None = None, upper=None) -> None:
        """Answer through these callables (a float64 matrix → predictions, as RowPredictor) where given, e.g.
        the compiled boosters of pipelines.compiled_trees; LightGBM's RowPredictors elsewhere."""
        given = {"classifier": classifier, "regressors": regressors, "upper": upper}
        self.__dict__["_row_predictors"] = {**self._rows, **{k: v for k, v in given.items() if v is not None}}

    def _classifier_matrix(self, matrix: np.ndarray) -> np.ndarray:
        """The columns of `matrix` the classifier was trained on (all of them, or all but the embedding's)."""
        index = self.__dict__.get("_classifier_index")
        if index is None:
            names = self.feature_names if isinstance(self.classifier_, float) else self.classifier_.feature_name()
            position = {name: i for i, name in enumerate(self.feature_names)}
            index = self.__dict__["_classifier_index"] = (
                None if names == self.feature_names else np.array([position[n] for n in names])
            )
        return matrix if index is None else matrix[:, index]

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_row_predictors"}

    def _matrix_column(self, matrix: np.ndarray):
        """column(name): that feature's values in `matrix`, None where the model does not read it."""
        index = self.__dict__.get("_feature_index")
        if index is None:
            index = self.__dict__["_feature_index"] = {name: i for i, name in enumerate(self.feature_names)}
        return lambda name: matrix[:, index[name]] if name in index else None

    def _quantiles(
        self, roles: list[str], p_tool: np.ndarray, apps: np.ndarray | None = None, history: np.ndarray | None = None
    ) -> np.ndarray:
        """Each row's calibrated level: that of its most specific group with one, else the global one."""
        return group_levels(roles, p_tool, apps, history, self.group_q_, self.global_q_)


def classifier_columns(columns: list[str], config: ModelConfig) -> list[str]:
    """The feature columns the tool-call classifier is trained on."""
    return columns if config.classifier_embedding else [c for c in columns if not c.startswith(EMBEDDING_PREFIX)]


def _roles(X: pd.DataFrame) -> list[str]:
    return [str(r) for r in X["role"].to_numpy(dtype=object)]
