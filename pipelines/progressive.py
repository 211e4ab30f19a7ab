"""Training the progressive re-predictor (`maestro.progressive`): a stage's total output length from its output so
far, fitted on the traces' `output_text` at checkpoints of produced tokens.

Rows: each labelled stage with an output text, at each checkpoint k < its length L (a stage that has ended by k is no
longer running there): the class of its first min(k, PREFIX_TOKENS) tokens, whose text is its first
`CHARS_PER_TOKEN` × k characters (`maestro.progressive.prefix_chars`: what a runtime could have read, never the
length L), the stage's `table_features` at k from its prediction (`first_guesses`), and the target
log(L ÷ max(tokens_pred, k)). Each row is also kept once with the class `unknown`, for a runtime that cannot read the
text.

One LightGBM quantile model a level on (class, `table_features`); each is a sum of trees, so constant between its
split thresholds: the table is the models evaluated once per cell of the grid those thresholds make, made
non-decreasing across levels. The runtime reads the table in pure Python (no LightGBM there).
"""

from __future__ import annotations

from dataclasses import dataclass

import lightgbm as lgb
import numpy as np
import pandas as pd

from maestro.contract import StageTrace
from maestro.progressive import PREFIX_CLASSES, UNKNOWN, ProgressiveTable, prefix_chars, prefix_class, table_features

CHECKPOINTS = (4, 8, 16, 32, 64, 128, 256, 512)
LEVELS = (0.05, 0.1, 0.5, 0.8, 0.9, 0.95, 0.98)
FEATURES = ("prefix", "log_produced", "log_ahead", "log_spread")  # the class, then `table_features`


@dataclass(frozen=True)
class ProgressiveConfig:
    checkpoints: tuple[int, ...] = CHECKPOINTS
    levels: tuple[float, ...] = LEVELS
    num_leaves: int = 8
    n_estimators: int = 150
    learning_rate: float = 0.05
    min_child_samples: int = 100
    ahead_bins: int = 16  # LightGBM bins of log(tokens_pred ÷ produced): at most this many cells along it
    spread_bins: int = 8  # ... of log(tokens_reserve ÷ tokens_pred)
    seed: int = 0

    def __post_init__(self):
        if not self.checkpoints or min(self.checkpoints) < 1:
            raise ValueError(f"progressive: checkpoints must be >= 1, got {self.checkpoints}")
        if 0.5 not in self.levels or not all(0 < q < 1 for q in self.levels):
            raise ValueError(f"progressive: levels must lie in (0, 1) and hold 0.5, got {self.levels}")


def has_text(stage: StageTrace) -> bool:
    return bool(stage.output_text) and bool(stage.output_tokens)


def checkpoint_rows(
    stages: list[StageTrace], guesses: np.ndarray, checkpoints: tuple[int, ...] = CHECKPOINTS
) -> pd.DataFrame:
    """One row per (stage with an output text, checkpoint k < its length): `stage` (its index in `stages`), `app`,
    `produced` (k), `tokens`, `FEATURES` and `target` (log(L ÷ max(tokens_pred, k))). `guesses`: each stage's
    (tokens_pred, tokens_reserve)."""
    rows = []
    for i, (stage, (pred, reserve)) in enumerate(zip(stages, guesses)):
        if not has_text(stage):
            continue
        total = stage.output_tokens
        for k in (k for k in checkpoints if k < total):
            prefix = prefix_class(prefix_chars(stage.output_text, k))
            features = table_features(k, pred, reserve)
            rows.append((i, stage.app or "", k, total, prefix, *features, np.log(total / max(pred, k))))
    return pd.DataFrame(rows, columns=["stage", "app", "produced", "tokens", *FEATURES, "target"])


def feature_frame(rows: pd.DataFrame) -> pd.DataFrame:
    frame = rows[list(FEATURES)].copy()
    frame["prefix"] = pd.Categorical(rows["prefix"], categories=list(PREFIX_CLASSES))
    return frame


def fit_table(rows: pd.DataFrame, config: ProgressiveConfig | None = None) -> ProgressiveTable:
    """The table of conditional quantiles (module docstring) from `checkpoint_rows`."""
    config = config or ProgressiveConfig()
    if rows.empty:
        raise ValueError("progressive: no stage with an output_text and output_tokens to fit on")
    both = pd.concat([rows, rows.assign(prefix=UNKNOWN)], ignore_index=True)
    X, y = feature_frame(both), both["target"].to_numpy(float)
    boosters = [fit_level(X, y, level, config) for level in config.levels]
    edges = [split_thresholds(boosters, feature) for feature in range(1, len(FEATURES))]
    values = np.column_stack([b.predict(cell_grid(edges)) for b in boosters])
    shape = (len(PREFIX_CLASSES), *(len(axis) + 1 for axis in edges), len(config.levels))
    values = np.maximum.accumulate(values, axis=1).reshape(shape)
    return ProgressiveTable(
        tuple(config.levels),
        PREFIX_CLASSES,
        tuple(tuple(axis) for axis in edges),
        np.round(values, 4).tolist(),
        min(config.checkpoints),
    )


