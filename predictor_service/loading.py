"""Where a served predictor comes from: a registry URI pinned to one version, or a directory.

Loading a predictor unpickles it, so the service loads only what it may: a reload names a version of
the registered model or a directory under the configured model root, and every load checks the files
against the checksum recorded when the model was saved or registered before deserialising them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from pipelines.artifact import ArtifactMismatch, artifact_digest
from pipelines.predictor import Predictor
from pipelines.registry import CHECKSUM_TAG, MODEL_NAME, registered_checksum

_ALIAS = re.compile(r"^models:/(?P<name>[^/@]+)@(?P<alias>[^/]+)$")
_VERSION = re.compile(r"^models:/(?P<name>[^/@]+)/(?P<version>\d+)$")


class LocationRefused(PermissionError):
    """A reload location this service may not load from (the message never echoes the location)."""


def check_reload_location(location: str, model_root: str | None) -> str:
    """The location a reload may load: a models:/ URI of the served model name, or a directory under
    `model_root` (a relative path is taken from the root). Anything else raises LocationRefused."""
    registry = _ALIAS.match(location) or _VERSION.match(location)
    if registry:
        if registry["name"] != MODEL_NAME:
            raise LocationRefused(
                f"only the registered model {MODEL_NAME!r} can be loaded: "
                f"use models:/{MODEL_NAME}/VERSION or models:/{MODEL_NAME}@ALIAS"
            )
        return location
    if location.startswith(("models:/", "runs:/")):
        raise LocationRefused(f"use models:/{MODEL_NAME}/VERSION or models:/{MODEL_NAME}@ALIAS")
    if model_root is None:
        raise LocationRefused(
            "directories cannot be reloaded on this node: start it with MAESTRO_MODEL_ROOT set, "
            f"or reload models:/{MODEL_NAME}/VERSION"
        )
    root = Path(model_root).resolve()
    path = (root / location).resolve()  # an absolute location replaces the root; symlinks are followed
    if not path.is_relative_to(root):
        raise LocationRefused(
            "model directories must lie under this node's model root (MAESTRO_MODEL_ROOT); give a path relative to it"
        )
    return str(path)


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
    if not (directory / "predictor.joblib").exists():
        raise FileNotFoundError(
            f"{directory} is not a predictor directory (no predictor.joblib): "
            "train one with `maestro train` or `dvc repro`, or pass a models:/ URI"
        )
    return artifact_digest(directory)[:12]


def load(source: ModelSource, tracking_uri: str | None = None) -> Predictor:
    """Load the predictor a resolved source names, after checking its files against their recorded checksum
    (the registry's tag for a models:/ URI, meta.json for a directory); unchecked predictors are refused."""
    expected = None
    if source.uri.startswith("models:/"):
        import mlflow

        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
            mlflow.set_registry_uri(tracking_uri)
        expected = registered_checksum(source.uri, tracking_uri)
        if expected is None:  # the artifact's own meta.json could be rewritten with it: only the registry counts
            raise ArtifactMismatch(
                f"{source.uri} was registered without a checksum (tag {CHECKSUM_TAG}): "
                "register it again with `dvc repro` (pipelines/stages/register.py)"
            )
    return Predictor.load(source.uri, expected_sha256=expected, require_checksum=True)


def share_embedder(new: Predictor, old: Predictor | None) -> Predictor:
    """Give `new` the old embedder (loaded model + prompt cache) when both embed the same way."""
    if old is None or new.featurizer is None or old.featurizer is None:
        return new
    if new.featurizer.config.embedder == old.featurizer.config.embedder:
        new.featurizer.embedder = old.featurizer.embedder
    return new
