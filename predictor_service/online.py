"""Online per-role correction between retrains (post-execution profiling, DESIGN §4).

Two corrections per role, learnt from the stages the service observes (served answer vs actual):

- tokens: an EWMA of log((actual+1)/(served+1)), measured against the bias the role already had
  out of fold at training time (the asymmetric loss over-predicts on purpose, and by a different
  margin for each role: that margin is not drift). It acts only on the part of the mean that stands
  out from its own noise, beyond `significance` standard errors of the EWMA. Without that dead zone
  and with one global margin, replaying held-out dev workflows in order, the correction chased
  between-workflow noise: MAE +18 %, over-reservation +22 % (`benchmarks/online_correction.py`).
- reserve: the tokens factor, times an adaptive-conformal shift (Gibbs & Candès, 2021): each
  observed stage above its served reserve raises the role's log shift by step·(1−α), each one
  within it lowers the shift by step·α. After a drift the share above the reserve returns to the
  model's α; without one the shift hovers near 0.

Both are bounded (|log| ≤ bound) and decay towards 0 with a half-life when a role goes quiet; the
tokens factor only acts once a role has `min_observations`. A reload starts from zero: the
corrections belonged to the previous model.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class CorrectionConfig:
    weight: float = 0.05  # EWMA weight of one observation
    bound: float = math.log(2.0)  # each factor stays within [1/2, 2]
    half_life_s: float = 1800.0  # without observations, half a correction fades in this time
    min_observations: int = 20
    significance: float = 2.0  # the tokens factor acts on the mean beyond this many standard errors
    reserve_step: float = 0.05  # adaptive-conformal step of the reserve's log shift (0: off)
    max_roles: int = 10_000  # roles are client-supplied: past this, the longest-quiet role is forgotten

    def __post_init__(self) -> None:
        if not 0 < self.weight <= 1:
            raise ValueError(f"correction weight must be in (0, 1], got {self.weight}")
        if (self.bound < 0 or self.half_life_s <= 0 or self.min_observations < 1 or self.max_roles < 1
                or self.significance < 0 or self.reserve_step < 0):
            raise ValueError(f"invalid CorrectionConfig {self}: bound ≥ 0, half_life_s > 0, min_observations ≥ 1, "
                             "max_roles ≥ 1, significance ≥ 0, reserve_step ≥ 0")


@dataclass
class _RoleState:
    mean: float = 0.0  # EWMA of the log residual beyond the trained margin
    variance: float = 0.0  # EWMA variance of that residual
    reserve_shift: float = 0.0  # adaptive-conformal log shift of the reserve
    num_observations: int = 0
    updated_at: float = 0.0


class OnlineCorrection:
    """Per-role multiplicative corrections of token predictions and reserves, learnt from observed actuals.

    baseline / role_baselines: the mean log residual the model had out of fold, overall and per role.
    alpha: the share of stages the reserve is allowed to miss (the model's calibrated α)."""

    def __init__(self, config: CorrectionConfig | None = None, baseline: float = 0.0,
                 role_baselines: dict[str, float] | None = None, alpha: float = 0.05, clock=time.monotonic):
        self.config, self.baseline, self.alpha, self._clock = config or CorrectionConfig(), baseline, alpha, clock
        self.role_baselines = role_baselines or {}
        self._roles: dict[str, _RoleState] = {}
        self._lock = threading.Lock()

    def _clip(self, value: float) -> float:
        return min(self.config.bound, max(-self.config.bound, value))

    def _decay(self, state: _RoleState, now: float) -> float:
        return 0.5 ** (max(0.0, now - state.updated_at) / self.config.half_life_s)

    def _tokens_log(self, state: _RoleState, now: float) -> float:
        if state.num_observations < self.config.min_observations:
            return 0.0
        w = self.config.weight
        mean = state.mean * self._decay(state, now)
        standard_error = math.sqrt(state.variance * w / (2 - w))  # of an EWMA of independent residuals
        return self._clip(math.copysign(max(0.0, abs(mean) - self.config.significance * standard_error), mean))

    def _reserve_log(self, state: _RoleState, now: float) -> float:
        return self._clip(self._tokens_log(state, now) + state.reserve_shift * self._decay(state, now))

    def update(self, role: str, predicted_tokens: float, actual_tokens: float,
               reserve_tokens: float | None = None) -> None:
        """Fold one observation of `role` in: the uncorrected prediction and reserve it was served."""
        residual = (math.log((actual_tokens + 1) / (max(predicted_tokens, 0) + 1))
                    - self.role_baselines.get(role, self.baseline))
        w = self.config.weight
        with self._lock:
            now = self._clock()
            if role not in self._roles and len(self._roles) >= self.config.max_roles:
                del self._roles[min(self._roles, key=lambda r: self._roles[r].updated_at)]
            state = self._roles.setdefault(role, _RoleState(updated_at=now))
            decay = self._decay(state, now)
            if reserve_tokens is not None:  # judged against the reserve as served, before this update
                missed = actual_tokens > reserve_tokens * math.exp(self._reserve_log(state, now))
                state.reserve_shift = self._clip(state.reserve_shift * decay
                                                 + self.config.reserve_step * (float(missed) - self.alpha))
            if state.num_observations == 0:
                state.variance = residual ** 2  # the first residual sets the noise scale
            mean = state.mean * decay
            delta = residual - mean
            state.mean = mean + w * delta
            state.variance = (1 - w) * (state.variance + w * delta ** 2)
            state.num_observations += 1
            state.updated_at = now

    def factor(self, role: str) -> float:
        """The multiplier for this role's token predictions now (1.0 until enough observations)."""
        state = self._roles.get(role)
        return 1.0 if state is None else math.exp(self._tokens_log(state, self._clock()))

    def reserve_factor(self, role: str) -> float:
        """The multiplier for this role's reserves now: the tokens factor and the conformal shift."""
        state = self._roles.get(role)
        return 1.0 if state is None else math.exp(self._reserve_log(state, self._clock()))

    def apply(self, role: str, tokens_pred: float, tokens_reserve: float) -> tuple[int, int, float, float]:
        """The served answer for the model's (tokens_pred, tokens_reserve): both corrected, the reserve never below
        the prediction; and the two factors used."""
        factor, reserve_factor = self.factor(role), self.reserve_factor(role)
        corrected = int(round(tokens_pred * factor))
        return corrected, max(corrected, int(math.ceil(tokens_reserve * reserve_factor))), factor, reserve_factor

    def snapshot(self) -> dict[str, dict]:
        """Every role's correction, for /stats and /observe."""
        now = self._clock()
        with self._lock:
            return {role: {"factor": round(math.exp(self._tokens_log(s, now)), 4),
                           "reserve_factor": round(math.exp(self._reserve_log(s, now)), 4),
                           "log_ratio": round(s.mean * self._decay(s, now), 4),
                           "num_observations": s.num_observations, "age_s": round(now - s.updated_at, 1),
                           "is_active": s.num_observations >= self.config.min_observations}
                    for role, s in self._roles.items()}
