"""What the engine referee's tests share: the dev split with a fast predictor, and the workflows they cut and change
(chain workflows, cut at their middle stage)."""

from __future__ import annotations

import tempfile

import pytest

from benchmarks.referee.sides import DEFAULT_TRACES, read_all, side_split
from maestro.contract import StageTrace
from pipelines.features import FeaturizerConfig
from pipelines.model import ModelConfig
from pipelines.predictor import Predictor
from pipelines.synth import generate


def trained_sides():
    """(the referee's dev split, a predictor directory trained fast on synthetic stages); skips without ../shared."""
    if not DEFAULT_TRACES[0].exists():
        pytest.skip(f"{DEFAULT_TRACES[0]} is missing (../shared/data)")
    split = side_split(read_all(DEFAULT_TRACES), "dev")
    stages = [StageTrace.model_validate(r) for r in generate(300, seed=11)]
    model_dir = tempfile.mkdtemp()
    fast = ModelConfig(folds=3, classifier=dict(n_estimators=30), regressor=dict(n_estimators=40))
    Predictor.train(stages, FeaturizerConfig(use_embedding=False), fast).save(model_dir)
    return split, model_dir


def chains(test: list[StageTrace], limit: int = 2) -> list[tuple[str, int]]:
    """(workflow id, cut) for chain workflows of at least 4 stages (each stage's one parent the one before)."""
    by_workflow: dict[str, list[StageTrace]] = {}
    for stage in test:
        by_workflow.setdefault(stage.workflow_id, []).append(stage)
    out = []
    for workflow_id, stages in by_workflow.items():
        ids = [s.stage_id for s in stages]
        if len(stages) >= 4 and all(s.parent_ids == [ids[i - 1]] for i, s in enumerate(stages) if i):
            out.append((workflow_id, len(stages) // 2))
    return out[:limit]


def truncate(test: list[StageTrace], workflow_id: str, cut: int) -> list[StageTrace]:
    """Drop the workflow's stages after the `cut`-th."""
    out, position = [], 0
    for stage in test:
        if stage.workflow_id == workflow_id:
            position += 1
            if position > cut + 1:
                continue
        out.append(stage)
    return out
