"""The predictor service (predictor_service/) as the gateway's `StagePredictor`, over HTTP.

`HttpPredictor` calls the service through its `AsyncPredictorClient`, which bounds every call by `timeout_s` and
answers from the local prior when the service is slow, down or refuses; a finished stage goes to /observe at once
(stages that finish while one /observe is on the wire go together in the next), and `settled()` returns once it
has been sent: the gateway answers a JSON call after that, so the service holds the stage's outcome before its
caller can ask about its children, through this gateway or another.
"""

from __future__ import annotations

import asyncio
import logging

from maestro.contract import StageRow
from maestro.prediction import FallbackLevel, Source
from predictor_service.async_client import AsyncPredictorClient
from predictor_service.client import ClientConfig, LocalFallback
from predictor_service.schemas import PredictionOut
from serving.gateway.answers import AnswerCounts, StageAnswer, model_priors, observed_row

log = logging.getLogger(__name__)


class HttpPredictor:
    """predictor_service/ over HTTP through its AsyncPredictorClient; observed stages go out in batches."""

    # The service featurizes a stage with its observed ancestors (StageHistory), and a workflow's next stage can
    # follow its parent within milliseconds, through this gateway or another replica: `observe_period_s` (a wait
    # before each /observe, to gather more stages into it) is 0 by default.
    def __init__(
        self,
        client: AsyncPredictorClient,
        observe_period_s: float = 0.0,
        max_pending: int = 10_000,
        startup_timeout_s: float = 30.0,
    ):
        self.client = client
        self.observe_period_s = observe_period_s
        self.max_pending = max_pending
        self.startup_timeout_s = startup_timeout_s
        self.pending: list[StageRow] = []
        self.num_observed = 0
        self.num_observe_dropped = 0
        self.counts = AnswerCounts(f"service {client.config.url}")
        self.is_ready = False
        self.new_app_alpha = None  # the service rescales an unseen app's reserve itself, by maestro/own_reserve.py
        self.startup_error = ""
        self._flusher: asyncio.Task | None = None
        self._is_sending = False  # the flusher's batch is on the wire (cancelling it then could lose the batch)
        self._num_queued = 0  # stages given to observe()
        self._num_sent = 0  # of those, the first this many have had their /observe (taken or kept to retry)
        self._sent = asyncio.Condition()

    @classmethod
    def from_url(cls, url: str, model: str, timeout_s: float, startup_timeout_s: float = 30.0) -> HttpPredictor:
        """The client with the gateway's deadline; its local fallback uses `model`'s priors when given."""
        client = AsyncPredictorClient(ClientConfig(url=url, timeout_s=timeout_s), LocalFallback(model_priors(model)))
        return cls(client, startup_timeout_s=startup_timeout_s)

    async def start(self) -> None:
        """Wait (up to startup_timeout_s) for the service to report ready and answer one stage. A service that
        does not: the gateway starts anyway, its stages answered by the prior (counted), not ready (/ready)."""
        self.startup_error = await self.client.wait_ready(self.startup_timeout_s) or ""
        self.is_ready = not self.startup_error
        if self.startup_error:
            log.warning(
                "predictor service %s is not ready (%s): stages are answered by the prior until it is",
                self.client.config.url,
                self.startup_error,
            )

    async def predict(self, stages: list[StageRow]) -> list[StageAnswer]:
        answers, reason = await self.client.predict_or_fallback(stages)
        # With service replicas, one call can mix answers from a replica and the local prior (a replica failed).
        fallback = {"timeout": Source.TIMEOUT, "cooldown": Source.UNAVAILABLE}.get(reason, Source.ERROR)
        out = []
        for answer in answers:
            is_local = answer.source is Source.LOCAL_FALLBACK
            out.append(StageAnswer(answer.prediction(), fallback if is_local else gateway_source(answer)))
            self.counts.add(
                out[-1].source, 1, self.client.breaker.last_error if is_local else "the service answered from its prior"
            )
        if reason is None:
            self.is_ready = True
        return out

    def observe(self, stage: StageRow) -> None:
        self._num_queued += 1
        if len(self.pending) >= self.max_pending:  # the service has been away a long time: keep the newest
            self.pending.pop(0)
            self.num_observe_dropped += 1
        self.pending.append(observed_row(stage))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        """Send what is pending, then what came in while it was on the wire, until nothing is left; a failed send
        keeps its stages for the next observe()."""
        await asyncio.sleep(self.observe_period_s)
        while self.pending:
            self._is_sending = True
            try:
                if not await self.flush():
                    return
            finally:
                self._is_sending = False

    async def flush(self) -> bool:
        """Send what is pending (the client splits into ≤ 256-stage requests); kept for the next try on failure."""
        batch, self.pending, upto = self.pending, [], self._num_queued
        if not batch:
            return True
        is_taken = await self.client.observe(batch)
        if is_taken:
            self.num_observed += len(batch)
        else:
            self.pending = (batch + self.pending)[-self.max_pending :]
        async with self._sent:
            self._num_sent = max(self._num_sent, upto)
            self._sent.notify_all()
        return is_taken

    async def settled(self) -> None:
        """Returns once every stage observed so far has had its /observe (within the client's timeout_s)."""
        upto = self._num_queued
        try:
            async with self._sent:
                await asyncio.wait_for(
                    self._sent.wait_for(lambda: self._num_sent >= upto), self.client.config.timeout_s
                )
        except TimeoutError:
            pass

    def snapshot(self) -> dict:
        return {
            "kind": "service",
            "model": self.client.config.url,
            "ready": self.is_ready,
            "timeout_s": self.client.config.timeout_s,
            **self.counts.snapshot(),
            **({"startup_error": self.startup_error} if self.startup_error else {}),
            "last_error": self.client.breaker.last_error or None,
            "observed": self.num_observed,
            "observe_pending": len(self.pending),
        }

    async def aclose(self) -> None:
        # A flusher still sleeping is cancelled; one sending is awaited: cancelling it mid-request dropped its
        # batch (taken out of `pending`, never put back) — seen as a test observing 1 of 3 stages under load.
        if self._flusher is not None and not self._flusher.done():
            if self._is_sending:
                await asyncio.wait({self._flusher})
            else:
                self._flusher.cancel()
        await self.flush()
        await self.client.aclose()


def gateway_source(answer: PredictionOut) -> Source:
    """The gateway's name for a service's answer: a stage its model raised on, a service without a model, or
    the model."""
    if answer.source is Source.ERROR_FALLBACK:
        return Source.ERROR
    return Source.NO_MODEL if answer.fallback_level is FallbackLevel.PRIOR else Source.MODEL
