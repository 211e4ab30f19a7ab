"""The two-stage predictor trained on a Dask cluster, saved as the same `Predictor` artifact.

The recipe is `TwoStageModel.fit`'s, with LightGBM's own distributed estimators (`lightgbm.dask`) in place
of `lgb.train`: out-of-fold raw classifier scores (folds by workflow group) → sigmoid/isotonic calibration →
the classifier on everything; out-of-fold and full asymmetric-loss regressors (`regressor_bags` of them) on
the features plus calibrated p_tool; the (1−α)-quantile model conformalised per (role, mode) group on its
out-of-fold misses. Features stay in the workers' memory, one pandas partition each; out-of-fold scores are
made where the partitions lie (`map_partitions` with the fold's booster). What comes to the client is a
few columns per stage (labels, role, out-of-fold scores) for the calibrators, the conformal levels, the
priors and the model's out-of-fold record, never the features or the prompts.

`address`: `local:N` starts a `LocalCluster` of N single-threaded worker processes; `tcp://HOST:PORT`
joins a running scheduler (its workers must see the trace directory and the embedding cache path).
"""
from __future__ import annotations

import contextlib
import logging
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import dask.dataframe as dd
import numpy as np
import pandas as pd
from distributed import Client, LocalCluster, wait
from lightgbm.dask import DaskLGBMClassifier, DaskLGBMRegressor

from pipelines.dask_features import (LABEL_PREFIX, feature_frame, fit_featurizer, fold_of, is_trace_parquet,
                                     read_trace_parquet, to_trace_parquet, worker_cache)
from pipelines.embedding import Embedder, make_embedder
from pipelines.features import UNKNOWN, FeaturizerConfig
from pipelines.boosters import Regressor, raw_score
from pipelines.calibration import calibrate_groups, calibration_keys, new_calibrator
from pipelines.model import ModelConfig, TwoStageModel, classifier_columns, lgb_params, regression_objective
from pipelines.new_app import NEW_APP_ONLY
from pipelines.predictor import MIN_STAGES_FOR_MODEL, Predictor, fit_priors

logger = logging.getLogger(__name__)
TOKENS, IS_TOOL, STAGE_ROLE, ROLE, FOLD, LOG = (f"{LABEL_PREFIX}{n}" for n in
                                                ("tokens", "is_tool", "stage_role", "role", "fold", "log"))


@dataclass(frozen=True)
class DaskTrainConfig:
    address: str = "local:2"  # local:N (a LocalCluster of N worker processes) | tcp://HOST:PORT
    pca_sample: int = 20_000  # stages whose embeddings the PCA is fitted on
    embedding_cache: str | None = None  # .npz shared by the workers (read at start, merged back at the end)

    def __post_init__(self) -> None:
        if not (self.address.startswith("tcp://") or self.address.removeprefix("local:").isdigit()):
            raise ValueError(f"--dask must be local:N or tcp://HOST:PORT, got {self.address!r}")
        if self.address.startswith("local:") and int(self.address.removeprefix("local:")) < 1:
            raise ValueError(f"--dask local:N needs N ≥ 1 workers, got {self.address!r}")
        if self.pca_sample < 2:
            raise ValueError(f"pca_sample must be ≥ 2, got {self.pca_sample}")


@contextlib.contextmanager
def connect(address: str):
    """A client of a new LocalCluster (`local:N`) or of a running scheduler (`tcp://...`)."""
    if address.startswith("tcp://"):
        with Client(address) as client:
            yield client
        return
    workers = int(address.removeprefix("local:"))
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        yield client


# ---- the model -------------------------------------------------------------------------------------
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

    def _train(self, estimator, params: dict, objective: dict, frame: dd.DataFrame, features: list[str], label: str,
               fold: int | None = None, base: float | None = None):
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
        model.oof_ = pd.DataFrame({"p_tool": local["p_tool"].to_numpy(), "log_pred": local["log_pred"].to_numpy(),
                                   "log_true": local[LOG].to_numpy(), "role": local[ROLE].astype(str).to_numpy()})
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
            fit = lambda fold: self._train(DaskLGBMClassifier, cfg.classifier, {"objective": "binary"}, frame,
                                           features, IS_TOOL, fold)
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
        base = lambda fold: (total_sum - (sums["sum"].get(fold, 0.0) if fold is not None else 0.0)) / \
            (total_count - (sums["count"].get(fold, 0) if fold is not None else 0))

        def fit(fold):
            boosters = [self._train(DaskLGBMRegressor, {**cfg.regressor, "seed": cfg.seed + b}, objective, frame,
                                    features, LOG, fold, base(fold)) for b in range(cfg.regressor_bags)]
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
            scores, calibration_keys(roles, local["p_tool"].to_numpy()), self.config)


