"""Where the gateway's trained predictor comes from (`predictor.model`): a predictor directory (`dvc repro` trains
the champion's into `models/predictor`), or a registry URI such as `models:/stage-length@champion`, read from the
MLflow store `maestro serve` reads by default (`sqlite:///mlruns/mlflow.db`, from the directory the gateway starts
in; `MLFLOW_TRACKING_URI` overrides it). A URI is pinned to the version its alias names now, and its files are
checked against the checksum the registry recorded (predictor_service/loading.py, as the service loads it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pipelines.predictor import Predictor
from predictor_service import loading
from predictor_service.config import DEFAULT_TRACKING_URI

REGISTRY_SCHEMES = ("models:/", "runs:/")


class ModelNotFound(ValueError):
    """`predictor.model` names nothing the gateway can load; the message is one line: the location, the store, what
    to do."""


def tracking_uri(environ: Mapping[str, str] | None = None) -> str:
    """The MLflow store a registry URI is read from: `MLFLOW_TRACKING_URI`, else `maestro serve`'s default."""
    return (os.environ if environ is None else environ).get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def load_model(location: str, environ: Mapping[str, str] | None = None) -> tuple[Predictor, str]:
    """The predictor at `location` and its version (the registry's, or `dir-<hash of its files>` for a directory).
    Nothing is written: a store that does not exist is not created."""
    if not location.startswith(REGISTRY_SCHEMES):
        try:
            return Predictor.load(location), loading.resolve(location).version
        except FileNotFoundError as error:
            raise ModelNotFound(f"gateway config predictor.model: {error}") from None
    store = tracking_uri(environ)
    database = Path(store.removeprefix("sqlite:///")) if store.startswith("sqlite:///") else None
    advice = (
        "register one with `bash scripts/pipeline.sh` (or `dvc repro`) in the directory the gateway starts in, "
        "set MLFLOW_TRACKING_URI to the store that holds it, or give the champion's directory, models/predictor"
    )
    if database is not None and not database.exists():
        raise ModelNotFound(
            f"gateway config predictor.model {location}: the MLflow store {store} does not exist "
            f"(no file {database.resolve()}); {advice}"
        )
    try:
        source = loading.resolve(location, store)
        return loading.load(source, store), source.version
    except Exception as error:  # noqa: BLE001 — MLflow's errors (not found, bad URI, checksum) become one line
        cause = " ".join(str(error).split())[:300]
        raise ModelNotFound(
            f"gateway config predictor.model {location}: not loadable from the MLflow store {store} "
            f"({type(error).__name__}: {cause}); {advice}"
        ) from None
