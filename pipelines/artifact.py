"""A saved predictor's checksum: which of its files it covers, and the check made before anything is unpickled."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from maestro.progressive import TABLE_FILE
from pipelines.workflow_store import META_FILE, MODEL_FILE

ARTIFACT_FILES = ("predictor.joblib", "priors.json")  # what the checksum covers (meta.json records it)...
WORKFLOW_DIR = "workflow"  # ...with the workflow-level model's files in here, where the predictor has one


class ArtifactMismatch(ValueError):
    """A predictor's files do not match the checksum recorded for them; refused before anything is deserialised."""


def artifact_files(directory: str | Path) -> list[str]:
    """The files of a saved predictor the checksum covers: ARTIFACT_FILES, then the workflow model's and the
    progressive table where present (a predictor saved before it had them keeps its checksum)."""
    workflow = [
        f"{WORKFLOW_DIR}/{name}" for name in (MODEL_FILE, META_FILE) if (Path(directory) / WORKFLOW_DIR / name).exists()
    ]
    progressive = [TABLE_FILE] if (Path(directory) / TABLE_FILE).exists() else []
    return [*ARTIFACT_FILES, *workflow, *progressive]


def artifact_digest(directory: str | Path) -> str:
    """SHA-256 over a saved predictor's files (names and bytes): what save() and registration record."""
    digest = hashlib.sha256()
    for name in artifact_files(directory):
        digest.update(name.encode())
        digest.update((Path(directory) / name).read_bytes())
    return digest.hexdigest()


def verify_artifact(directory: Path, expected_sha256: str | None = None, require: bool = False) -> str:
    """Check the files against the checksum given (e.g. the registry's) and the one meta.json records.

    `require`: refuse a predictor with no checksum to check against. Returns the files' digest."""
    meta = json.loads((directory / "meta.json").read_text()) if (directory / "meta.json").exists() else {}
    checks = {"given": expected_sha256, "recorded in meta.json": meta.get("artifact_sha256")}
    checks = {where: value for where, value in checks.items() if value}
    if require and not checks:
        raise ArtifactMismatch(
            "the predictor has no recorded checksum: save it again with this version "
            "(`maestro train` or `dvc repro`), or register it with `dvc repro`"
        )
    actual = artifact_digest(directory)
    for where, value in checks.items():
        if value != actual:
            raise ArtifactMismatch(
                f"the predictor's files do not match the checksum {where}: "
                "they changed after they were saved; not loading them"
            )
    return actual
