"""Online per-role correction between retrains (post-execution profiling, DESIGN §4).

Two corrections per role, learnt from the stages the service observes (served answer vs actual):

- tokens: an EWMA of log((actual+1)/(served+1)), measured against the bias the role already had
  out of fold at training time (the asymmetric loss over-predicts on purpose, and by a different
  margin for each role: that margin is not drift). It acts only on the part of the mean that stands
  out from its own noise, beyond `significance` standard errors of the EWMA. Without that dead zone
  and with one global margin, replaying held-out dev workflows in order, the correction chased
  between-workflow noise: MAE +18 %, over-reservation +22 % (`benchmarks/service/online_correction.py`).
- reserve: the tokens factor, times an adaptive-conformal shift (Gibbs & Candès, 2021) kept per
  coverage group (app, role, history condition: `coverage_group`; the role alone when a caller gives
  no group): each observed stage above its served reserve raises the group's log shift by step·(1−α),
  each one within it lowers the shift by step·α. After a drift the share above the reserve returns
  to the model's α; without one the shift hovers near 0.
- coverage: per group, an EWMA of the share of stages above their served reserve; a group whose share
  stands above α by more than `drift_sd` standard errors of that EWMA is drifting (logged as a warning
  when it starts; exported by the service).

- new apps: a stage answered for an app training never saw (`fallback_level: new_app`) gets its reserve from
  `maestro.own_reserve.OwnReserveLevels` alone, per app, from that app's own observed stages: the rule the gateway's
  in-process predictor and the simulator apply, from the same inputs; its outcome enters the coverage watch but
  never a role's tokens state, which the apps training saw share.

Both are bounded (|log| ≤ bound) and decay towards 0 with a half-life when a role goes quiet; the
tokens factor only acts once a role has `min_observations`. A reload starts from zero: the
corrections belonged to the previous model.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

from maestro.own_reserve import MAX_OWN_SCORES, OwnReserveLevels, UnseenReserve

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CorrectionConfig:
    weight: float = 0.05  # EWMA weight of one observation
    bound: float = math.log(2.0)  # each factor stays within [1/2, 2]
    half_life_s: float = 1800.0  # without observations, half a correction fades in this time
    min_observations: int = 20
    significance: float = 2.0  # the tokens factor acts on the mean beyond this many standard errors
    reserve_step: float = 0.05  # adaptive-conformal step of the reserve's log shift (0: off)
    max_roles: int = 10_000  # roles are client-supplied: past this, the longest-quiet role is forgotten
    coverage_weight: float = 0.02  # EWMA weight of one stage in a group's share above the reserve
    drift_sd: float = 4.0  # a group drifts when its share exceeds α by this many standard errors
    new_app_max_scores: int = MAX_OWN_SCORES  # a new app's latest observed stages its own level is taken over

    def __post_init__(self) -> None:
        if not 0 < self.weight <= 1 or not 0 < self.coverage_weight <= 1:
            raise ValueError(
                f"correction weight and coverage_weight must be in (0, 1], got {self.weight}, {self.coverage_weight}"
            )
        if (
            self.bound < 0
            or self.half_life_s <= 0
            or self.min_observations < 1
            or self.max_roles < 1
            or self.significance < 0
            or self.reserve_step < 0
            or self.new_app_max_scores < 1
        ):
            raise ValueError(
                f"invalid CorrectionConfig {self}: bound ≥ 0, half_life_s > 0, min_observations ≥ 1, "
                "max_roles ≥ 1, significance ≥ 0, reserve_step ≥ 0, new_app_max_scores ≥ 1"
            )


@dataclass
class _RoleState:
    mean: float = 0.0  # EWMA of the log residual beyond the trained margin
    variance: float = 0.0  # EWMA variance of that residual
    num_observations: int = 0
    updated_at: float = 0.0


@dataclass
class _GroupState:
    reserve_shift: float = 0.0  # adaptive-conformal log shift of the reserve
    share_above: float = 0.0  # EWMA of "the stage went above its served reserve"
    num_observations: int = 0
    is_drifting: bool = False
    updated_at: float = 0.0


def coverage_group(app: str | None, role: str, history: str) -> tuple[str, str, str]:
    """The key the reserve's shift and coverage are kept under: app, role and history condition."""
    return app or "unknown", role, history


