"""The predictor as the gateway sees it: start() makes it ready, predict(stages) answers within a deadline,
observe(finished stage) feeds it; every answer says who gave it (`Source`) and is counted (`AnswerCounts`).

Stages travel as plain dicts with contract fields (`pipelines.contract.StageTrace` names), so the event loop
builds no pydantic object. `LocalPredictor` answers in-process: a trained `pipelines.predictor.Predictor` runs
on its own thread (`ModelWorker`), loaded and warmed before the gateway takes calls; without one, its priors
answer. `HttpPredictor` calls predictor_service/ through its `AsyncPredictorClient`, which bounds every call by
`timeout_s` and answers from the local prior when the service is slow, down or refuses; a finished stage goes to
/observe at once (stages that finish while one /observe is on the wire go together in the next), and `settled()`
returns once it has been sent: the gateway answers a JSON call after that, so the service holds the stage's
outcome before its caller can ask about its children, through this gateway or another.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from pipelines.contract import StageTrace, derive_structure
from pipelines.features import StageHistory
from pipelines.predictor import NO_MODEL_PRIOR, Prediction, Predictor, Prior
from predictor_service.async_client import AsyncPredictorClient
from predictor_service.client import ClientConfig, LocalFallback
from predictor_service.engine import WARMUP_STAGE, promised_miss_rate
from predictor_service.new_app import NewAppReserves
from predictor_service.schemas import PredictionOut
from serving.gateway.model_thread import ModelWorker

log = logging.getLogger(__name__)
# What /observe takes of a trace line: the contract fields (derived structure is recomputed by the service).
OBSERVED_FIELDS = frozenset(StageTrace.model_fields) - {"in_degree", "out_degree"}
# The GIL switch interval while a model thread shares the process with the event loop: a thread waiting for
# the GIL gets it after at most this long (Python's default, 5 ms, is paid at every one of the model's
# GIL hand-backs while the loop is busy: serving/gateway/README.md, "The trained predictor live").
SWITCH_INTERVAL_S = 0.0005


class Source(str, Enum):
    """Who answered a stage's prediction: the model, or the prior and why."""

    MODEL = "model"
    TIMEOUT = "timeout"  # the model gave no answer within predictor_timeout_s
    ERROR = "error"  # the model or the service failed on this call
    UNAVAILABLE = "unavailable"  # the service failed lately: the client answers locally during its cooldown
    NO_MODEL = "no_model"  # no trained model configured (or the service serves priors only)


FALLBACKS = tuple(s for s in Source if s is not Source.MODEL)


@dataclass(frozen=True, slots=True)
class StageAnswer:
    prediction: Prediction | PredictionOut
    source: Source


class AnswerCounts:
    """Stages answered by the model and by the prior (by reason). The first fallback of each reason is logged
    at WARNING with what caused it; the rest are only counted (/maestro/status, /metrics, traces)."""

    def __init__(self, what: str):
        self.what = what  # the predictor, as the log names it
        self.counts: Counter[Source] = Counter()

    def add(self, source: Source, num_stages: int, cause: str = "") -> None:
        if source is not Source.MODEL and not self.counts[source]:
            log.warning("predictor %s: a stage was answered by the prior (%s%s); further ones are only counted "
                        "(/maestro/status 'predictor')", self.what, source.value, f": {cause}" if cause else "")
        self.counts[source] += num_stages

    @property
    def num_model(self) -> int:
        return self.counts[Source.MODEL]

    @property
    def num_fallback(self) -> int:
        return sum(self.counts[s] for s in FALLBACKS)

    def snapshot(self) -> dict:
        total = self.num_model + self.num_fallback
        return {"answered_by_model": self.num_model, "answered_by_prior": self.num_fallback,
                "fallback_reasons": {s.value: self.counts[s] for s in FALLBACKS},
                "model_share": round(self.num_model / total, 4) if total else None}


class StagePredictor(Protocol):
    counts: AnswerCounts
    is_ready: bool

    async def start(self) -> None: ...

    async def predict(self, stages: list[dict]) -> list[StageAnswer]: ...

    def observe(self, stage: dict) -> None: ...

    async def settled(self) -> None:
        """Returns once the stages observed so far are in the predictor's history (or their sending failed)."""

    def snapshot(self) -> dict: ...

    async def aclose(self) -> None: ...


def observed_row(trace: dict) -> dict:
    """A finished stage as /observe takes it: the contract fields of its trace line."""
    return {k: v for k, v in trace.items() if k in OBSERVED_FIELDS}


def _priors(model: str) -> dict[str, Prior]:
    return Predictor.load(model).priors if model else {"": NO_MODEL_PRIOR}


