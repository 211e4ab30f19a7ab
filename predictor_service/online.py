"""Online per-role correction between retrains (post-execution profiling, DESIGN §4).

For each role, an exponentially weighted mean of log((actual+1)/(predicted+1)) over observed
stages, measured against the bias the model already had out-of-fold at training time (the
asymmetric loss over-predicts on purpose; that margin is not drift). It is bounded (|log factor|
≤ bound), decays towards 0 with a half-life when a role goes quiet, and only acts once a role has
`min_observations`. A reload starts from zero: the bias belonged to the previous model.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class CorrectionConfig:
    weight: float = 0.05  # EWMA weight of one observation
    bound: float = math.log(2.0)  # the factor stays within [1/2, 2]
    half_life_s: float = 1800.0  # without observations, half the correction fades in this time
    min_observations: int = 20
    max_roles: int = 10_000  # roles are client-supplied: past this, the longest-quiet role is forgotten

    def __post_init__(self) -> None:
        if not 0 < self.weight <= 1:
            raise ValueError(f"correction weight must be in (0, 1], got {self.weight}")
        if self.bound < 0 or self.half_life_s <= 0 or self.min_observations < 1 or self.max_roles < 1:
            raise ValueError(f"invalid CorrectionConfig {self}: bound ≥ 0, half_life_s > 0, min_observations ≥ 1, "
                             "max_roles ≥ 1")


@dataclass
class _RoleState:
    log_ratio: float = 0.0
    num_observations: int = 0
    updated_at: float = 0.0


class OnlineCorrection:
    """Per-role multiplicative correction of token predictions, learnt from observed actuals."""

    def __init__(self, config: CorrectionConfig | None = None, baseline: float = 0.0,
                 clock=time.monotonic):
        self.config, self.baseline, self._clock = config or CorrectionConfig(), baseline, clock
        self._roles: dict[str, _RoleState] = {}
        self._lock = threading.Lock()

    def _decayed(self, state: _RoleState, now: float) -> float:
        return state.log_ratio * 0.5 ** (max(0.0, now - state.updated_at) / self.config.half_life_s)

    def update(self, role: str, predicted_tokens: float, actual_tokens: float) -> None:
        """Fold one observation of `role` into its correction."""
        bound = self.config.bound
        residual = math.log((actual_tokens + 1) / (max(predicted_tokens, 0) + 1)) - self.baseline
        with self._lock:
            now = self._clock()
            if role not in self._roles and len(self._roles) >= self.config.max_roles:
                del self._roles[min(self._roles, key=lambda r: self._roles[r].updated_at)]
            state = self._roles.setdefault(role, _RoleState(updated_at=now))
            mixed = (1 - self.config.weight) * self._decayed(state, now) + self.config.weight * residual
            state.log_ratio = min(bound, max(-bound, mixed))
            state.num_observations += 1
            state.updated_at = now

    def factor(self, role: str) -> float:
        """The multiplier for this role's token predictions now (1.0 until enough observations)."""
        state = self._roles.get(role)
        if state is None or state.num_observations < self.config.min_observations:
            return 1.0
        return math.exp(self._decayed(state, self._clock()))

    def snapshot(self) -> dict[str, dict]:
        """Every role's correction, for /stats and /observe."""
        now = self._clock()
        with self._lock:
            return {role: {"factor": round(self.factor(role), 4), "log_ratio": round(self._decayed(s, now), 4),
                           "num_observations": s.num_observations, "age_s": round(now - s.updated_at, 1),
                           "is_active": s.num_observations >= self.config.min_observations}
                    for role, s in self._roles.items()}