class OnlineCorrection:
    """Per-role multiplicative corrections of token predictions and reserves, learnt from observed actuals.

    baseline / role_baselines: the mean log residual the model had out of fold, overall and per role.
    alpha: the share of stages the reserve is allowed to miss (the model's calibrated α)."""

    def __init__(
        self,
        config: CorrectionConfig | None = None,
        baseline: float = 0.0,
        role_baselines: dict[str, float] | None = None,
        alpha: float = 0.05,
        clock=time.monotonic,
    ):
        self.config, self.baseline, self.alpha, self._clock = config or CorrectionConfig(), baseline, alpha, clock
        self.role_baselines = role_baselines or {}
        self._roles: dict[str, _RoleState] = {}
        self._groups: dict[tuple[str, str, str] | str, _GroupState] = {}  # a role when no group was given
        self.new_apps = OwnReserveLevels(self.config.new_app_max_scores, self.config.max_roles)
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

    def _reserve_log(self, state: _RoleState | None, group: _GroupState | None, now: float) -> float:
        tokens = 0.0 if state is None else self._tokens_log(state, now)
        return self._clip(tokens + (0.0 if group is None else group.reserve_shift * self._decay(group, now)))

    @staticmethod
    def _state(states: dict, key: str, now: float, limit: int, make):
        if key not in states and len(states) >= limit:  # keys are client-supplied: forget the longest-quiet
            del states[min(states, key=lambda k: states[k].updated_at)]
        return states.setdefault(key, make(updated_at=now))

    def update(
        self,
        role: str,
        predicted_tokens: float,
        actual_tokens: float,
        reserve_tokens: float | None = None,
        group: tuple[str, str, str] | None = None,
        is_new_app: bool = False,
    ) -> None:
        """Fold one observation of `role` in: the uncorrected prediction and reserve it was served, and its
        coverage group (coverage_group(); the role when None); `is_new_app`: it was answered for an app
        training never saw (then `reserve_tokens` and `group` are required)."""
        if is_new_app:
            self._update_new_app(predicted_tokens, actual_tokens, reserve_tokens, group)
            return
        residual = math.log((actual_tokens + 1) / (max(predicted_tokens, 0) + 1)) - self.role_baselines.get(
            role, self.baseline
        )
        w = self.config.weight
        with self._lock:
            now = self._clock()
            state = self._state(self._roles, role, now, self.config.max_roles, _RoleState)
            if reserve_tokens is not None:  # judged against the reserve as served, before this update
                shift = self._state(self._groups, group or role, now, self.config.max_roles, _GroupState)
                missed = actual_tokens > reserve_tokens * math.exp(self._reserve_log(state, shift, now))
                self._cover(group or role, shift, missed, now)
            decay = self._decay(state, now)
            if state.num_observations == 0:
                state.variance = residual**2  # the first residual sets the noise scale
            mean = state.mean * decay
            delta = residual - mean
            state.mean = mean + w * delta
            state.variance = (1 - w) * (state.variance + w * delta**2)
            state.num_observations += 1
            state.updated_at = now

    def _update_new_app(
        self,
        predicted_tokens: float,
        actual_tokens: float,
        reserve_tokens: float | None,
        group: tuple[str, str, str] | None,
    ) -> None:
        if reserve_tokens is None or group is None:
            raise ValueError("a new app's observation needs the reserve it was served and its coverage group")
        tokens_pred = round(predicted_tokens)
        app, answer = group[0], self._unseen(tokens_pred, reserve_tokens)
        served = self.new_apps.reserve_tokens(app, answer, tokens_pred, None)
        with self._lock:
            now = self._clock()
            shift = self._state(self._groups, group, now, self.config.max_roles, _GroupState)
            self._cover(group, shift, actual_tokens > served, now, step=0.0)  # watched only: new_apps sets it
        self.new_apps.observe(app, answer, int(actual_tokens))

    def _unseen(self, tokens_pred: int, tokens_reserve: float) -> UnseenReserve:
        """A new app's answer as the gateway sizes a calibrated reserve (`sizing.reserve_output_tokens`: at least the
        prediction and 1 token), short of the stage's max_tokens, which only the gateway knows and caps at."""
        return UnseenReserve(max(1, tokens_pred, math.ceil(tokens_reserve)), self.alpha)

    def _cover(self, key, group: _GroupState, missed: bool, now: float, step: float | None = None) -> None:
        """The group's adaptive-conformal shift (`step`: the config's unless given) and its share above the
        reserve, after one stage."""
        decay, w, alpha = self._decay(group, now), self.config.coverage_weight, self.alpha
        step = self.config.reserve_step if step is None else step
        group.reserve_shift = self._clip(group.reserve_shift * decay + step * (float(missed) - alpha))
        previous = alpha if group.num_observations == 0 else group.share_above  # a new group starts at the promise
        group.share_above = (1 - w) * previous + w * float(missed)
        group.num_observations += 1
        group.updated_at = now
        standard_error = math.sqrt(alpha * (1 - alpha) * w / (2 - w))  # of the EWMA of Bernoulli(α) misses
        drifting = group.num_observations >= 1 / w and group.share_above > alpha + self.config.drift_sd * standard_error
        if drifting and not group.is_drifting:
            logger.warning(
                "coverage drift in %s: %.1f %% of recent stages above the reserve, promised %.1f %%",
                key,
                100 * group.share_above,
                100 * alpha,
            )
        group.is_drifting = drifting

    def factor(self, role: str) -> float:
        """The multiplier for this role's token predictions now (1.0 until enough observations)."""
        state = self._roles.get(role)
        return 1.0 if state is None else math.exp(self._tokens_log(state, self._clock()))

    def reserve_factor(self, role: str, group: tuple[str, str, str] | None = None) -> float:
        """The multiplier for this role's reserves now: the tokens factor and the group's conformal shift."""
        return math.exp(self._reserve_log(self._roles.get(role), self._groups.get(group or role), self._clock()))

    def apply(
        self,
        role: str,
        tokens_pred: float,
        tokens_reserve: float,
        group: tuple[str, str, str] | None = None,
        is_new_app: bool = False,
    ) -> tuple[int, int, float, float]:
        """The served answer for the model's (tokens_pred, tokens_reserve): both corrected, the reserve never below
        the prediction; and the two factors used. A new app's answer: its reserve by the app's own level only."""
        if is_new_app and group is not None:
            point = round(tokens_pred)
            reserve = self.new_apps.reserve_tokens(group[0], self._unseen(point, tokens_reserve), point, None)
            return point, reserve, 1.0, reserve / max(tokens_reserve, 1)
        factor, reserve_factor = self.factor(role), self.reserve_factor(role, group)
        corrected = int(round(tokens_pred * factor))
        return corrected, max(corrected, int(math.ceil(tokens_reserve * reserve_factor))), factor, reserve_factor

    def snapshot(self) -> dict[str, dict]:
        """Every role's correction, for /stats and /observe: the tokens factor, and the widest reserve factor
        among the role's coverage groups."""
        now = self._clock()
        with self._lock:
            return {
                role: {
                    "factor": round(math.exp(self._tokens_log(s, now)), 4),
                    "reserve_factor": round(math.exp(self._widest_reserve_log(role, s, now)), 4),
                    "log_ratio": round(s.mean * self._decay(s, now), 4),
                    "num_observations": s.num_observations,
                    "age_s": round(now - s.updated_at, 1),
                    "is_active": s.num_observations >= self.config.min_observations,
                }
                for role, s in self._roles.items()
            }

    def _widest_reserve_log(self, role: str, state: _RoleState, now: float) -> float:
        """The largest reserve correction any of the role's coverage groups gets now (caller holds the lock)."""
        groups = [g for key, g in self._groups.items() if key == role or (isinstance(key, tuple) and key[1] == role)]
        return max((self._reserve_log(state, g, now) for g in groups), default=self._reserve_log(state, None, now))

    def coverage(self) -> dict[tuple[str, str, str] | str, dict]:
        """Every coverage group's recent share of stages above their served reserve, for /metrics."""
        with self._lock:
            return {
                key: {
                    "share_above_reserve": round(g.share_above, 4),
                    "num_observations": g.num_observations,
                    "is_drifting": g.is_drifting,
                }
                for key, g in self._groups.items()
            }
