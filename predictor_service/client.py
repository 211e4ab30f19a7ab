"""The blocking predictor client, and what it shares with the asyncio one (async_client.py): config, wire, fallback.

Scheduling never waits on the predictor: a call returns within `timeout_s` (plus a little thread
hand-off), and when the service is slow, down or refuses the request, each stage gets the prior
(per-role from a local Predictor's priors, else `pipelines.predictor.NO_MODEL_PRIOR`), its source
`Source.LOCAL_FALLBACK` and its level `FallbackLevel.PRIOR`. After a failure the client answers locally for
`cooldown_s` without touching the network, so a dead node costs nothing per call.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import httpx
from pydantic import TypeAdapter

from maestro.contract import StageTrace
from maestro.prediction import Prediction, Source
from pipelines.predictor import NO_MODEL_PRIOR, Prior
from predictor_service.replicas import split_urls
from predictor_service.schemas import LABEL_FIELDS, MAX_STAGES_PER_REQUEST, PredictionOut

logger = logging.getLogger(__name__)
_ANSWERS = TypeAdapter(list[PredictionOut])
_WIRE_EXCLUDE = {*LABEL_FIELDS, "in_degree", "out_degree"}
# Idle connections expire after 2 s: the server (uvicorn) closes them after 5 s, httpx's default expiry is
# also 5 s, and a connection reused in that race failed the call (then the cooldown answered with priors).
LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=2.0)


@dataclass(frozen=True)
class ClientConfig:
    url: str  # one service, or its replicas separated by commas (AsyncPredictorClient routes by workflow)
    timeout_s: float = 0.1  # the whole call, all batches together
    max_batch: int = MAX_STAGES_PER_REQUEST
    route: str = "/predict"
    cooldown_s: float = 1.0  # after a failure, answer locally this long before trying the service again

    def __post_init__(self) -> None:
        split_urls(self.url)  # raises on a malformed URL
        if self.timeout_s <= 0 or self.cooldown_s < 0:
            raise ValueError(f"timeout_s must be > 0 and cooldown_s ≥ 0, got {self.timeout_s}, {self.cooldown_s}")
        if not 1 <= self.max_batch <= MAX_STAGES_PER_REQUEST:
            raise ValueError(f"max_batch must be in [1, {MAX_STAGES_PER_REQUEST}], got {self.max_batch}")

    @property
    def urls(self) -> tuple[str, ...]:
        return split_urls(self.url)


class LocalFallback:
    """The prior answer for a stage, computed in-process: per role where known, else global."""

    def __init__(self, priors: dict[str, Prior] | None = None):
        self.priors = dict(priors or {})
        self.priors.setdefault("", NO_MODEL_PRIOR)

    def predict(self, stage: dict) -> Prediction:
        prior = self.priors.get(str(stage.get("role")), self.priors[""])
        return prior.answer(str(stage.get("workflow_id")), str(stage.get("stage_id")))

    def answer(self, stage: dict) -> PredictionOut:
        """The prior's answer as the service's would read: model_version "local", source "local-fallback"."""
        return PredictionOut.of(self.predict(stage), model_version="local", source=Source.LOCAL_FALLBACK)


def to_wire(stage: StageTrace | dict) -> dict:
    """A stage as /predict takes it: contract fields, labels and derived fields left out."""
    if isinstance(stage, StageTrace):
        return stage.model_dump(mode="json", exclude_none=True, exclude=_WIRE_EXCLUDE)
    return {k: v for k, v in stage.items() if k not in _WIRE_EXCLUDE and v is not None}


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class Breaker:
    """Remembers the last failure so calls inside the cooldown skip the network."""

    def __init__(self, cooldown_s: float):
        self.cooldown_s, self.open_until, self.last_error = cooldown_s, 0.0, ""

    def is_open(self) -> bool:
        return time.monotonic() < self.open_until

    def trip(self, error: BaseException | str) -> None:
        """Record the failure; open (skip the network) unless the service is fine and only refused this request."""
        self.last_error = describe(error)
        if not is_refusal(error):
            self.open_until = time.monotonic() + self.cooldown_s


def is_refusal(error: BaseException | str) -> bool:
    """The service is up and turned this request down (4xx): another try, or another replica, would too."""
    return isinstance(error, httpx.HTTPStatusError) and 400 <= error.response.status_code < 500


def describe(error: BaseException | str) -> str:
    if isinstance(error, httpx.HTTPStatusError):
        return f"HTTP {error.response.status_code}: {error.response.text[:500]}"
    return error if isinstance(error, str) else f"{type(error).__name__}: {error}"


def parse_answers(response: httpx.Response, sent: list[dict]) -> list[PredictionOut]:
    response.raise_for_status()
    answers = _ANSWERS.validate_json(response.content)
    if len(answers) != len(sent):
        raise ValueError(f"service answered {len(answers)} predictions for {len(sent)} stages")
    return answers


class PredictorClient:
    """Blocking client; `predict` returns within the deadline whatever the service does."""

    def __init__(
        self, config: ClientConfig, fallback: LocalFallback | None = None, transport: httpx.BaseTransport | None = None
    ):
        """`transport`: httpx's, e.g. `httpx.WSGITransport` or a mock; default: the network."""
        if len(config.urls) > 1:
            raise ValueError("PredictorClient talks to one service; for replicas use AsyncPredictorClient")
        self.config, self.fallback = config, fallback or LocalFallback()
        self.breaker = Breaker(config.cooldown_s)
        self._http = httpx.Client(base_url=config.url, timeout=config.timeout_s, transport=transport, limits=LIMITS)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="predictor-client")
        self._lock = threading.Lock()

    def predict(self, stages: Iterable[StageTrace | dict]) -> list[PredictionOut]:
        wire = [to_wire(s) for s in stages]
        if not wire:
            return []
        if self.breaker.is_open():
            return [self.fallback.answer(s) for s in wire]
        future = self._pool.submit(self._predict_remote, wire)
        try:
            return future.result(timeout=self.config.timeout_s)
        except Exception as error:  # timeout, connection, HTTP or parse error: the prior answers
            future.cancel()
            self._failed(error)
            return [self.fallback.answer(s) for s in wire]

    def _predict_remote(self, wire: list[dict]) -> list[PredictionOut]:
        answers: list[PredictionOut] = []
        for batch in chunks(wire, self.config.max_batch):
            answers.extend(parse_answers(self._http.post(self.config.route, json={"stages": batch}), batch))
        return answers

    def observe(self, stages: Iterable[StageTrace | dict]) -> bool:
        """Report finished stages (with labels and timings); False when the service did not take them."""
        rows = [
            s.model_dump(mode="json", exclude_none=True, exclude={"in_degree", "out_degree"})
            if isinstance(s, StageTrace)
            else s
            for s in stages
        ]
        try:
            for batch in chunks(rows, self.config.max_batch):
                self._http.post("/observe", json={"stages": batch}).raise_for_status()
            return True
        except Exception as error:
            self._failed(error)
            return False

    def _failed(self, error: BaseException) -> None:
        with self._lock:
            # the caller's wait and httpx's own timeout are both `timeout_s`: whichever fires first, it is the deadline
            is_deadline = isinstance(error, (concurrent.futures.TimeoutError, httpx.TimeoutException))
            self.breaker.trip(f"no answer within {self.config.timeout_s} s" if is_deadline else error)
        logger.warning("predictor %s: %s; answering from the local prior", self.config.url, self.breaker.last_error)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    def __enter__(self) -> PredictorClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
