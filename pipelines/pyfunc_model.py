"""The `stage-length` model as MLflow loads it (models-from-code): contract stages in, predictions out.

pipelines/registry.py logs this file as the model's code, the saved predictor as its artifact `predictor` and the
pipelines/ and maestro/ packages as its `code_paths`; so `mlflow.pyfunc.load_model` and `mlflow models serve` need
neither this repository installed nor a pickled wrapper. MLflow runs the file to load the model: `set_model` names it.
"""

from __future__ import annotations

import math

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


def _present(value) -> bool:
    """A frame cell that holds a value: not None, not a missing number (NaN)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


class StageLengthPyfunc(PythonModel):
    """A frame of contract stages (DESIGN §3; labels ignored) in, a frame of predictions out: one row per stage,
    `Prediction.to_dict()`'s columns (the stage's, then its workflow's remaining work, `wf_*`)."""

    def load_context(self, context) -> None:
        from pipelines.predictor import Predictor

        self.predictor = Predictor.load(context.artifacts["predictor"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from maestro.contract import parse_record

        stages = [
            parse_record({k: v for k, v in row.items() if _present(v)}) for row in model_input.to_dict(orient="records")
        ]
        return pd.DataFrame([p.to_dict() for p in self.predictor.predict(stages)])


mlflow.models.set_model(StageLengthPyfunc())
