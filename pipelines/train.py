"""DVC stage `train`: fit the two-stage model and priors on the training features, and the workflow-level model on
the same training stages (read from the traces); save the predictor."""
from __future__ import annotations

import argparse
import time
from dataclasses import fields, replace
from pathlib import Path

import joblib
import pandas as pd

from pipelines.contract import read_traces
from pipelines.features import Featurizer
from pipelines.model import ModelConfig
from pipelines.params import load_params
from pipelines.predictor import Predictor, select_stages
from pipelines.workflow_remaining import WorkflowConfig


def model_config(params: dict) -> ModelConfig:
    return ModelConfig(**{k: v for k, v in params.items() if k != "dask"})  # `dask`: where to train, not how


def workflow_config(params: dict) -> WorkflowConfig:
    """params.yaml `workflow:` over WorkflowConfig's defaults (`booster`: the keys given replace those keys)."""
    known = {f.name for f in fields(WorkflowConfig)}
    if set(params) - known:
        raise ValueError(f"params.yaml workflow: unknown keys {sorted(set(params) - known)}; known: {sorted(known)}")
    base, change = WorkflowConfig(), dict(params)
    if "booster" in change:
        change["booster"] = {**base.booster, **change["booster"]}
    if "calibration_bands" in change:
        change["calibration_bands"] = tuple(change["calibration_bands"])
    return replace(base, **change)


def fit(featurizer: Featurizer, X: pd.DataFrame, labels: pd.DataFrame, params: dict) -> Predictor:
    """On one machine, or on the Dask cluster `params["dask"]` names (local:N | tcp://HOST:PORT)."""
    if not params.get("dask"):
        return Predictor.fit(featurizer, X, labels, model_config(params))
    from pipelines import dask_train

    config = model_config(params)
    with dask_train.connect(dask_train.DaskTrainConfig(params["dask"]).address) as client:
        workers = len(client.scheduler_info(n_workers=-1)["workers"])
        frame = dask_train.features_frame(X, labels, config.folds, npartitions=2 * workers)
        return dask_train.fit_predictor(client, featurizer, frame, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--features", default="data/features")
    parser.add_argument("--traces", default="data/traces/collected.jsonl",
                        help="the traces featurize split: the workflow model is fitted on the training stages")
    parser.add_argument("--out", default="models/predictor")
    args = parser.parse_args()
    features = Path(args.features)
    featurizer = Featurizer.from_state(joblib.load(features / "featurizer.joblib"))
    X = pd.read_parquet(features / "train_X.parquet")
    labels = pd.read_parquet(features / "train_labels.parquet")
    started = time.perf_counter()
    predictor = fit(featurizer, X, labels, load_params("train"))
    stages = select_stages(read_traces(args.traces).stages, labels)
    predictor.fit_workflow(stages, workflow_config(load_params("workflow"))).fit_progressive(stages)
    predictor.meta["train_seconds"] = round(time.perf_counter() - started, 2)  # both models
    predictor.save(args.out)
    print(f"trained on {len(labels)} stages in {predictor.meta['train_seconds']} s → {args.out}")


if __name__ == "__main__":
    main()
