"""`bentoml build` from the repository's bentofile.yaml, for real and offline: the Bento holds the service's code
and the baked-in predictor, imports without the repository, and pins what pyproject.toml pins."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
BENTOFILE = yaml.safe_load((REPO / "bentofile.yaml").read_text())
# Imports the service from the Bento's src/ alone and prints every repository module that came from elsewhere.
IMPORT_CHECK = """
import sys
sys.path.insert(0, '.')
import predictor_service.service
src = __import__('os').path.abspath('.')
print('\\n'.join(sorted(name for name, module in sys.modules.items()
      if name.split('.')[0] in {'maestro', 'pipelines', 'predictor_service', 'serving'}
      and getattr(module, '__file__', None) and not module.__file__.startswith(src))))
"""


@pytest.fixture(scope="module")
def bento(tmp_path_factory, model_dir) -> Path:
    """The built Bento's directory: the build context is the bentofile's included sources and a fast predictor
    at build/predictor, where `predictor_service.export` puts it."""
    context = tmp_path_factory.mktemp("bento-context")
    shutil.copy(REPO / "bentofile.yaml", context)
    for top in {pattern.split("/")[0] for pattern in BENTOFILE["include"]} - {"build"}:
        shutil.copytree(REPO / top, context / top, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(model_dir, context / "build" / "predictor")
    home = tmp_path_factory.mktemp("bentoml-home")
    env = {**os.environ, "BENTOML_HOME": str(home), "BENTOML_DO_NOT_TRACK": "True", "HF_HUB_OFFLINE": "1"}
    bentoml = Path(sys.executable).with_name("bentoml")
    built = subprocess.run(
        [str(bentoml), "build", "-o", "tag", str(context)],
        cwd=context,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    tag = re.search(r"maestro_predictor:\w+", built.stdout).group(0)
    return home / "bentos" / "maestro_predictor" / tag.split(":")[1]


def test_the_bento_describes_the_service_and_bakes_in_the_predictor(bento, model_dir):
    described = yaml.safe_load((bento / "bento.yaml").read_text())
    assert described["service"] == BENTOFILE["service"] == "predictor_service.service:PredictorService"
    envs = {e["name"]: e["value"] for e in described["envs"]}
    assert envs["MAESTRO_MODEL"] == "build/predictor" and envs["OMP_NUM_THREADS"] == "1"
    baked = bento / "src" / "build" / "predictor"
    assert sorted(p.name for p in baked.iterdir()) == sorted(p.name for p in model_dir.iterdir())
    assert (baked / "meta.json").read_bytes() == (model_dir / "meta.json").read_bytes()
    assert not list((bento / "src").rglob("__pycache__")) and not (bento / "src" / "tests").exists()
    assert (bento / "env" / "docker" / "Dockerfile").exists()


def test_the_bento_imports_without_the_repository(bento):
    checked = subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK],
        cwd=bento / "src",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert checked.stdout.split() == [], f"modules missing from bentofile.yaml's include: {checked.stdout.split()}"


def test_the_bento_pins_what_pyproject_pins():
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = {re.split(r"[\[=]", p)[0]: p.split("==")[1] for p in pins}
    for requirement in BENTOFILE["python"]["packages"]:
        name, version = requirement.split("==")
        assert pinned.get(name) == version, f"bentofile.yaml pins {requirement}, pyproject.toml {pinned.get(name)}"
