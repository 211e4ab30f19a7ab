"""Online reserve level of an app training never saw, learnt from its own observed stages.

A new app's answers start at the model's new-app level (`pipelines.new_app`: the level that held for the
worst training app left out), wide for most apps by design. Each (app, role) of a new app then keeps its
latest observed scores, log((actual+1)/(served reserve+1)) against the reserve the model served, and once
a group holds enough of them for a finite split-conformal rank at α, its reserve is shifted by their
conformal quantile at the miss target: the level its own stages call for. A role with too few
observations borrows the app's pooled scores; an app with too few keeps the model's level.

Only a new app's own groups move: its outcomes never enter the per-role state that apps training saw
share (the roles are often named alike: "agent", "user"), so a new app cannot pull a seen app's reserve.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from pipelines.calibration import conformal_quantile


@dataclass(frozen=True)
class NewAppConfig:
    window: int = 200  # the latest observed stages per group whose scores set its level
    # the share of a new app's stages its own level aims to leave above the reserve (the model's α where lower).
    # Below α: a level from 30-200 scores of one app swings, and 100 stages after the first 100 should stay
    # ≤ 6 % above. Chosen by inner leave-one-app-out on the training apps (pipelines/EXPERIMENTS.md, 2026-12-02).
    miss_target: float = 0.03
    bound: float = math.log(8.0)  # the shift stays within [1/8, 8] of the model's new-app reserve
    max_groups: int = 10_000  # groups are client-supplied: past this, the longest-quiet one is forgotten

    def __post_init__(self) -> None:
        if self.window < 1 or self.bound < 0 or self.max_groups < 1 or not 0 < self.miss_target < 0.5:
            raise ValueError(
                f"invalid NewAppConfig {self}: window ≥ 1, bound ≥ 0, max_groups ≥ 1, 0 < miss_target < 0.5"
            )


def min_scores(alpha: float) -> int:
    """The fewest scores whose split-conformal rank ⌈(n+1)(1−α)⌉ is within n (33 at α = 0.03)."""
    return math.ceil((1 - alpha) / alpha)


class NewAppCoverage:
    """Per (app, role) of apps training never saw: the log shift of the served reserve, from the group's own
    recent scores (the app's pooled ones while the role has too few; 0 while the app has too few)."""

    def __init__(self, config: NewAppConfig | None = None, alpha: float = 0.05):
        self.config = config or NewAppConfig()
        self.alpha = min(alpha, self.config.miss_target)  # what each group's level aims at
        self.min_scores = min(min_scores(self.alpha), self.config.window)
        self._scores: OrderedDict[tuple[str, ...], deque] = OrderedDict()
        self._shifts: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def shift(self, app: str, role: str) -> float:
        """The log shift for a new app's (app, role) now."""
        with self._lock:
            return self._shifts.get((app, role), self._shifts.get((app,), 0.0))

    def factor(self, app: str, role: str) -> float:
        return math.exp(self.shift(app, role))

    def update(self, app: str, role: str, reserve_tokens: float, actual_tokens: float) -> None:
        """Fold in one finished stage of a new app: the reserve the model served it (before this correction)."""
        score = math.log((actual_tokens + 1) / (max(reserve_tokens, 0) + 1))
        with self._lock:
            for key in ((app, role), (app,)):
                scores = self._scores.get(key)
                if scores is None:
                    scores = self._scores[key] = deque(maxlen=self.config.window)
                    self._forget_quiet()
                self._scores.move_to_end(key)
                scores.append(score)
                if len(scores) >= self.min_scores:
                    level = conformal_quantile(np.fromiter(scores, float, len(scores)), self.alpha)
                    self._shifts[key] = min(self.config.bound, max(-self.config.bound, level))

    def _forget_quiet(self) -> None:
        while len(self._scores) > self.config.max_groups:
            key, _ = self._scores.popitem(last=False)
            self._shifts.pop(key, None)

    def snapshot(self) -> dict[str, dict]:
        """Each new app's groups: observed stages kept and the reserve factor now, keyed "app" or "app/role"."""
        with self._lock:
            return {
                "/".join(key): {
                    "num_observations": len(scores),
                    "reserve_factor": round(math.exp(self._shifts.get(key, 0.0)), 4),
                }
                for key, scores in self._scores.items()
            }
