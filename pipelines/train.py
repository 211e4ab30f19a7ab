"""Training the predictor from params.yaml: the `train:` and `workflow:` sections as configs (`maestro train` reads
them too), and the two-stage model's fit on one machine or a Dask cluster (the DVC stage: pipelines/stages/train.py)."""

from __future__ import annotations

from dataclasses import fields, replace

import pandas as pd

from pipelines.features import Featurizer
from pipelines.model import ModelConfig
from pipelines.predictor import Predictor
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
