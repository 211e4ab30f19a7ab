"""Training on Dask: the trace Parquet layout, and a real 2-process LocalCluster matching one machine's quality."""

from __future__ import annotations

import json
from pathlib import Path

import dask
import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest

from maestro.contract import read_traces
from pipelines.dask_features import (
    feature_frame,
    fit_featurizer,
    is_trace_parquet,
    labelled_stages,
    read_trace_parquet,
    to_trace_parquet,
)
from pipelines.dask_model import _sklearn_objective
from pipelines.dask_train import DaskTrainConfig, train_predictor
from pipelines.embedding import Embedder, EmbedderConfig
from pipelines.features import Featurizer, FeaturizerConfig
from pipelines.featurize import grouped_split
from pipelines.metrics import quality
from pipelines.model_config import ModelConfig, asymmetric_l2
from pipelines.predictor import Predictor, label_frame
from pipelines.synth import generate

DEV_TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "dev-traces" / "dev_traces.jsonl"
needs_dev_traces = pytest.mark.skipif(not DEV_TRACES.exists(), reason=f"{DEV_TRACES} not found")
# A lighter model than params.yaml's (both sides use it): the comparison is of the trainers, not the recipe.
SMALL = dict(subsample=0.8, subsample_freq=1, colsample_bytree=0.8, learning_rate=0.1, num_leaves=15)
MODEL = ModelConfig(
    folds=3,
    regressor_bags=1,
    classifier=dict(n_estimators=100, min_child_samples=10, **SMALL),
    quantile=dict(n_estimators=100, min_child_samples=20, **SMALL),
    regressor=dict(n_estimators=150, min_child_samples=10, extra_trees=True, **SMALL),
)


def test_config_names_the_cluster_or_refuses():
    assert DaskTrainConfig("local:2").address == "local:2"
    assert DaskTrainConfig("tcp://10.0.0.5:8786").address.startswith("tcp://")
    for bad in ("local:0", "local:two", "10.0.0.5:8786"):
        with pytest.raises(ValueError, match="local:N"):
            DaskTrainConfig(bad)


def test_squared_loss_objective_is_the_same_through_the_estimator_api():
    """lightgbm.dask takes scikit-learn-style objectives: the adapter gives lgb.train's boosters."""
    rng = np.random.default_rng(0)
    X, y = pd.DataFrame({"x": rng.random(500)}), rng.random(500)
    params = dict(verbosity=-1, num_threads=1, deterministic=True, force_row_wise=True)
    direct = lgb.train({**params, "objective": asymmetric_l2(3.0)}, lgb.Dataset(X, y, init_score=np.full(500, 0.5)), 30)
    adapted = lgb.LGBMRegressor(n_estimators=30, objective=_sklearn_objective(asymmetric_l2(3.0)), **params)
    adapted.fit(X, y, init_score=np.full(500, 0.5))
    np.testing.assert_allclose(adapted.booster_.predict(X), direct.predict(X), rtol=1e-6)


@needs_dev_traces
def test_parquet_layout_keeps_each_workflow_in_one_partition(tmp_path):
    # Stages written in reverse order, 100 to a file: workflows straddle files until the shuffle.
    stages = read_traces(DEV_TRACES, derive=False).stages[::-1]
    directory = to_trace_parquet(_jsonl(stages, tmp_path / "traces.jsonl"), tmp_path / "parquet", stages_per_file=100)
    assert is_trace_parquet(directory) and not is_trace_parquet(tmp_path)
    frame = read_trace_parquet(directory)
    with dask.config.set(scheduler="synchronous"):
        parts = [frame.get_partition(i).compute() for i in range(frame.npartitions)]
    owners = pd.concat([p[["workflow_id"]].assign(part=i) for i, p in enumerate(parts)]).drop_duplicates()
    assert owners["workflow_id"].is_unique  # no workflow in two partitions
    assert sum(len(p) for p in parts) == len(stages)
    assert sum(len(labelled_stages(p)) for p in parts) == sum(
        s.is_labelled and s.is_tool_call is not None for s in stages
    )
    with pytest.raises(ValueError, match="trace Parquet"):
        read_trace_parquet(tmp_path / "nowhere")


