"""scripts/setup.sh and setup-vllm.sh with a linked (shared) environment: used as it is, nothing installed into it
(installing this checkout would repoint the other checkout's editable install)."""

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.mark.parametrize("script, venv", [("setup.sh", ".venv"), ("setup-vllm.sh", ".venv-vllm")])
def test_a_linked_environment_is_used_as_it_is(tmp_path, script, venv):
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPTS / script, tmp_path / "scripts" / script)
    shared = tmp_path / "shared-env"
    (shared / "bin").mkdir(parents=True)
    for tool in ("python", "pip"):  # any call to them would leave a mark
        (shared / "bin" / tool).write_text(f"#!/bin/sh\necho called > {tmp_path}/{tool}-called\n")
        (shared / "bin" / tool).chmod(0o755)
    (tmp_path / venv).symlink_to(shared)
    done = subprocess.run(["bash", str(tmp_path / "scripts" / script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"{venv} is a link to {shared}: using it as it is" in done.stdout
    assert not list(tmp_path.glob("*-called"))
