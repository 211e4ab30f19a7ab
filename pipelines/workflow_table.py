"""The workflow predictor's answers without its model: a per-position table over all apps (for an app training
never saw), and the prior for no data at all."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from maestro.prediction import WORKFLOW_PRIOR


@dataclass(frozen=True)
class Quantiles:
    """A remaining-work figure's median and (1 − α) upper bound."""

    median: float
    upper: float

    @classmethod
    def of(cls, values: np.ndarray, alpha: float) -> Quantiles:
        """The median and the split-conformal (1 − α) level (the largest value where there are too few)."""
        n = len(values)
        level = min(1.0, np.ceil((n + 1) * (1 - alpha)) / n)
        return cls(round(float(np.median(values)), 2), float(np.quantile(values, level, method="higher")))


# The table's row with no data: maestro.prediction's WORKFLOW_PRIOR (remaining calls, remaining tokens).
PRIOR_ROW = (
    Quantiles(WORKFLOW_PRIOR.wf_remaining_calls, WORKFLOW_PRIOR.wf_remaining_calls_upper),
    Quantiles(WORKFLOW_PRIOR.wf_remaining_tokens, WORKFLOW_PRIOR.wf_remaining_tokens_upper),
)


class PositionTable:
    """Remaining calls and tokens by call_index over every app: each position with `min_position_count`
    stages has its own quantiles; later positions, and positions with fewer stages, share the pooled last row."""

    @classmethod
    def fit(cls, positions: list[int], targets: dict[str, np.ndarray], config) -> PositionTable:
        """`targets`: "calls" and "tokens" arrays aligned with `positions`; `config`: alpha, min_position_count."""
        table = cls()
        positions = np.asarray(positions, int)
        if not len(positions):
            table.rows_ = [PRIOR_ROW]
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


class AppPositionMedians:
    """The per-(app, position) medians of remaining calls and tokens and the app's median number of calls, as
    features (POSITION_COLUMNS): the no-model answer, handed to the trees to refine. NaN where training never saw
    the app, or the app at that position."""

    @classmethod
    def fit(cls, apps: list[str], positions: list[int], targets: dict[str, np.ndarray]) -> AppPositionMedians:
        table = cls()
        cells: dict[tuple[str, int], list[int]] = {}
        for i, key in enumerate(zip(apps, positions)):
            cells.setdefault(key, []).append(i)
        table.cells_ = {
            key: (float(np.median(targets["calls"][rows])), float(np.median(targets["tokens"][rows])))
            for key, rows in cells.items()
        }
        table.lengths_ = {app: median[0] + 1 for (app, position), median in table.cells_.items() if position == 0}
        return table

    def lookup(self, apps: list[str], positions: list[int]) -> np.ndarray:
        """(n, 3): log1p of the cell's calls and tokens medians, and the app's median length."""
        out = np.full((len(apps), 3), np.nan)
        for i, key in enumerate(zip(apps, positions)):
            if key in self.cells_:
                out[i, :2] = np.log1p(self.cells_[key])
            out[i, 2] = self.lengths_.get(key[0], np.nan)
        return out

    @classmethod
    def out_of_fold(
        cls,
        apps: list[str],
        positions: list[int],
        targets: dict[str, np.ndarray],
        folds: list[tuple[np.ndarray, np.ndarray]],
    ) -> np.ndarray:
        """lookup() of each row from the medians of the other folds (its own task's labels never read)."""
        out = np.full((len(apps), 3), np.nan)
        for train, held in folds:
            table = cls.fit(
                [apps[i] for i in train], [positions[i] for i in train], {k: v[train] for k, v in targets.items()}
            )
            out[held] = table.lookup([apps[i] for i in held], [positions[i] for i in held])
        return out
