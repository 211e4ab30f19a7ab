"""MLflow side of the predictor: the store location, logging the model (pipelines/pyfunc_model.py), alias guarding."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.models.model import ModelInfo
from mlflow.types import ColSpec, DataType, Schema
from mlflow.types.schema import AnyType

DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"
EXPERIMENT = "maestro-stage-length"
MODEL_NAME = "stage-length"
CHECKSUM_TAG = "predictor_sha256"  # model-version tag: the predictor files' digest, checked before loading


PYFUNC_CODE = Path(__file__).with_name("pyfunc_model.py")  # the model's code (models-from-code)
# The packages the model's code imports, logged with it: pipelines/ and maestro/ (the prediction type it answers in).
CODE_PATHS = [str(PYFUNC_CODE.parent), str(PYFUNC_CODE.parent.parent / "maestro")]
# A made-up stage, not one from the traces: the example is stored with every model version, and traces hold
# users' prompts.
INPUT_EXAMPLE = pd.DataFrame(
    [
        {
            "workflow_id": "example-1",
            "stage_id": "plan",
            "role": "planner",
            "app": "travel_planner",
            "prompt": "Plan a three-day trip to Lisbon for two: flights, hotel and a day plan.",
            "parent_ids": [],
            "n_tools": 2,
            "tool_names": ["search_flights", "search_hotels"],
            "interactive": True,
        },
        {
            "workflow_id": "example-1",
            "stage_id": "flights",
            "role": "flight_agent",
            "app": "travel_planner",
            "prompt": [{"role": "user", "content": "Find a return flight Berlin-Lisbon, 3-6 May."}],
            "parent_ids": ["plan"],
            "n_tools": 1,
            "tool_names": ["search_flights"],
            "interactive": True,
        },
    ]
)


def signature() -> ModelSignature:
    """The model's wire format: contract stages in (DESIGN §3: ids, role and prompt required; the prompt a text or
    a list of OpenAI-style messages), one prediction per stage out (`Prediction.to_dict()`: the stage's fields, then
    its workflow's remaining work, the `wf_*` fields).

    Where some stages of a batch lack an optional field, its frame column holds NaN, which MLflow's long and array
    checks refuse (and it will not take ints as doubles): counts and name lists are therefore Any here, and the
    contract (maestro/contract.py) checks them when the model parses each stage."""

    def optional(kind, name: str) -> ColSpec:
        return ColSpec(kind, name, required=False)

    inputs = Schema(
        [
            ColSpec(DataType.string, "workflow_id"),
            ColSpec(DataType.string, "stage_id"),
            ColSpec(DataType.string, "role"),
            ColSpec(AnyType(), "prompt"),
            *(optional(DataType.string, name) for name in ("app", "model")),
            *(
                optional(AnyType(), name)
                for name in ("parent_ids", "tool_names", "call_index", "depth", "n_tools", "prompt_tokens")
            ),
            optional(DataType.boolean, "interactive"),
        ]
    )
    outputs = Schema(
        [
            ColSpec(DataType.string, "workflow_id"),
            ColSpec(DataType.string, "stage_id"),
            ColSpec(DataType.double, "p_tool"),
            ColSpec(DataType.long, "tokens_pred"),
            ColSpec(DataType.long, "tokens_reserve"),
            ColSpec(DataType.string, "fallback_level"),
            ColSpec(DataType.string, "history"),
            *(ColSpec(DataType.double, n) for n in ("wf_remaining_calls", "wf_remaining_tokens")),
            *(ColSpec(DataType.long, n) for n in ("wf_remaining_calls_upper", "wf_remaining_tokens_upper")),
            ColSpec(DataType.string, "wf_fallback_level"),
        ]
    )
    return ModelSignature(inputs, outputs)


def log_predictor(directory: str | Path, pip_requirements: list[str], params: dict | None = None) -> ModelInfo:
    """Log a saved predictor as a pyfunc model of the active run (models-from-code, with its signature, an input
    example and the pipelines/ and maestro/ packages as code), registered as MODEL_NAME; `params`: the recipe, shown on
    the logged model too. The logged model's info."""
    return mlflow.pyfunc.log_model(
        name="predictor",
        python_model=str(PYFUNC_CODE),
        artifacts={"predictor": str(directory)},
        code_paths=CODE_PATHS,
        signature=signature(),
        input_example=INPUT_EXAMPLE,
        params=params,
        registered_model_name=MODEL_NAME,
        pip_requirements=pip_requirements,
    )


def register_predictor(directory: str | Path, pip_requirements: list[str]) -> str:
    """log_predictor, then record the predictor files' checksum on the new version; the version."""
    return tag_checksum(log_predictor(directory, pip_requirements), directory)


def tag_checksum(info: ModelInfo, directory: str | Path) -> str:
    """Record the predictor files' digest on the version `info` registered (loading checks it); the version."""
    from mlflow import MlflowClient

    from pipelines.artifact import artifact_digest

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
