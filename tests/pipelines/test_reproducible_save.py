"""A predictor saved twice from the same model is the same bytes, however long each run took: `dvc repro` on the same
inputs leaves dvc.lock as it was (the run's times are kept in memory, not in meta.json)."""

import hashlib
from pathlib import Path

from maestro.contract import StageTrace
from pipelines.features import FeaturizerConfig
from pipelines.model import ModelConfig
from pipelines.predictor import Predictor
from pipelines.synth import generate


def digests(directory: Path) -> dict[str, str]:
    files = sorted(f for f in directory.rglob("*") if f.is_file())
    return {str(f.relative_to(directory)): hashlib.md5(f.read_bytes()).hexdigest() for f in files}


def test_two_saves_of_one_model_are_the_same_bytes_whatever_the_run_times(tmp_path):
    stages = [StageTrace.model_validate(r) for r in generate(300, seed=11)]
    model = ModelConfig(folds=3, classifier=dict(n_estimators=20), regressor=dict(n_estimators=20))
    predictor = Predictor.train(stages, FeaturizerConfig(use_embedding=False), model)
    saved = []
    for run, seconds in enumerate((1.5, 97.25)):
        predictor.meta["train_seconds"] = predictor.meta["workflow"]["train_seconds"] = seconds
        saved.append(digests(predictor.save(tmp_path / str(run))))
    assert saved[0] == saved[1] and "meta.json" in saved[0]
    assert "train_seconds" not in (tmp_path / "0" / "meta.json").read_text()
    assert predictor.meta["train_seconds"] == 97.25  # still in memory: the train stage prints it