# ---- the predictor -----------------------------------------------------------------------------------
def fit_predictor(client: Client, featurizer, frame: dd.DataFrame, config: ModelConfig) -> Predictor:
    """Model and priors on a feature frame (features plus `label_*` columns), as `Predictor.fit` does."""
    frame = frame.persist()
    labels = frame[[TOKENS, IS_TOOL, STAGE_ROLE]].compute()
    labels = pd.DataFrame({"tokens": labels[TOKENS].to_numpy(), "is_tool": labels[IS_TOOL].astype(bool).to_numpy(),
                           "role": labels[STAGE_ROLE].astype(str).to_numpy()})
    priors = fit_priors(labels, config.alpha)
    meta = {"num_train_stages": len(labels), "alpha": config.alpha, "trainer": "dask",
            "dask_workers": len(client.scheduler_info(n_workers=-1)["workers"])}
    if len(labels) < MIN_STAGES_FOR_MODEL:
        return Predictor(None, None, priors, {**meta, "model": "priors-only"})
    model = DaskTwoStage(client, config).fit(frame)
    return Predictor(featurizer, model, priors, {**meta, "model": "two-stage"})


def train_predictor(traces: str | Path, featurizer_config: FeaturizerConfig, model_config: ModelConfig,
                    dask_config: DaskTrainConfig) -> Predictor:
    """`Predictor.train` on a cluster: a trace Parquet directory (any other trace file or directory is
    converted into one first, file by file), featurized per partition, the model fitted with lightgbm.dask."""
    with connect(dask_config.address) as client:
        return train_on(client, traces, featurizer_config, model_config, dask_config)


def train_on(client: Client, traces: str | Path, featurizer_config: FeaturizerConfig, model_config: ModelConfig,
             dask_config: DaskTrainConfig) -> Predictor:
    """`train_predictor` with a client already connected (`dask_config.address` is not used)."""
    with tempfile.TemporaryDirectory(prefix="maestro-traces-") as scratch:
        directory = traces if is_trace_parquet(traces) else to_trace_parquet(traces, scratch)
        stages = read_trace_parquet(directory)
        embedder = make_embedder(featurizer_config.embedder)
        cache = dask_config.embedding_cache if isinstance(embedder, Embedder) else None  # a static one caches none
        if cache:
            embedder.load_cache(cache)
        started = time.perf_counter()
        featurizer, num_stages = fit_featurizer(stages, featurizer_config, embedder, dask_config.pca_sample,
                                                model_config.seed)
        if num_stages == 0:
            raise ValueError(f"no labelled stages in {traces}: training needs output_tokens and is_tool_call "
                             "on each stage")
        if cache:
            embedder.save_cache(cache)  # the PCA sample's vectors, for the workers to find
        logger.info("featurizer fitted on %d stages in %.1f s", num_stages, time.perf_counter() - started)
        frame = feature_frame(stages, featurizer, cache, model_config.folds).persist()
        wait(frame)
        logger.info("features of %d partitions in %.1f s", frame.npartitions, time.perf_counter() - started)
        predictor = fit_predictor(client, featurizer, frame, model_config)
        logger.info("model fitted in %.1f s", time.perf_counter() - started)
        if cache:
            _merge_worker_caches(client, embedder, featurizer_config, cache)
    return predictor


def _merge_worker_caches(client: Client, embedder: Embedder, config: FeaturizerConfig, path: str) -> None:
    for keys, vectors in client.run(worker_cache, config.embedder, path).values():
        for key, vector in zip(keys, vectors):
            embedder.remember(key, vector)
    embedder.save_cache(path)


def features_frame(X: pd.DataFrame, labels: pd.DataFrame, folds: int, npartitions: int) -> dd.DataFrame:
    """The DVC featurize stage's output (one machine's frames) as a Dask feature frame for `fit_predictor`."""
    numeric = {c: np.float64 for c, dtype in X.dtypes.items() if not isinstance(dtype, pd.CategoricalDtype)}
    frame = X.astype(numeric).assign(**{TOKENS: labels["tokens"].to_numpy(float),
                                        IS_TOOL: labels["is_tool"].astype(int).to_numpy(),
                                        STAGE_ROLE: labels["role"].astype(str).to_numpy(),
                                        FOLD: fold_of(labels["group"], folds)})
    return dd.from_pandas(frame.reset_index(drop=True), npartitions=npartitions)
