"""History conditions: how much of a stage's workflow history its features saw.

"full": the outcome of every ancestor is known (or the stage has no parents); "partial": some are
(a parent ran behind another gateway replica, or the service restarted mid-workflow); "none": the
stage has parents but none of their outcomes is known (a stage sent alone without /observe, or a
trace file with its labels stripped). The model trains on each condition (history dropout: copies
of the training stages with ancestors' labels hidden) and the reserve is calibrated per condition,
so the share of stages above it holds in each; every prediction says which condition it was made in.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from maestro.contract import StageTrace

HISTORY_CONDITIONS = ("full", "partial", "none")
LABEL_FIELDS = ("output_tokens", "is_tool_call", "output_text", "finish_reason")
# the feature columns a condition is read from (pipelines.features makes them)
CONDITION_COLUMNS = ("in_degree", "num_ancestors", "num_ancestors_known", "parent_tokens_max")


def without_labels(stage: StageTrace) -> StageTrace:
    """The stage as it is before it runs: its outcome fields cleared."""
    return stage.model_copy(update=dict.fromkeys(LABEL_FIELDS))


def hide_labels(stages: list[StageTrace], share: float, seed: int) -> list[StageTrace]:
    """Copies of `stages` in which a random `share` of them (1.0: all) have their labels cleared: what the
    stages after them see as history when those outcomes never reached the predictor."""
    hidden = np.random.default_rng(seed).random(len(stages)) < share
    return [without_labels(s) if hide else s.model_copy() for s, hide in zip(stages, hidden)]


def history_conditions(column: Callable[[str], np.ndarray | None], n: int) -> np.ndarray:
    """Each row's condition, from the feature columns `column(name)` returns (None where a model was
    trained without them: every row then counts as "full")."""
    values = [column(name) for name in CONDITION_COLUMNS]
    if any(v is None for v in values):
        return np.full(n, "full", dtype=object)
    if n == 1:  # a live call: the same rules on four floats, without numpy's per-call overhead
        return np.array([_condition(*(float(v[0]) for v in values))], dtype=object)
    table = np.array(values, np.float64).reshape(len(values), n)  # one array: a live call has one row
    table[np.isnan(table)] = -1.0
    in_degree, ancestors, known, parent_tokens = table
    has_parents = in_degree > 0
    none = has_parents & (known <= 0) & (parent_tokens < 0)
    full = ~has_parents | ((known >= ancestors) & (ancestors >= in_degree))
    return np.where(none, "none", np.where(full, "full", "partial")).astype(object)


def _condition(in_degree: float, ancestors: float, known: float, parent_tokens: float) -> str:
    """history_conditions of one row (NaN counts as -1, as there)."""
    in_degree, ancestors, known, parent_tokens = (
        -1.0 if v != v else v for v in (in_degree, ancestors, known, parent_tokens)
    )
    if in_degree > 0 and known <= 0 and parent_tokens < 0:
        return "none"
    return "full" if in_degree <= 0 or (known >= ancestors and ancestors >= in_degree) else "partial"
