"""A clone of this repository with a small sample, and commands run in it (the real dvc, git and mlflow)."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def run(cmd: list[str], cwd: Path, env: dict | None = None) -> str:
    """Run `cmd` in `cwd` with this venv's tools first on PATH; its stdout, or a failure with both outputs."""
    env = {**os.environ, **(env or {}), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def small_clone(where: Path, **sections: dict) -> Path:
    """`git clone` of this repository's HEAD at `where`, its params.yaml sections updated with `sections` and
    committed (DVC experiments start from a clean commit)."""
    subprocess.run(["git", "clone", "-q", str(REPO), str(where)], check=True)
    params = yaml.safe_load((where / "params.yaml").read_text())
    for section, values in sections.items():
        params[section].update(values)
    (where / "params.yaml").write_text(yaml.safe_dump(params))
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "small sample"], where)
    return where
