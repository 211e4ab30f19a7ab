"""DVC stage `train`: fit the two-stage model and priors on the training features, and the workflow-level model on
the same training stages (read from the traces); save the predictor."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import joblib
import pandas as pd

from maestro.contract import read_traces
from pipelines.features import Featurizer
from pipelines.params import load_params
from pipelines.predictor import select_stages
from pipelines.train import fit, workflow_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--features", default="data/features")
    parser.add_argument(
        "--traces",
        default="data/traces/collected.jsonl",
        help="the traces featurize split: the workflow model is fitted on the training stages",
    )
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
