"""DVC stage `train`: fit the two-stage model and priors on the training features; save the predictor."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import joblib
import pandas as pd

from pipelines.features import Featurizer
from pipelines.model import ModelConfig
from pipelines.params import load_params
from pipelines.predictor import Predictor


def model_config(params: dict) -> ModelConfig:
    return ModelConfig(**params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--features", default="data/features")
    parser.add_argument("--out", default="models/predictor")
    args = parser.parse_args()
    features = Path(args.features)
    featurizer = Featurizer.from_state(joblib.load(features / "featurizer.joblib"))
    X = pd.read_parquet(features / "train_X.parquet")
    labels = pd.read_parquet(features / "train_labels.parquet")
    started = time.perf_counter()
    predictor = Predictor.fit(featurizer, X, labels, model_config(load_params("train")))
    predictor.meta["train_seconds"] = round(time.perf_counter() - started, 2)
    predictor.save(args.out)
    print(f"trained on {len(labels)} stages in {predictor.meta['train_seconds']} s → {args.out}")


if __name__ == "__main__":
    main()