class LocalPredictor:
    """In-process predictor: a trained model on its own thread (`ModelWorker`) within `timeout_s`, else the priors."""

    def __init__(self, predictor: Predictor | None = None, timeout_s: float = 0.5, what: str = "local"):
        self.predictor = predictor or Predictor(None, None, {"": NO_MODEL_PRIOR})
        self.fallback = LocalFallback(self.predictor.priors)
        self.timeout_s = timeout_s
        self.num_observed = 0
        self.history = StageHistory()  # finished stages: the ancestors of the stages predicted next
        self.counts = AnswerCounts(what)
        self.has_model = self.predictor.model is not None
        # an app training never saw: its reserve learnt from its own finished stages (predictor_service.new_app)
        self.new_apps = NewAppReserves(promised_miss_rate(self.predictor))
        self.worker = ModelWorker(self._parse, self._predict_batch) if self.has_model else None
        self.is_ready = not self.has_model  # a model is ready once start() has warmed it
        self.warmup_s: float | None = None

    @classmethod
    def from_location(cls, location: str, timeout_s: float) -> "LocalPredictor":
        if not location:
            return cls(timeout_s=timeout_s)
        return cls(Predictor.load(location), timeout_s=timeout_s, what=f"local model {location}")

    async def start(self) -> None:
        """Warm the model on its thread (MiniLM and the trees load lazily: seconds) before the first call."""
        if self.worker is None or self.is_ready:
            return
        started = time.monotonic()
        try:
            await asyncio.wrap_future(self.worker.start(self._warm_up))
        except Exception as error:
            raise RuntimeError(f"gateway config 'predictor_model': {self.counts.what} failed its warm-up prediction "
                               f"({type(error).__name__}: {error}); retrain it or fix the path") from error
        self.warmup_s = round(time.monotonic() - started, 3)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self.is_ready = True

    def _warm_up(self) -> None:
        featurizer = self.predictor.featurizer
        if featurizer is not None and featurizer.config.use_embedding:
            import torch

            torch.set_num_threads(1)  # one stage's MiniLM pass: more threads only contend with vLLM for cores
        self.predictor.predict([WARMUP_STAGE.model_copy()])

    async def predict(self, stages: list[dict]) -> list[StageAnswer]:
        if self.worker is None:
            return self._prior(stages, Source.NO_MODEL)
        if not self.is_ready:
            return self._prior(stages, Source.ERROR, "the model is not warmed up: the gateway was not started")
        try:
            answers = await asyncio.wait_for(self.worker.submit(stages, time.monotonic() + self.timeout_s),
                                             self.timeout_s)
        except TimeoutError:
            return self._prior(stages, Source.TIMEOUT, f"no model answer within {self.timeout_s} s")
        except Exception as error:  # noqa: BLE001 — any model failure falls back to the priors
            return self._prior(stages, Source.ERROR, f"{type(error).__name__}: {error}")
        self.counts.add(Source.MODEL, len(answers))
        return [StageAnswer(p, Source.MODEL) for p in answers]

    def _parse(self, stage_dicts: list[dict]) -> list[StageTrace]:
        # Order-dependent structure (call_index, depth) is fixed per call, before the model thread batches calls:
        # a stage's features do not depend on whose call it was predicted with (as predictor_service does).
        stages = [StageTrace.model_validate(s) for s in stage_dicts]
        return derive_structure(stages, self.history.known(stages))

    def _predict_batch(self, stages: list[StageTrace]) -> list[Prediction]:
        return self.new_apps.serve(stages, self.predictor.predict(stages, self.history))

    def _prior(self, stages: list[dict], source: Source, cause: str = "") -> list[StageAnswer]:
        self.counts.add(source, len(stages), cause)
        return [StageAnswer(self.fallback.answer(s), source) for s in stages]

    def observe(self, stage: dict) -> None:
        self.num_observed += 1
        if self.has_model:
            try:
                finished = StageTrace.model_validate(observed_row(stage))
                self.history.add([finished])
                self.new_apps.observe(finished)
            except ValueError as error:  # a trace line the contract refuses: its successors lose history only
                log.warning("finished stage %s/%s not kept for history: %s", stage.get("workflow_id"),
                            stage.get("stage_id"), error)

    async def settled(self) -> None:
        return  # observe() adds to the history at once

    def snapshot(self) -> dict:
        worker = self.worker
        return {"kind": "local", "model": self.counts.what, "ready": self.is_ready, "warmup_s": self.warmup_s,
                "timeout_s": self.timeout_s, **self.counts.snapshot(),
                **({"model_batches": worker.num_batches, "skipped_past_deadline": worker.num_expired,
                    "model_batch_time": worker.time_summary()} if worker else {})}

    async def aclose(self) -> None:
        if self.worker is not None:
            await asyncio.to_thread(self.worker.stop)


