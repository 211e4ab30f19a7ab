"""`maestro train` and `maestro predict`: the predictor on any contract trace file, outside DVC."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from pipelines.contract import read_traces
from pipelines.featurize import featurizer_config
from pipelines.params import load_params
from pipelines.predictor import Predictor
from pipelines.train import model_config

DEFAULT_PARAMS = Path(__file__).resolve().parent.parent / "params.yaml"


def _read(path: str):
    result = read_traces(path)
    print(result.report(), file=sys.stderr)
    return result.stages


def train_command(args: argparse.Namespace) -> int:
    stages = _read(args.traces)
    started = time.perf_counter()
    predictor = Predictor.train(stages, featurizer_config(load_params("featurize", args.params)),
                                model_config(load_params("train", args.params)), progress=True)
    predictor.meta.update(train_seconds=round(time.perf_counter() - started, 2), traces=str(args.traces))
    predictor.save(args.out)
    print(f"trained on {predictor.meta['num_train_stages']} stages in {predictor.meta['train_seconds']} s "
          f"({predictor.meta['model']}) → {args.out}")
    return 0


def predict_command(args: argparse.Namespace) -> int:
    predictor = Predictor.load(args.model)
    stages = _read(args.traces)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as handle:
        for start in tqdm(range(0, len(stages), args.batch_size), desc="predicting", unit="batch"):
            for prediction in predictor.predict(stages[start:start + args.batch_size]):
                handle.write(json.dumps(prediction.to_dict()) + "\n")
    print(f"wrote {len(stages)} predictions to {out}")
    return 0


def register(subparsers) -> None:
    train = subparsers.add_parser("train", help="train the stage-length predictor on a trace file")
    train.add_argument("--traces", required=True, help="contract JSONL or Parquet file of labelled stages")
    train.add_argument("--out", required=True, help="directory to write the predictor to")
    train.add_argument("--params", default=str(DEFAULT_PARAMS), help="params.yaml with featurize/train sections")
    train.set_defaults(func=train_command)
    predict = subparsers.add_parser("predict", help="predict every stage of a trace file")
    predict.add_argument("--model", required=True, help="predictor directory or models:/stage-length@champion")
    predict.add_argument("--traces", required=True)
    predict.add_argument("--out", required=True, help="JSONL: one prediction per input stage")
    predict.add_argument("--batch-size", type=int, default=512)
    predict.set_defaults(func=predict_command)
