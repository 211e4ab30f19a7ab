"""How much KV a stage reserves: the reservation modes and the one prediction → reserve rule.

The gateway (`gateway/core.py` `prepare`) and the simulator (`sim/predictions.py`, `sim/dispatch.py`) both size
reserves here, so a policy name reserves the same tokens in both places. An unseen app's reserve, once sized here, is
rescaled by the app's own level (`maestro.own_reserve`, the rule the predictor service applies too).
"""

from __future__ import annotations

import enum
import math

from maestro.prediction import FallbackLevel, Prediction

DEFAULT_RHO = 0.2  # margin on a reserve that no calibration stands behind: reserve × (1 + rho)


class ReservationMode(enum.Enum):
    """What a stage maps when it starts."""

    MAX_LEN = "max-len"  # prompt + max_tokens up front
    PREDICTED = "predicted"  # prompt + the sized reserve, grown during decode if the stage outruns it
    PROJECTED = "projected"  # sized as predicted; admission projects every running stage's growth over time
    ON_DEMAND = "on-demand"  # prompt + one chunk, grown during decode (vLLM paging)

    def virtual_overcommit(self, overcommit: float) -> float:
        """How far a node's virtual space may exceed its pages for stages reserved this way: `overcommit`, except
        on demand, where a stage holds blocks for the tokens it has and no range for its max_tokens (vLLM 0.32's
        `KVCacheManager.allocate_slots` maps only the step's tokens), so nothing limits how many start but pages."""
        return math.inf if self is ReservationMode.ON_DEMAND else overcommit


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
