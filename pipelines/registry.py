"""MLflow side of the predictor: the store location, the pyfunc wrapper, and alias guarding."""
from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd

DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"
EXPERIMENT = "maestro-stage-length"
MODEL_NAME = "stage-length"
CHECKSUM_TAG = "predictor_sha256"  # model-version tag: the predictor files' digest, checked before loading


def register_predictor(directory: str | Path, pip_requirements: list[str]) -> str:
    """Log a saved predictor as a pyfunc model in the active run, register it, record its checksum; the version."""
    from mlflow import MlflowClient

    from pipelines.predictor import artifact_digest

    info = mlflow.pyfunc.log_model(name="predictor", python_model=StageLengthPyfunc(),
                                   artifacts={"predictor": str(directory)}, registered_model_name=MODEL_NAME,
                                   pip_requirements=pip_requirements)
    version = str(info.registered_model_version)
    MlflowClient().set_model_version_tag(MODEL_NAME, version, CHECKSUM_TAG, artifact_digest(directory))
    return version


def registered_checksum(uri: str, tracking_uri: str | None = None) -> str | None:
    """The checksum recorded at registration for `models:/NAME/VERSION`, None when none was recorded."""
    from mlflow import MlflowClient

    name, version = uri.removeprefix("models:/").split("/", 1)
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    return client.get_model_version(name, version).tags.get(CHECKSUM_TAG)


def use_store(tracking_uri: str = DEFAULT_TRACKING_URI, artifact_root: str = "mlruns/artifacts") -> str:
    """Point MLflow at the project's store (SQLite metadata + artifacts, both under mlruns/)."""
    if tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    if mlflow.get_experiment_by_name(EXPERIMENT) is None:
        mlflow.create_experiment(EXPERIMENT, artifact_location=Path(artifact_root).resolve().as_uri())
    mlflow.set_experiment(EXPERIMENT)
    return tracking_uri


class StageLengthPyfunc(mlflow.pyfunc.PythonModel):
    """pyfunc face of the predictor: a frame of contract stages in, a frame of predictions out."""

    def load_context(self, context) -> None:
        from pipelines.predictor import Predictor

        self.predictor = Predictor.load(context.artifacts["predictor"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from pipelines.contract import parse_record

        stages = [parse_record({k: v for k, v in row.items() if v is not None})
                  for row in model_input.to_dict(orient="records")]
        return pd.DataFrame([p.to_dict() for p in self.predictor.predict(stages)])


LOWER_IS_BETTER = {"mae": 0.02, "over_reservation": 0.05}
HIGHER_IS_BETTER = {"auc": 0.005, "kendall_tau": 0.01}


def not_worse(candidate: dict, champion: dict, alpha: float) -> tuple[bool, list[str]]:
    """Is the candidate not worse than the champion on the guarded metrics (with small tolerances)?"""
    reasons = []
    for metric, tolerance in LOWER_IS_BETTER.items():
        if _both(candidate, champion, metric) and candidate[metric] > champion[metric] * (1 + tolerance):
            reasons.append(f"{metric} {candidate[metric]:.4f} > champion {champion[metric]:.4f}")
    for metric, tolerance in HIGHER_IS_BETTER.items():
        if _both(candidate, champion, metric) and candidate[metric] < champion[metric] - tolerance:
            reasons.append(f"{metric} {candidate[metric]:.4f} < champion {champion[metric]:.4f}")
    allowed = max(champion.get("under_rate") or 0.0, alpha) + 0.005
    if (candidate.get("under_rate") or 0.0) > allowed:
        reasons.append(f"under_rate {candidate['under_rate']:.4f} > allowed {allowed:.4f}")
    return not reasons, reasons


def _both(a: dict, b: dict, key: str) -> bool:
    return a.get(key) is not None and b.get(key) is not None