class HttpPredictor:
    """predictor_service/ over HTTP through its AsyncPredictorClient; observed stages go out in batches."""

    # The service featurizes a stage with its observed ancestors (StageHistory), and a workflow's next stage can
    # follow its parent within milliseconds, through this gateway or another replica: `observe_period_s` (a wait
    # before each /observe, to gather more stages into it) is 0 by default.
    def __init__(self, client: AsyncPredictorClient, observe_period_s: float = 0.0, max_pending: int = 10_000,
                 startup_timeout_s: float = 30.0):
        self.client = client
        self.observe_period_s = observe_period_s
        self.max_pending = max_pending
        self.startup_timeout_s = startup_timeout_s
        self.pending: list[dict] = []
        self.num_observed = 0
        self.num_observe_dropped = 0
        self.counts = AnswerCounts(f"service {client.config.url}")
        self.is_ready = False
        self.startup_error = ""
        self._flusher: asyncio.Task | None = None
        self._is_sending = False  # the flusher's batch is on the wire (cancelling it then could lose the batch)
        self._num_queued = 0  # stages given to observe()
        self._num_sent = 0  # of those, the first this many have had their /observe (taken or kept to retry)
        self._sent = asyncio.Condition()

    @classmethod
    def from_url(cls, url: str, model: str, timeout_s: float, startup_timeout_s: float = 30.0) -> "HttpPredictor":
        """The client with the gateway's deadline; its local fallback uses `model`'s priors when given."""
        client = AsyncPredictorClient(ClientConfig(url=url, timeout_s=timeout_s), LocalFallback(_priors(model)))
        return cls(client, startup_timeout_s=startup_timeout_s)

    async def start(self) -> None:
        """Wait (up to startup_timeout_s) for the service to report ready and answer one stage. A service that
        does not: the gateway starts anyway, its stages answered by the prior (counted), not ready (/ready)."""
        self.startup_error = await self.client.wait_ready(self.startup_timeout_s) or ""
        self.is_ready = not self.startup_error
        if self.startup_error:
            log.warning("predictor service %s is not ready (%s): stages are answered by the prior until it is",
                        self.client.config.url, self.startup_error)

    async def predict(self, stages: list[dict]) -> list[StageAnswer]:
        answers, reason = await self.client.predict_or_fallback(stages)
        # With service replicas, one call can mix answers from a replica and the local prior (a replica failed).
        fallback = {"timeout": Source.TIMEOUT, "cooldown": Source.UNAVAILABLE}.get(reason, Source.ERROR)
        out = []
        for answer in answers:
            is_local = answer.source == "local-fallback"
            out.append(StageAnswer(answer, fallback if is_local else _service_source(answer)))
            self.counts.add(out[-1].source, 1, self.client.breaker.last_error if is_local
                            else "the service answered from its prior")
        if reason is None:
            self.is_ready = True
        return out

    def observe(self, stage: dict) -> None:
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
            self.pending = (batch + self.pending)[-self.max_pending:]
        async with self._sent:
            self._num_sent = max(self._num_sent, upto)
            self._sent.notify_all()
        return is_taken

    async def settled(self) -> None:
        """Returns once every stage observed so far has had its /observe (within the client's timeout_s)."""
        upto = self._num_queued
        try:
            async with self._sent:
                await asyncio.wait_for(self._sent.wait_for(lambda: self._num_sent >= upto),
                                       self.client.config.timeout_s)
        except TimeoutError:
            pass

    def snapshot(self) -> dict:
        return {"kind": "service", "model": self.client.config.url, "ready": self.is_ready,
                "timeout_s": self.client.config.timeout_s, **self.counts.snapshot(),
                **({"startup_error": self.startup_error} if self.startup_error else {}),
                "last_error": self.client.breaker.last_error or None, "observed": self.num_observed,
                "observe_pending": len(self.pending)}

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


def _service_source(answer: PredictionOut) -> Source:
    """The service's own fallbacks: a stage its model raised on, or a service without a model."""
    if answer.source == "error-fallback":
        return Source.ERROR
    return Source.NO_MODEL if answer.fallback_level == "prior" else Source.MODEL


def create_predictor(kind: str, model: str, timeout_s: float, startup_timeout_s: float = 30.0) -> StagePredictor:
    if kind == "local":
        return LocalPredictor.from_location(model, timeout_s)
    if kind.startswith(("http://", "https://")):
        return HttpPredictor.from_url(kind, model, timeout_s, startup_timeout_s)
    raise ValueError(f"gateway config 'predictor': expected 'local' or an http(s) URL, got {kind!r}")
