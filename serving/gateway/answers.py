"""What the gateway's predictors share: a stage's answer (its `Prediction` and the `Source` that gave it), the
counts of answers by source, the `StagePredictor` interface (predict.py's LocalPredictor, http_predictor.py's
HttpPredictor), and the finished-stage row both observe."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from maestro.contract import StageRow, StageTrace
from maestro.prediction import Prediction, Source
from pipelines.predictor import NO_MODEL_PRIOR, Prior
from serving.gateway.model_source import load_model

log = logging.getLogger(__name__)
# What /observe takes of a trace line: the contract fields (derived structure is recomputed by the service).
OBSERVED_FIELDS = frozenset(StageTrace.model_fields) - {"in_degree", "out_degree"}
# Why the gateway served a prior: the service's own names for its fallbacks become one of these (http_predictor.py).
FALLBACKS = (Source.TIMEOUT, Source.ERROR, Source.UNAVAILABLE, Source.NO_MODEL)


@dataclass(frozen=True, slots=True)
class StageAnswer:
    """A stage's prediction as the gateway serves it, who gave it and, where the predictor knows, when it was
    ready (monotonic: the model's finish, or the deadline at which the prior answered), so the stage's `predict_s`
    is the predictor's wait, not the event loop's delay in getting back to the call."""

    prediction: Prediction
    source: Source
    answered_s: float | None = None


class AnswerCounts:
    """Stages answered by the model and by the prior (by reason). The first fallback of each reason is logged
    at WARNING with what caused it; the rest are only counted (/maestro/status, /metrics, traces)."""

    def __init__(self, what: str):
        self.what = what  # the predictor, as the log names it
        self.counts: Counter[Source] = Counter()

    def add(self, source: Source, num_stages: int, cause: str = "") -> None:
        if source is not Source.MODEL and not self.counts[source]:
            log.warning(
                "predictor %s: a stage was answered by the prior (%s%s); further ones are only counted "
                "(/maestro/status 'predictor')",
                self.what,
                source.value,
                f": {cause}" if cause else "",
            )
        self.counts[source] += num_stages

    @property
    def num_model(self) -> int:
        return self.counts[Source.MODEL]

    @property
    def num_fallback(self) -> int:
        return sum(self.counts[s] for s in FALLBACKS)

    def snapshot(self) -> dict:
        total = self.num_model + self.num_fallback
        return {
            "answered_by_model": self.num_model,
            "answered_by_prior": self.num_fallback,
            "fallback_reasons": {s.value: self.counts[s] for s in FALLBACKS},
            "model_share": round(self.num_model / total, 4) if total else None,
        }


class StagePredictor(Protocol):
    counts: AnswerCounts
    is_ready: bool
    # the miss rate α an unseen app's (`NEW_APP`) reserve level was calibrated for, where the gateway rescales that
    # reserve by the app's own level (`maestro.own_reserve`); None where the predictor rescales it itself by that rule
    new_app_alpha: float | None

    async def start(self) -> None: ...

    async def predict(self, stages: list[StageRow]) -> list[StageAnswer]: ...

    def observe(self, stage: StageRow) -> None: ...

    async def settled(self) -> None:
        """Returns once the stages observed so far are in the predictor's history (or their sending failed)."""

    def snapshot(self) -> dict: ...

    async def aclose(self) -> None: ...


def observed_row(trace: StageRow) -> StageRow:
    """A finished stage as /observe takes it: the contract fields of its trace line."""
    return {k: v for k, v in trace.items() if k in OBSERVED_FIELDS}


def model_priors(model: str) -> dict[str, Prior]:
    """The priors of the model at `model` (a registry URI or a directory: model_source.py), or the no-model prior
    without one."""
    return load_model(model)[0].priors if model else {"": NO_MODEL_PRIOR}
