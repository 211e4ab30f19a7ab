"""The two-stage predictor trained on a Dask cluster, saved as the same `Predictor` artifact.

The recipe is `TwoStageModel.fit`'s, with LightGBM's own distributed estimators (`lightgbm.dask`) in place
of `lgb.train`: out-of-fold raw classifier scores (folds by workflow group) → sigmoid/isotonic calibration →
the classifier on everything; out-of-fold and full asymmetric-loss regressors (`regressor_bags` of them) on
the features plus calibrated p_tool; the (1−α)-quantile model conformalised per (role, mode) group on its
out-of-fold misses. Features stay in the workers' memory, one pandas partition each; out-of-fold scores are
made where the partitions lie (`map_partitions` with the fold's booster). What comes to the client is a
few columns per stage (labels, role, out-of-fold scores) for the calibrators, the conformal levels, the
priors and the model's out-of-fold record, never the features or the prompts. The model's fit is
pipelines/dask_model.py (`DaskTwoStage`); this module connects, featurizes and makes the `Predictor`.

`address`: `local:N` starts a `LocalCluster` of N single-threaded worker processes; `tcp://HOST:PORT`
joins a running scheduler (its workers must see the trace directory and the embedding cache path).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pandas as pd
from distributed import Client, LocalCluster, wait

from pipelines.dask_features import (
    feature_frame,
    fit_featurizer,
    fold_of,
    is_trace_parquet,
    read_trace_parquet,
    to_trace_parquet,
    worker_cache,
)
from pipelines.dask_model import FOLD, IS_TOOL, STAGE_ROLE, TOKENS, DaskTwoStage
from pipelines.embedding import Embedder, make_embedder
from pipelines.features import FeaturizerConfig
from pipelines.model_config import ModelConfig
from pipelines.predictor import MIN_STAGES_FOR_MODEL, Predictor, fit_priors

logger = logging.getLogger(__name__)


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
    with (
        LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        yield client


# ---- the predictor -----------------------------------------------------------------------------------
def fit_predictor(client: Client, featurizer, frame: dd.DataFrame, config: ModelConfig) -> Predictor:
    """Model and priors on a feature frame (features plus `label_*` columns), as `Predictor.fit` does."""
    frame = frame.persist()
    labels = frame[[TOKENS, IS_TOOL, STAGE_ROLE]].compute()
    labels = pd.DataFrame(
        {
            "tokens": labels[TOKENS].to_numpy(),
            "is_tool": labels[IS_TOOL].astype(bool).to_numpy(),
            "role": labels[STAGE_ROLE].astype(str).to_numpy(),
        }
    )
    priors = fit_priors(labels, config.alpha)
    meta = {
        "num_train_stages": len(labels),
        "alpha": config.alpha,
        "trainer": "dask",
        "dask_workers": len(client.scheduler_info(n_workers=-1)["workers"]),
    }
    if len(labels) < MIN_STAGES_FOR_MODEL:
        return Predictor(None, None, priors, {**meta, "model": "priors-only"})
    model = DaskTwoStage(client, config).fit(frame)
    return Predictor(featurizer, model, priors, {**meta, "model": "two-stage"})


def train_predictor(
    traces: str | Path, featurizer_config: FeaturizerConfig, model_config: ModelConfig, dask_config: DaskTrainConfig
) -> Predictor:
    """`Predictor.train` on a cluster: a trace Parquet directory (any other trace file or directory is
    converted into one first, file by file), featurized per partition, the model fitted with lightgbm.dask."""
    with connect(dask_config.address) as client:
        return train_on(client, traces, featurizer_config, model_config, dask_config)


def train_on(
    client: Client,
    traces: str | Path,
    featurizer_config: FeaturizerConfig,
    model_config: ModelConfig,
    dask_config: DaskTrainConfig,
) -> Predictor:
    """`train_predictor` with a client already connected (`dask_config.address` is not used)."""
    with tempfile.TemporaryDirectory(prefix="maestro-traces-") as scratch:
        directory = traces if is_trace_parquet(traces) else to_trace_parquet(traces, scratch)
        stages = read_trace_parquet(directory)
        embedder = make_embedder(featurizer_config.embedder)
        cache = dask_config.embedding_cache if isinstance(embedder, Embedder) else None  # a static one caches none
        if cache:
            embedder.load_cache(cache)
        started = time.perf_counter()
        featurizer, num_stages = fit_featurizer(
            stages, featurizer_config, embedder, dask_config.pca_sample, model_config.seed
        )
        if num_stages == 0:
            raise ValueError(
                f"no labelled stages in {traces}: training needs output_tokens and is_tool_call on each stage"
            )
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
    frame = X.astype(numeric).assign(
        **{
            TOKENS: labels["tokens"].to_numpy(float),
            IS_TOOL: labels["is_tool"].astype(int).to_numpy(),
            STAGE_ROLE: labels["role"].astype(str).to_numpy(),
            FOLD: fold_of(labels["group"], folds),
        }
    )
    return dd.from_pandas(frame.reset_index(drop=True), npartitions=npartitions)
