"""`TwoStageModel` fitted on a Dask feature frame with LightGBM's distributed estimators (`lightgbm.dask`):
`TwoStageModel.fit`'s recipe, the features kept in the workers' memory and out-of-fold scores made where the
partitions lie (`map_partitions` with the fold's booster); only a few columns per stage come to the client, for the
calibrators and the conformal levels. pipelines/dask_train.py connects, featurizes and makes the `Predictor`."""

from __future__ import annotations

import logging
import time
import warnings
from types import SimpleNamespace

import dask.dataframe as dd
import numpy as np
import pandas as pd
from distributed import Client, wait
from lightgbm.dask import DaskLGBMClassifier, DaskLGBMRegressor

from pipelines.boosters import Regressor, raw_score
from pipelines.calibration import calibrate_groups, calibration_keys, new_calibrator
from pipelines.dask_features import LABEL_PREFIX
from pipelines.features import UNKNOWN
from pipelines.model import TwoStageModel, classifier_columns
from pipelines.model_config import ModelConfig, lgb_params, regression_objective
from pipelines.new_app import NEW_APP_ONLY

logger = logging.getLogger(__name__)
TOKENS, IS_TOOL, STAGE_ROLE, ROLE, FOLD, LOG = (
    f"{LABEL_PREFIX}{n}" for n in ("tokens", "is_tool", "stage_role", "role", "fold", "log")
)


def _with_column(part: pd.DataFrame, name: str, models: dict, features: list[str], predict) -> pd.DataFrame:
    """`part` plus column `name`: each row predicted by the model of its fold (out-of-fold), or by
    `models[None]` for every row."""
    out = np.zeros(len(part))
    for fold, model in models.items():
        rows = np.ones(len(part), bool) if fold is None else (part[FOLD] == fold).to_numpy()
        if rows.any():
            out[rows] = predict(model, part.loc[rows, features])
    return part.assign(**{name: out})


def _add_column(frame: dd.DataFrame, name: str, models: dict, features: list[str], predict) -> dd.DataFrame:
    meta = frame._meta.assign(**{name: np.zeros(0)})
    return frame.map_partitions(_with_column, name, models, features, predict, meta=meta).persist()


def _drop_roles(part: pd.DataFrame, rate: float, seed: int, partition_info=None) -> pd.DataFrame:
    """TwoStageModel's role dropout, drawn per partition (seeded by the partition's number)."""
    rng = np.random.default_rng([seed, (partition_info or {}).get("number", 0)])
    mask = rng.random(len(part)) < rate
    if not mask.any() or "role" not in part:
        return part
    part = part.copy()
    part.loc[mask, "role"] = UNKNOWN
    return part


def _calibrated(raw: pd.Series, calibrator) -> pd.Series:
    return pd.Series(calibrator.predict(raw.to_numpy()), index=raw.index, name="p_tool")


def _sklearn_objective(objective):
    """An `lgb.train` objective (preds, Dataset) as the scikit-learn API's (y_true, y_pred)."""
    return lambda y_true, y_pred: objective(y_pred, SimpleNamespace(get_label=lambda: y_true))


