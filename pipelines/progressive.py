"""Training the progressive re-predictor (`maestro.progressive`): a stage's total output length from its output so
far, fitted on the traces' `output_text` at checkpoints of produced tokens.

Rows: each labelled stage with an output text, at each checkpoint k < its length L (a stage that has ended by k is no
longer running there): the class of its first min(k, PREFIX_TOKENS) tokens, whose text is cut from `output_text` by
proportion (`maestro.progressive.prefix_chars`: k ÷ L of its characters, since L tokens made the whole text),
log k, log of the stage model's median `tokens_pred` (out of fold where the model kept its out-of-fold answers), and
the target log(L ÷ k). Each row is also kept once with the class `unknown`, for a runtime that cannot read the text.

One LightGBM quantile model a level on (class, log k, log tokens_pred); each is a sum of trees, so constant between
its split thresholds: the table is the models evaluated once per cell of the grid those thresholds make, made
non-decreasing across levels. The runtime reads the table in pure Python (no LightGBM there).
"""
from __future__ import annotations

from dataclasses import dataclass

import lightgbm as lgb
import numpy as np
import pandas as pd

from maestro.progressive import PREFIX_CLASSES, UNKNOWN, ProgressiveTable, prefix_chars, prefix_class
from pipelines.contract import StageTrace

CHECKPOINTS = (4, 8, 16, 32, 64, 128, 256, 512)
LEVELS = (0.05, 0.1, 0.5, 0.8, 0.9, 0.95, 0.98)
FEATURES = ("prefix", "log_produced", "log_pred")


@dataclass(frozen=True)
class ProgressiveConfig:
    checkpoints: tuple[int, ...] = CHECKPOINTS
    levels: tuple[float, ...] = LEVELS
    num_leaves: int = 8
    n_estimators: int = 150
    learning_rate: float = 0.05
    min_child_samples: int = 40
    pred_bins: int = 24  # LightGBM bins of log tokens_pred: at most this many cells along it in the table
    seed: int = 0

    def __post_init__(self):
        if not self.checkpoints or min(self.checkpoints) < 1:
            raise ValueError(f"progressive: checkpoints must be >= 1, got {self.checkpoints}")
        if 0.5 not in self.levels or not all(0 < q < 1 for q in self.levels):
            raise ValueError(f"progressive: levels must lie in (0, 1) and hold 0.5, got {self.levels}")


def has_text(stage: StageTrace) -> bool:
    return bool(stage.output_text) and bool(stage.output_tokens)


def checkpoint_rows(stages: list[StageTrace], tokens_pred: np.ndarray,
                    checkpoints: tuple[int, ...] = CHECKPOINTS) -> pd.DataFrame:
    """One row per (stage with an output text, checkpoint k < its length): `stage` (its index in `stages`), `app`,
    `produced` (k), `tokens`, `prefix`, `log_produced`, `log_pred`, `target` (log(L ÷ k))."""
    rows = []
    for i, (stage, pred) in enumerate(zip(stages, tokens_pred)):
        if not has_text(stage):
            continue
        total = stage.output_tokens
        for k in (k for k in checkpoints if k < total):
            prefix = prefix_class(prefix_chars(stage.output_text, total, k))
            rows.append((i, stage.app or "", k, total, prefix, np.log(k), np.log(max(pred, 1.0)), np.log(total / k)))
    return pd.DataFrame(rows, columns=["stage", "app", "produced", "tokens", *FEATURES, "target"])


def feature_frame(rows: pd.DataFrame) -> pd.DataFrame:
    prefix = pd.Categorical(rows["prefix"], categories=list(PREFIX_CLASSES))
    return pd.DataFrame({"prefix": prefix, "log_produced": rows["log_produced"].to_numpy(float),
                         "log_pred": rows["log_pred"].to_numpy(float)})


def fit_table(rows: pd.DataFrame, config: ProgressiveConfig | None = None) -> ProgressiveTable:
    """The table of conditional quantiles (module docstring) from `checkpoint_rows`."""
    config = config or ProgressiveConfig()
    if rows.empty:
        raise ValueError("progressive: no stage with an output_text and output_tokens to fit on")
    both = pd.concat([rows, rows.assign(prefix=UNKNOWN)], ignore_index=True)
    X, y = feature_frame(both), both["target"].to_numpy(float)
    boosters = [fit_level(X, y, level, config) for level in config.levels]
    produced_edges = split_thresholds(boosters, 1)
    pred_edges = split_thresholds(boosters, 2)
    grid = cell_grid(produced_edges, pred_edges)
    values = np.column_stack([b.predict(grid) for b in boosters])
    values = np.maximum.accumulate(values, axis=1).reshape(
        len(PREFIX_CLASSES), len(produced_edges) + 1, len(pred_edges) + 1, len(config.levels))
    return ProgressiveTable(tuple(config.levels), PREFIX_CLASSES, tuple(produced_edges), tuple(pred_edges),
                            np.round(values, 4).tolist(), min(config.checkpoints))


def fit_level(X: pd.DataFrame, y: np.ndarray, level: float, config: ProgressiveConfig) -> lgb.Booster:
    params = {"objective": "quantile", "alpha": level, "num_leaves": config.num_leaves,
              "learning_rate": config.learning_rate, "min_child_samples": config.min_child_samples,
              "max_bin_by_feature": [len(PREFIX_CLASSES), len(config.checkpoints) + 1, config.pred_bins],
              "seed": config.seed, "deterministic": True, "num_threads": 1, "verbose": -1}
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


def cell_grid(produced_edges: list[float], pred_edges: list[float]) -> pd.DataFrame:
    """Every (class, produced cell, pred cell), in the table's order (class slowest)."""
    index = pd.MultiIndex.from_product([list(PREFIX_CLASSES), cell_points(produced_edges), cell_points(pred_edges)])
    frame = index.to_frame(index=False, name=list(FEATURES))
    frame["prefix"] = pd.Categorical(frame["prefix"], categories=list(PREFIX_CLASSES))
    return frame


def first_guesses(predictor, stages: list[StageTrace]) -> tuple[np.ndarray, str]:
    """Each stage's median prediction as training sees it, and where it came from: the stage model's out-of-fold
    answers where `stages` are the model's training stages in its training order (its `oof_` rows come first in
    that order, checked on their labels), else the predictor's own answers on them (in sample: too sure of
    itself)."""
    model = getattr(predictor, "model", None)
    oof = getattr(model, "oof_", None)
    if oof is not None and len(oof) >= len(stages):
        head = oof.iloc[:len(stages)]
        log_true = np.log1p([s.output_tokens or 0 for s in stages])
        if np.allclose(head["log_true"].to_numpy(float), log_true):
            return np.expm1(head["log_pred"].to_numpy(float)), "out-of-fold"
    return np.array([float(p.tokens_pred) for p in predictor.predict(stages)]), "in-sample"


def fit_for(predictor, stages: list[StageTrace], config: ProgressiveConfig | None = None
            ) -> tuple[ProgressiveTable, dict]:
    """The table for `predictor` from its training stages, and what to record of it in the predictor's meta."""
    config = config or ProgressiveConfig()
    guesses, source = first_guesses(predictor, stages)
    rows = checkpoint_rows(stages, guesses, config.checkpoints)
    table = fit_table(rows, config)
    return table, {"first_guesses": source, "num_rows": len(rows), "num_stages": int(rows["stage"].nunique()),
                   "cells": [len(table.produced_edges) + 1, len(table.pred_edges) + 1]}
