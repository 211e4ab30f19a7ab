"""params.yaml access for DVC stages: each stage reads only its own section."""

from __future__ import annotations

from pathlib import Path

import yaml

PARAMS_FILE = Path("params.yaml")


def load_params(section: str, path: str | Path = PARAMS_FILE, default: dict | None = None) -> dict:
    """One section of a params file; `default`: what a file without that section gets (else KeyError)."""
    params = yaml.safe_load(Path(path).read_text()) or {}
    if section not in params and default is not None:
        return default
    if section not in params:
        raise KeyError(f"{path} has no '{section}' section; see the README for the expected params")
    return params[section] or {}