class DaskTwoStage:
    """Fits a `TwoStageModel` on a persisted Dask feature frame (features plus `label_*` columns)."""

    def __init__(self, client: Client, config: ModelConfig):
        self.client, self.config = client, config

    def _train(
        self,
        estimator,
        params: dict,
        objective: dict,
        frame: dd.DataFrame,
        features: list[str],
        label: str,
        fold: int | None = None,
        base: float | None = None,
    ):
        """One distributed LightGBM fit on the rows outside `fold` (all rows for None); its booster."""
        part = frame if fold is None else frame[frame[FOLD] != fold]
        init = None if base is None else part[LOG] * 0.0 + base
        booster_params = lgb_params(params, self.config, **objective)
        booster_params.pop("num_threads")  # lightgbm.dask gives each worker its own thread count
        model = estimator(client=self.client, n_estimators=params["n_estimators"], **booster_params)
        started = time.perf_counter()
        with warnings.catch_warnings():  # the estimator's default n_jobs, which lightgbm.dask replaces anyway
            warnings.filterwarnings("ignore", "Parameter n_jobs will be ignored", UserWarning)
            model.fit(part[features], part[label], init_score=init)
        logger.debug("%s on %s fold %s: %.1f s", estimator.__name__, label, fold, time.perf_counter() - started)
        return model.booster_

    def _per_fold(self, fit) -> dict:
        return {fold: fit(fold) for fold in range(self.config.folds)}

    def fit(self, frame: dd.DataFrame) -> TwoStageModel:
        cfg = self.config
        features = [c for c in frame.columns if not c.startswith(LABEL_PREFIX) and c not in NEW_APP_ONLY]
        # the out-of-fold record keeps each stage's role before dropout, as TwoStageModel.fit does
        frame = frame.assign(**{LOG: np.log1p(frame[TOKENS]), ROLE: frame["role"].astype(str)})
        frame = frame.map_partitions(_drop_roles, cfg.role_dropout, cfg.seed).persist()
        wait(frame)
        model = TwoStageModel(cfg)
        model.classifier_, frame = self._fit_classifier(model, frame, features)
        features2 = [*features, "p_tool"]
        model.regressor_, frame = self._fit_regressor(frame, features2)
        model.upper_, frame = self._fit_upper(frame, features2)
        local = frame[["p_tool", "log_pred", LOG, ROLE, "role", "upper_oof"]].compute()
        model.oof_ = pd.DataFrame(
            {
                "p_tool": local["p_tool"].to_numpy(),
                "log_pred": local["log_pred"].to_numpy(),
                "log_true": local[LOG].to_numpy(),
                "role": local[ROLE].astype(str).to_numpy(),
            }
        )
        self._calibrate_reserve(model, local)
        return model

    def _fit_classifier(self, model: TwoStageModel, frame: dd.DataFrame, features: list[str]):
        cfg = self.config
        features = classifier_columns(features, cfg)
        tool_rate = float(frame[IS_TOOL].mean().compute())
        if tool_rate in (0.0, 1.0):  # one class only: a constant, as TwoStageModel does
            models = {f: tool_rate for f in range(cfg.folds)}
            full = tool_rate
        else:
            fit = lambda fold: self._train(
                DaskLGBMClassifier, cfg.classifier, {"objective": "binary"}, frame, features, IS_TOOL, fold
            )
            models, full = self._per_fold(fit), fit(None)
        frame = _add_column(frame, "raw_oof", models, features, raw_score)
        raw, y = dd.compute(frame["raw_oof"], frame[IS_TOOL])
        calibrator = new_calibrator(cfg.calibration)
        model.calibrator_ = calibrator.fit(raw.to_numpy(), y.to_numpy())
        p_tool = frame["raw_oof"].map_partitions(_calibrated, model.calibrator_, meta=("p_tool", float))
        return full, frame.assign(p_tool=p_tool).persist()

    def _fit_regressor(self, frame: dd.DataFrame, features: list[str]):
        cfg = self.config
        objective = regression_objective(cfg.loss, cfg.under_weight)
        if callable(objective["objective"]):
            objective = {"objective": _sklearn_objective(objective["objective"])}
        sums = frame.groupby(FOLD)[LOG].agg(["sum", "count"]).compute()
        total_sum, total_count = float(sums["sum"].sum()), float(sums["count"].sum())
        base = lambda fold: (
            (total_sum - (sums["sum"].get(fold, 0.0) if fold is not None else 0.0))
            / (total_count - (sums["count"].get(fold, 0) if fold is not None else 0))
        )

        def fit(fold):
            boosters = [
                self._train(
                    DaskLGBMRegressor,
                    {**cfg.regressor, "seed": cfg.seed + b},
                    objective,
                    frame,
                    features,
                    LOG,
                    fold,
                    base(fold),
                )
                for b in range(cfg.regressor_bags)
            ]
            return Regressor(boosters[0], base(fold), boosters[1:])

        models, full = self._per_fold(fit), fit(None)
        return full, _add_column(frame, "log_pred", models, features, lambda m, X: m.predict(X))

    def _fit_upper(self, frame: dd.DataFrame, features: list[str]):
        objective = {"objective": "quantile", "alpha": self.config.bound_level}
        fit = lambda fold: self._train(DaskLGBMRegressor, self.config.quantile, objective, frame, features, LOG, fold)
        models, full = self._per_fold(fit), fit(None)
        return full, _add_column(frame, "upper_oof", models, features, lambda m, X: m.predict(X))

    def _calibrate_reserve(self, model: TwoStageModel, local: pd.DataFrame) -> None:
        """TwoStageModel.fit_reserve's conformal levels, on the out-of-fold misses brought to the client."""
        scores = (local[LOG] - local["upper_oof"]).to_numpy()
        roles = local["role"].astype(str).tolist()  # after dropout, as TwoStageModel.fit_reserve reads them
        model.global_q_, model.group_q_ = calibrate_groups(
            scores, calibration_keys(roles, local["p_tool"].to_numpy()), self.config
        )
