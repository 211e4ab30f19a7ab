"""The workflow predictor's answers without its model: a per-position table over all apps (for an app training
never saw), and the prior for no data at all."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Quantiles:
    """A remaining-work figure's median and (1 − α) upper bound."""

    median: float
    upper: float

    @classmethod
    def of(cls, values: np.ndarray, alpha: float) -> "Quantiles":
        """The median and the split-conformal (1 − α) level (the largest value where there are too few)."""
        n = len(values)
        level = min(1.0, np.ceil((n + 1) * (1 - alpha)) / n)
        return cls(round(float(np.median(values)), 2), float(np.quantile(values, level, method="higher")))


# The answer with no data: an agent workflow's remaining calls and tokens, as a scheduler without a model
# should guess them. Not calibrated on anything.
WORKFLOW_PRIOR = (Quantiles(4.0, 32.0), Quantiles(400.0, 8000.0))


class PositionTable:
    """Remaining calls and tokens by call_index over every app: each position with `min_position_count`
    stages has its own quantiles; later positions, and positions with fewer stages, share the pooled last row."""

    @classmethod
    def fit(cls, positions: list[int], targets: dict[str, np.ndarray], config) -> "PositionTable":
        """`targets`: "calls" and "tokens" arrays aligned with `positions`; `config`: alpha, min_position_count."""
        table = cls()
        positions = np.asarray(positions, int)
        if not len(positions):
            table.rows_ = [WORKFLOW_PRIOR]
            return table
        counts = np.bincount(positions)
        last = max((p for p, n in enumerate(counts) if n >= config.min_position_count), default=0)
        table.rows_ = []
        for position in range(last + 1):
            member = positions == position if position < last else positions >= last
            if not member.any():  # a gap in call order: the position before answers
                table.rows_.append(table.rows_[-1])
                continue
            table.rows_.append(tuple(Quantiles.of(targets[k][member], config.alpha) for k in ("calls", "tokens")))
        return table

    def lookup(self, position: int) -> tuple[Quantiles, Quantiles]:
        """(remaining calls, remaining tokens) at a call_index."""
        return self.rows_[min(max(position, 0), len(self.rows_) - 1)]
