"""The locked train/test split, then structure + prompt embedding → PCA features (the DVC stage:
pipelines/stages/featurize.py; `maestro train` reads `featurizer_config` too).

The split keeps every workflow (and every run of the same task) on one side, by a hash of the task
id (locked: no seed or tuning choice moves a task). Training rows include the history copies
(pipelines.predictor.training_frame); test rows come with and without their ancestors' labels. The PCA is fitted on
the training side only. MiniLM embeddings are cached by text hash in `embeddings.npz` so a re-run embeds
only prompts it has not seen. With `embedding: static` the embedding is MiniLM distilled to one vector per
token (pipelines.static_embedding.StaticEmbedder): the distilled table is kept in `static/` (distilled again
only when the packaged MiniLM or the recipe changes; empty with `embedding: minilm`), weighted and PCA-folded
on the training side, and saved inside `featurizer.joblib`, so the predictor the train stage saves carries it.
With `lexical: true` the features gain the supervised lexical scores (pipelines.lexical): out of fold on the
training side, from the models fitted on all of it on the test side; their weights are saved the same way.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import numpy as np
from sklearn.model_selection import GroupShuffleSplit

from maestro.contract import StageTrace, task_id
from pipelines.embedding import Embedder, EmbedderConfig, make_embedder
from pipelines.features import Featurizer, FeaturizerConfig
from pipelines.lexical import LexicalConfig
from pipelines.predictor import evaluation_frame, training_frame


def featurizer_config(params: dict) -> FeaturizerConfig:
    embedder = EmbedderConfig(
        kind=params.get("embedding", "minilm"),
        tail_chars=params["tail_chars"],
        max_seq_length=params["max_seq_length"],
        weighting=params.get("static_weighting", "zipf"),
        normalize=params.get("static_normalize", False),
        fit_to_teacher=params.get("fit_to_teacher", False),
        ridge=params.get("teacher_ridge", EmbedderConfig.ridge),
        teacher_windows=params.get("teacher_windows", EmbedderConfig.teacher_windows),
    )
    return FeaturizerConfig(
        pca_dims=params["pca_dims"],
        min_category_count=params["min_category_count"],
        embedder=embedder,
        use_embedding=params.get("use_embedding", True),
        history_copies=params.get("history_copies", True),
        lexical=LexicalConfig() if params.get("lexical", False) else None,
    )


def grouped_split(stages: list[StageTrace], test_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices of train and test stages; no task has stages on both sides."""
    groups = np.array([task_id(s) for s in stages])
    if len(set(groups)) < 2:
        raise ValueError("need at least two workflows/tasks to split train from test")
    splitter = GroupShuffleSplit(n_splits=1, test_size=test_fraction, random_state=seed)
    train, test = next(splitter.split(np.zeros(len(stages)), groups=groups))
    return sorted(train), sorted(test)


def locked_split(stages: list[StageTrace], test_fraction: float) -> tuple[list[int], list[int]]:
    """Indices of train and test stages by a hash of each task id: a task's side never depends on the
    rest of the data, a seed or any tuning choice, so the test side stays locked as traces are added."""
    side = {
        t: int(hashlib.sha256(t.encode()).hexdigest(), 16) % 10_000 < test_fraction * 10_000
        for t in {task_id(s) for s in stages}
    }
    if len(set(side.values())) < 2:
        raise ValueError(
            f"the locked split put every one of {len(side)} tasks on one side: "
            "need more tasks, or a test_fraction further from 0 and 1"
        )
    test = [i for i, s in enumerate(stages) if side[task_id(s)]]
    return sorted(set(range(len(stages))) - set(test)), test


def featurize(stages: list[StageTrace], params: dict, cache: Path | None = None, static_cache: Path | None = None):
    """`cache`: MiniLM's embedding cache file; `static_cache`: the distilled table's
    (static_embedding.teacher_table)."""
    train_idx, test_idx = locked_split(stages, params["test_fraction"])
    config = featurizer_config(params)
    minilm = Embedder(replace(config.embedder, kind="minilm"))  # the embedding, or the static one's teacher
    if cache is not None:
        minilm.load_cache(cache)
    embedder = make_embedder(config.embedder, static_cache) if config.embedder.kind == "static" else minilm
    train = [stages[i] for i in train_idx]
    test = [stages[i] for i in test_idx]
    featurizer = Featurizer(config, embedder, teacher=minilm).fit(train, progress=True)
    frames = {
        "train": training_frame(featurizer, train, params["seed"], progress=True),
        "test": evaluation_frame(featurizer, test, progress=True),
    }
    if cache is not None:
        minilm.save_cache(cache)
    return featurizer, frames