def fit_level(X: pd.DataFrame, y: np.ndarray, level: float, config: ProgressiveConfig) -> lgb.Booster:
    params = {
        "objective": "quantile",
        "alpha": level,
        "num_leaves": config.num_leaves,
        "learning_rate": config.learning_rate,
        "min_child_samples": config.min_child_samples,
        "max_bin_by_feature": [len(PREFIX_CLASSES), len(config.checkpoints) + 1, config.ahead_bins, config.spread_bins],
        "seed": config.seed,
        "deterministic": True,
        "num_threads": 1,
        "verbose": -1,
    }
    return lgb.train(params, lgb.Dataset(X, y, categorical_feature=["prefix"]), num_boost_round=config.n_estimators)


def split_thresholds(boosters: list[lgb.Booster], feature: int) -> list[float]:
    """Every threshold at which any of `boosters` splits numeric feature `feature`, sorted."""
    found: set[float] = set()

    def walk(node: dict) -> None:
        if "split_feature" not in node:
            return
        if node["split_feature"] == feature:
            found.add(float(node["threshold"]))
        walk(node["left_child"])
        walk(node["right_child"])

    for booster in boosters:
        for tree in booster.dump_model()["tree_info"]:
            walk(tree["tree_structure"])
    return sorted(found)


def cell_points(edges: list[float]) -> list[float]:
    """A point inside each cell of an axis cut at `edges` (cells hold values up to and including their edge)."""
    if not edges:
        return [0.0]
    inner = [(a + b) / 2 for a, b in zip(edges, edges[1:])]
    return [edges[0] - 1.0, *inner, edges[-1] + 1.0]


def cell_grid(edges: list[list[float]]) -> pd.DataFrame:
    """A point in every (class, cell of each numeric axis), in the table's order (class slowest)."""
    index = pd.MultiIndex.from_product([list(PREFIX_CLASSES), *(cell_points(axis) for axis in edges)])
    frame = index.to_frame(index=False, name=list(FEATURES))
    frame["prefix"] = pd.Categorical(frame["prefix"], categories=list(PREFIX_CLASSES))
    return frame


def first_guesses(predictor, stages: list[StageTrace]) -> tuple[np.ndarray, str]:
    """Each stage's (tokens_pred, tokens_reserve) as training sees them, and where they came from. The predictor's own
    answers on its training stages are too sure of themselves; where `stages` are the stage model's training stages
    in its training order (its `oof_` rows come first in that order, checked on their labels), the median is its
    out-of-fold answer and the reserve keeps the answer's spread (reserve ÷ median) around it."""
    answers = predictor.predict(stages)
    pred = np.array([float(a.tokens_pred) for a in answers])
    spread = np.array([max(a.tokens_reserve, a.tokens_pred, 1) / max(a.tokens_pred, 1) for a in answers])
    oof = getattr(getattr(predictor, "model", None), "oof_", None)
    if oof is not None and len(oof) >= len(stages):
        head = oof.iloc[: len(stages)]
        if np.allclose(head["log_true"].to_numpy(float), np.log1p([s.output_tokens or 0 for s in stages])):
            pred = np.maximum(np.expm1(head["log_pred"].to_numpy(float)), 1.0)
            return np.column_stack([pred, pred * spread]), "out-of-fold median, spread in sample"
    return np.column_stack([pred, pred * spread]), "in sample"


def fit_for(
    predictor, stages: list[StageTrace], config: ProgressiveConfig | None = None
) -> tuple[ProgressiveTable, dict]:
    """The table for `predictor` from its training stages, and what to record of it in the predictor's meta."""
    config = config or ProgressiveConfig()
    guesses, source = first_guesses(predictor, stages)
    rows = checkpoint_rows(stages, guesses, config.checkpoints)
    table = fit_table(rows, config)
    return table, {
        "first_guesses": source,
        "num_rows": len(rows),
        "num_stages": int(rows["stage"].nunique()),
        "cells": [len(axis) + 1 for axis in table.edges],
    }
