"""The predictor as the gateway sees it: predict(stages) → predictions, observe(outcome); never blocks long.

`LocalPredictor` answers in-process (a trained `pipelines.predictor.Predictor`, or its priors);
`HttpPredictor` calls predictor_service/ through its client when that is installed. Either way a
slow or failing predictor costs at most `timeout_s` and falls back to the priors.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

from pipelines.contract import StageTrace
from pipelines.predictor import Prediction, Predictor, Prior

log = logging.getLogger(__name__)
# Without a trained model: a generic answer (median 256 tokens, 95th percentile 1024), refined by observe().
DEFAULT_PRIOR = Prior(p_tool=0.3, tokens_median=256.0, tokens_upper=1024.0)


@dataclass(frozen=True)
class Outcome:
    """What actually happened to a stage, reported back after it finished."""

    workflow_id: str
    stage_id: str
    role: str
    output_tokens: int
    is_tool_call: bool
    tokens_pred: int


class StagePredictor(Protocol):
    async def predict(self, stages: list[StageTrace]) -> list[Prediction]: ...

    async def observe(self, outcome: Outcome) -> None: ...


class LocalPredictor:
    """In-process predictor: the priors answer synchronously (µs); a trained model runs in a thread with a timeout."""

    def __init__(self, predictor: Predictor | None = None, use_model: bool = False, timeout_s: float = 0.05):
        self.predictor = predictor or Predictor(None, None, {"": DEFAULT_PRIOR})
        self.use_model = use_model and self.predictor.model is not None
        self.timeout_s = timeout_s
        self.num_observed = 0
        self.num_fallbacks = 0

    @classmethod
    def from_location(cls, location: str, timeout_s: float) -> "LocalPredictor":
        if not location:
            return cls(timeout_s=timeout_s)
        return cls(Predictor.load(location), use_model=True, timeout_s=timeout_s)

    async def predict(self, stages: list[StageTrace]) -> list[Prediction]:
        if not self.use_model:
            return [self.predictor.prior(s) for s in stages]
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.predictor.predict, stages), self.timeout_s)
        except Exception as error:  # noqa: BLE001 — any model failure falls back to the priors
            self.num_fallbacks += 1
            log.debug("predictor fell back to priors: %r", error)
            return [self.predictor.prior(s) for s in stages]

    async def observe(self, outcome: Outcome) -> None:
        self.num_observed += 1


class HttpPredictor:
    """predictor_service/ over HTTP through its own client (strict timeout, local fallback answer)."""

    def __init__(self, url: str, timeout_s: float):
        from predictor_service.client import PredictorClient  # lands with issue 3

        self.client = PredictorClient(url, timeout_s=timeout_s)

    async def predict(self, stages: list[StageTrace]) -> list[Prediction]:
        return await self.client.apredict(stages)

    async def observe(self, outcome: Outcome) -> None:
        await self.client.aobserve(outcome)


def create_predictor(kind: str, model: str, timeout_s: float) -> StagePredictor:
    if kind == "local":
        return LocalPredictor.from_location(model, timeout_s)
    if kind.startswith(("http://", "https://")):
        return HttpPredictor(kind, timeout_s)
    raise ValueError(f"gateway config 'predictor': expected 'local' or an http(s) URL, got {kind!r}")
