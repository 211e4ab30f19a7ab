"""An unseen app's reserve level from its own finished stages: the one rule for an app the predictor never saw.

A NEW_APP reserve (`FallbackLevel.NEW_APP`) is the app's bound model lifted to the level that held for the worst
training app left out: a level calibrated on other apps, none on this one. Each finished stage answered so scores
log(1 + its output tokens) − log(1 + the reserve it was answered); once the app's last `max_scores` scores give a
finite split-conformal (1 − α) quantile (⌈(n + 1)(1 − α)⌉ ≤ n: 22 stages at α = 0.045), that quantile is the app's own
level and rescales every later reserve answered for it: reserve' = exp(log(1 + reserve) + level) − 1, within
[tokens_pred, max_tokens]. Before that, the answered reserve stands.

Here, beside `FallbackLevel`, because three places apply it alike, each holding one `OwnReserveLevels`: the simulator
(`serving.sim.stage_request.own_reserve`, `observe_stage`), the gateway with its in-process model
(`serving/gateway/prepare.py`, `record.py`) and the predictor service (`predictor_service.online.OnlineCorrection`),
whose answers the gateway then leaves as they are. Each calls `reserve_tokens` when the stage is answered and
`observe` once it has finished, with the reserve it was answered.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

from maestro.prediction import FallbackLevel

MAX_OWN_SCORES = 1000  # an unseen app's most recent finished stages its own reserve level is taken over
MAX_APPS = 10_000  # app names are client-supplied: past this many, the app observed longest ago is forgotten


@dataclass(frozen=True)
class UnseenReserve:
    """A reserve answered for an app the predictor never saw (`FallbackLevel.NEW_APP`): the reserve as sized from the
    answer (`sizing.reserve_output_tokens`), and the miss rate `alpha` its level was calibrated for, on the other
    apps."""

    reserve_tokens: int
    alpha: float


def unseen_reserve(
    fallback_level: FallbackLevel | str, reserve_tokens: int, alpha: float | None
) -> UnseenReserve | None:
    """The `UnseenReserve` of a reserve answered at `fallback_level`: one where the app is unseen
    (`FallbackLevel.NEW_APP`) and the model's miss rate `alpha` is known, else None (the reserve stands as sized)."""
    is_unseen = FallbackLevel(fallback_level) is FallbackLevel.NEW_APP
    return UnseenReserve(reserve_tokens, alpha) if is_unseen and alpha else None


class OwnReserveLevels:
    """Per unseen app, its last `max_scores` scores and the reserve level they stand behind (module docstring).

    Thread-safe: the predictor service answers and observes from several threads."""

    def __init__(self, max_scores: int = MAX_OWN_SCORES, max_apps: int = MAX_APPS):
        if max_scores < 1 or max_apps < 1:
            raise ValueError(f"OwnReserveLevels: max_scores and max_apps must be >= 1, got {max_scores} and {max_apps}")
        self.max_scores, self.max_apps = max_scores, max_apps
        self._scores: OrderedDict[str, deque[float]] = OrderedDict()
        self._levels: dict[str, dict[float, float | None]] = {}  # app → alpha → level, until the app's next score
        self._lock = threading.Lock()

    def observe(self, app: str, answer: UnseenReserve, output_tokens: int) -> None:
        """A stage of `app` answered `answer` ended with `output_tokens` output tokens."""
        if output_tokens < 0:
            raise ValueError(f"OwnReserveLevels.observe: output_tokens must be >= 0, got {output_tokens}")
        score = math.log1p(output_tokens) - math.log1p(answer.reserve_tokens)
        with self._lock:
            scores = self._scores.get(app)
            if scores is None:
                scores = self._scores[app] = deque(maxlen=self.max_scores)
                while len(self._scores) > self.max_apps:
                    forgotten, _ = self._scores.popitem(last=False)
                    self._levels.pop(forgotten, None)
            self._scores.move_to_end(app)
            scores.append(score)
            self._levels.pop(app, None)

    def num_scores(self, app: str) -> int:
        """How many of `app`'s finished stages its level is taken over now."""
        with self._lock:
            return len(self._scores.get(app, ()))

    def level(self, app: str, alpha: float) -> float | None:
        """The app's own split-conformal (1 − alpha) level in log space; None while its scores are too few."""
        with self._lock:
            if app not in self._scores:  # no finished stage yet (and nothing kept for a name never observed)
                return None
            levels = self._levels.setdefault(app, {})
            if alpha not in levels:  # sorted once per new score, not once per answer
                scores = sorted(self._scores.get(app, ()))
                rank = math.ceil((len(scores) + 1) * (1 - alpha))
                levels[alpha] = scores[rank - 1] if 0 < rank <= len(scores) else None
            return levels[alpha]

    def reserve_tokens(self, app: str, answer: UnseenReserve, tokens_pred: int, max_tokens: int | None) -> int:
        """The output tokens to reserve for a stage of `app` answered `answer`: rescaled by the app's own level
        where it has one, else the answer's; `max_tokens` None where the caller does not know the stage's cap (the
        predictor service: the gateway caps its answer)."""
        level = self.level(app, answer.alpha)
        if level is None:
            return answer.reserve_tokens
        rescaled = math.ceil(round(math.expm1(math.log1p(answer.reserve_tokens) + level), 6))  # no float residue
        reserve = max(tokens_pred, rescaled)
        return max(1, reserve if max_tokens is None else min(max_tokens, reserve))
