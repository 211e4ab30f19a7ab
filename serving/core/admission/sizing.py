"""How much KV a stage reserves: the reservation modes and the one prediction → reserve rule.

The gateway (`gateway/core.py` `prepare`) and the simulator (`sim/predictions.py`, `sim/dispatch.py`) both size
reserves here, so a policy name reserves the same tokens in both places.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass

from maestro.prediction import FallbackLevel, Prediction

DEFAULT_RHO = 0.2  # margin on a reserve that no calibration stands behind: reserve × (1 + rho)
MAX_OWN_SCORES = 1000  # an unseen app's most recent finished stages its own reserve level is taken over


class ReservationMode(enum.Enum):
    """What a stage maps when it starts."""

    MAX_LEN = "max-len"  # prompt + max_tokens up front
    PREDICTED = "predicted"  # prompt + the sized reserve, grown during decode if the stage outruns it
    PROJECTED = "projected"  # sized as predicted; admission projects every running stage's growth over time
    ON_DEMAND = "on-demand"  # prompt + one chunk, grown during decode (vLLM paging)


LengthPrediction = Prediction  # the simulator's name for the type sizing reads


def is_calibrated(prediction: Prediction) -> bool:
    """Whether the prediction's reserve is already a calibrated upper bound (`FallbackLevel.is_calibrated`).

    Reads only `fallback_level`, a `FallbackLevel` or its value (a trace line's, say)."""
    return FallbackLevel(prediction.fallback_level).is_calibrated


def reserve_output_tokens(
    tokens_pred: int, tokens_reserve: int, max_tokens: int, *, is_calibrated: bool, rho: float = DEFAULT_RHO
) -> int:
    """Output tokens to reserve for a stage: `tokens_reserve` as is if calibrated, else × (1 + rho); never below the
    point estimate `tokens_pred`; in [1, max_tokens].

    The margin is applied here and nowhere else, so a reserve gets it at most once. Callers say whether the reserve
    is calibrated: `is_calibrated(prediction)` for a predictor's answer; the simulator's oracle and noise brackets
    are (the true length; the q-quantile of the true length given the noisy prediction).
    """
    if not 0 <= rho <= 1:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    margin = 1.0 if is_calibrated else 1.0 + rho
    return max(1, min(max_tokens, max(tokens_pred, math.ceil(tokens_reserve * margin))))


def output_tokens_to_map(
    mode: ReservationMode, reserve_tokens: int, max_tokens: int, generated_tokens: int = 0, chunk_tokens: int = 1
) -> int:
    """Output tokens a (re)starting stage maps beyond its context, under `mode`: at least 1, never past max_tokens.

    `reserve_tokens` is `reserve_output_tokens`'s answer; `generated_tokens` what the stage produced before a
    preemption (already in its context); `chunk_tokens` the on-demand growth step.
    """
    left = max_tokens - generated_tokens
    if mode is ReservationMode.MAX_LEN:
        extra = left
    elif mode is ReservationMode.ON_DEMAND:
        extra = chunk_tokens
    else:
        extra = reserve_tokens - generated_tokens
    return max(1, min(left, extra))


def headroom_pages(admission_headroom_frac: float, num_pages: int) -> int:
    """Pages of a node's pool of `num_pages` that admission keeps free (`System.admission_headroom_frac`): a stage
    starts only if what it maps now, and these, fit in the free pages."""
    return int(admission_headroom_frac * num_pages)


@dataclass(frozen=True)
class UnseenReserve:
    """A reserve answered for an app the predictor never saw (`FallbackLevel.NEW_APP`): the reserve as sized from the
    answer (`reserve_output_tokens`), and the miss rate `alpha` its level was calibrated for, on the other apps."""

    reserve_tokens: int
    alpha: float


def unseen_reserve(
    fallback_level: FallbackLevel | str, reserve_tokens: int, alpha: float | None
) -> UnseenReserve | None:
    """The `UnseenReserve` of a reserve sized (`reserve_output_tokens`) from an answer at `fallback_level`: one where
    the app is unseen (`FallbackLevel.NEW_APP`) and the model's miss rate `alpha` is known, else None (the reserve
    stands as sized). The gateway's `prepare` and the simulator's readiness tag answers through it."""
    is_unseen = FallbackLevel(fallback_level) is FallbackLevel.NEW_APP
    return UnseenReserve(reserve_tokens, alpha) if is_unseen and alpha else None


class OwnReserveLevels:
    """An unseen app's reserve level from its own finished stages, once they can stand behind one.

    A NEW_APP reserve is the app's bound model lifted to the level that held for the worst training app left out: a
    level calibrated on other apps, none on this one. Each finished stage answered so scores log(1 + its output
    tokens) − log(1 + the reserve it was answered); once the app's last `max_scores` scores give a finite
    split-conformal (1 − α) quantile (⌈(n + 1)(1 − α)⌉ ≤ n: 22 stages at α = 0.045), that quantile is the app's own
    level and rescales every later reserve answered for it: reserve' = exp(log(1 + reserve) + level) − 1, within
    [tokens_pred, max_tokens]. Before that, the answered reserve stands. The app's remaining work follows the same
    rule (serving/core/scheduler/remaining.py). The simulator (`serving.sim.stage_request.own_reserve`,
    `observe_stage`) and the gateway (`gateway/prepare.py`, `gateway/record.py`) each hold one and apply it alike:
    `reserve_tokens` at readiness, `observe` once the stage has finished, with the reserve it was answered.
    """

    def __init__(self, max_scores: int = MAX_OWN_SCORES):
        if max_scores < 1:
            raise ValueError(f"OwnReserveLevels: max_scores must be >= 1, got {max_scores}")
        self.max_scores = max_scores
        self._scores: dict[str, deque[float]] = {}

    def observe(self, app: str, answer: UnseenReserve, output_tokens: int) -> None:
        """A stage of `app` answered `answer` ended with `output_tokens` output tokens."""
        if output_tokens < 0:
            raise ValueError(f"OwnReserveLevels.observe: output_tokens must be >= 0, got {output_tokens}")
        scores = self._scores.setdefault(app, deque(maxlen=self.max_scores))
        scores.append(math.log1p(output_tokens) - math.log1p(answer.reserve_tokens))

    def level(self, app: str, alpha: float) -> float | None:
        """The app's own split-conformal (1 − alpha) level in log space; None while its scores are too few."""
        scores = sorted(self._scores.get(app, ()))
        rank = math.ceil((len(scores) + 1) * (1 - alpha))
        return scores[rank - 1] if 0 < rank <= len(scores) else None

    def reserve_tokens(self, app: str, answer: UnseenReserve, tokens_pred: int, max_tokens: int) -> int:
        """The output tokens to reserve for a stage of `app` answered `answer`: rescaled by the app's own level
        where it has one, else the answer's."""
        level = self.level(app, answer.alpha)
        if level is None:
            return answer.reserve_tokens
        rescaled = math.ceil(round(math.expm1(math.log1p(answer.reserve_tokens) + level), 6))  # no float residue
        return max(1, min(max_tokens, max(tokens_pred, rescaled)))
