"""Where a served predictor comes from: a registry URI pinned to one version, or a directory."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from pipelines.predictor import Predictor

_ALIAS = re.compile(r"^models:/(?P<name>[^/@]+)@(?P<alias>[^/]+)$")
_VERSION = re.compile(r"^models:/(?P<name>[^/@]+)/(?P<version>\d+)$")


@dataclass(frozen=True)
class ModelSource:
    """A location resolved to something that cannot move under us: `uri` loads exactly `version`."""

    requested: str
    uri: str
    version: str


def resolve(location: str, tracking_uri: str | None = None) -> ModelSource:
    """Pin an alias to the version it points at now; a directory's version is a hash of its files."""
    alias = _ALIAS.match(location)
    if alias:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        version = client.get_model_version_by_alias(alias["name"], alias["alias"]).version
        return ModelSource(location, f"models:/{alias['name']}/{version}", str(version))
    pinned = _VERSION.match(location)
    if pinned:
        return ModelSource(location, location, pinned["version"])
    if location.startswith(("models:/", "runs:/")):
        raise ValueError(f"model {location!r}: use models:/NAME/VERSION, models:/NAME@ALIAS or a directory")
    return ModelSource(location, location, _directory_version(Path(location)))


def _directory_version(directory: Path) -> str:
    """The registry version an exported directory came from, else `dir-` + a hash of its files."""
    meta = directory / "meta.json"
    exported = json.loads(meta.read_text()).get("registry_version") if meta.exists() else None
    return str(exported) if exported else f"dir-{_directory_digest(directory)}"


def _directory_digest(directory: Path) -> str:
    model_file = directory / "predictor.joblib"
    if not model_file.exists():
        raise FileNotFoundError(f"{directory} is not a predictor directory (no predictor.joblib): "
                                "train one with `maestro train` or `dvc repro`, or pass a models:/ URI")
    digest = hashlib.sha256()
    for name in ("predictor.joblib", "priors.json", "meta.json"):
        path = directory / name
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def load(source: ModelSource, tracking_uri: str | None = None) -> Predictor:
    """Load the predictor a resolved source names (registry downloads go through MLflow)."""
    if tracking_uri and source.uri.startswith("models:/"):
        import mlflow

        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_registry_uri(tracking_uri)
    return Predictor.load(source.uri)


def share_embedder(new: Predictor, old: Predictor | None) -> Predictor:
    """Give `new` the old embedder (loaded model + prompt cache) when both embed the same way."""
    if old is None or new.featurizer is None or old.featurizer is None:
        return new
    if new.featurizer.config.embedder == old.featurizer.config.embedder:
        new.featurizer.embedder = old.featurizer.embedder
    return new