def _scores(predictor: Predictor, test) -> dict:
    predictions = pd.DataFrame([p.to_dict() for p in predictor.predict(test)])
    return quality(label_frame(test).assign(**{c: predictions[c] for c in ("p_tool", "tokens_pred", "tokens_reserve")}))


@pytest.mark.slow
def test_two_worker_cluster_matches_one_machine_on_the_same_split(tmp_path):
    stages = read_traces(_jsonl(generate(3000, seed=3), tmp_path / "synthetic.jsonl")).stages
    train_idx, test_idx = grouped_split(stages, 0.25, seed=0)
    train, test = [stages[i] for i in train_idx], [stages[i] for i in test_idx]
    features = FeaturizerConfig(use_embedding=False)  # the embeddings' partition path: the test below
    single = Predictor.train(train, features, MODEL)
    directory = to_trace_parquet(_jsonl(train, tmp_path / "train.jsonl"), tmp_path / "parquet", stages_per_file=600)
    distributed = train_predictor(directory, features, MODEL, DaskTrainConfig("local:2"))
    assert distributed.meta["dask_workers"] == 2 and distributed.meta["num_train_stages"] == len(train)
    assert distributed.featurizer.categories_ == single.featurizer.categories_  # counted over all partitions
    assert distributed.priors == single.priors

    reloaded = Predictor.load(distributed.save(tmp_path / "predictor"))  # the artifact the service loads
    assert [p.tokens_reserve for p in reloaded.predict(test)] == [p.tokens_reserve for p in distributed.predict(test)]
    one, many = _scores(single, test), _scores(distributed, test)
    # Within noise: one machine's own figures on this split move by up to AUC 0.01, τ 0.02, MAE 4 % and
    # above-reserve 0.02 between seeds 0-4; the cluster also partitions the data differently.
    assert abs(many["auc"] - one["auc"]) <= 0.03, (one, many)
    assert abs(many["kendall_tau"] - one["kendall_tau"]) <= 0.04, (one, many)
    assert 0.9 <= many["mae"] / one["mae"] <= 1.1, (one, many)
    assert abs(many["under_rate"] - one["under_rate"]) <= 0.04, (one, many)
    assert np.isfinite(distributed.model.global_q_) and len(distributed.model.oof_) == len(train)


@needs_dev_traces
def test_partitions_give_one_machines_features_with_embeddings(tmp_path):
    """Per-partition features (MiniLM → PCA on the sample, cache shared) equal Featurizer.transform's."""
    train = read_traces(DEV_TRACES).stages[:240]  # whole workflows: the file is in workflow order
    features = FeaturizerConfig(pca_dims=4, embedder=EmbedderConfig(tail_chars=64, max_seq_length=16))
    embedder, cache = Embedder(features.embedder), tmp_path / "embeddings.npz"
    expected = Featurizer(features, embedder).fit(train).transform(train)
    embedder.save_cache(cache)
    directory = to_trace_parquet(_jsonl(train, tmp_path / "train.jsonl"), tmp_path / "parquet", stages_per_file=80)
    with dask.config.set(scheduler="synchronous"):
        traces = read_trace_parquet(directory)
        featurizer, num_stages = fit_featurizer(traces, features, Embedder(features.embedder), pca_sample=1000)
        frame = feature_frame(traces, featurizer, str(cache), folds=3).compute()
    assert num_stages == len(train) and list(frame.columns[: len(expected.columns)]) == list(expected.columns)
    order = list(expected.columns)  # partitions come back in another order: compare rows sorted on every column
    got = frame[order].sort_values(order).reset_index(drop=True)
    want = expected.sort_values(order).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False, atol=1e-4)
    assert frame["label_fold"].between(0, 2).all()


def _jsonl(stages, path: Path) -> Path:
    path.write_text(
        "".join(
            (s.model_dump_json(exclude_none=True) if hasattr(s, "model_dump_json") else json.dumps(s)) + "\n"
            for s in stages
        )
    )
    return path
