"""The workflow predictor's files in a predictor's model directory: the fitted object, and a JSON record of what
it is and of its checksum, checked before anything is unpickled."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import joblib

MODEL_FILE, META_FILE = "workflow_remaining.joblib", "workflow_remaining.json"


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_state(model, directory: str | Path, meta: dict) -> Path:
    """Write `model` and `meta` (plus the model file's sha256) into `directory`, created if need be."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    joblib.dump(model, directory / MODEL_FILE)
    record = {**meta, "sha256": file_digest(directory / MODEL_FILE)}
    (directory / META_FILE).write_text(json.dumps(record, indent=1, default=str))
    return directory


def load_state(directory: str | Path):
    """What save_state wrote; raises FileNotFoundError naming the missing file, ValueError on a checksum mismatch."""
    directory = Path(directory)
    for name in (MODEL_FILE, META_FILE):
        if not (directory / name).exists():
            raise FileNotFoundError(
                f"{directory / name} does not exist: fit a WorkflowRemainingModel and save() it "
                "into this directory (a predictor trained before the workflow model has none)"
            )
    expected = json.loads((directory / META_FILE).read_text()).get("sha256")
    if expected != file_digest(directory / MODEL_FILE):
        raise ValueError(
            f"{directory / MODEL_FILE} does not match the sha256 recorded in {META_FILE}: it changed "
            "after it was saved; not loading it (save the model again)"
        )
    return joblib.load(directory / MODEL_FILE)
