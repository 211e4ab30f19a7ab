"""Clients the scheduler calls: sync and async, strict deadline, and a local answer when the service can't give one.

Scheduling never waits on the predictor: a call returns within `timeout_s` (plus a little thread
hand-off), and when the service is slow, down or refuses the request, each stage gets the prior
(per-role from a local Predictor's priors, else `pipelines.predictor.NO_MODEL_PRIOR`) flagged `source="local-fallback"`,
`fallback_level="prior"`. After a failure the client answers locally for `cooldown_s` without
touching the network, so a dead node costs nothing per call.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Iterable

import httpx
from pydantic import TypeAdapter

from pipelines.contract import StageTrace
from pipelines.predictor import NO_MODEL_PRIOR, Prior
from predictor_service.replicas import Ring, split_urls
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

    def answer(self, stage: dict) -> PredictionOut:
        prior = self.priors.get(str(stage.get("role")), self.priors[""])
        return PredictionOut(workflow_id=str(stage.get("workflow_id")), stage_id=str(stage.get("stage_id")),
                             p_tool=round(prior.p_tool, 4), tokens_pred=int(round(prior.tokens_median)),
                             tokens_reserve=int(math.ceil(prior.tokens_upper)), fallback_level="prior", history="none",
                             model_version="local", source="local-fallback")


def to_wire(stage: StageTrace | dict) -> dict:
    """A stage as /predict takes it: contract fields, labels and derived fields left out."""
    if isinstance(stage, StageTrace):
        return stage.model_dump(mode="json", exclude_none=True, exclude=_WIRE_EXCLUDE)
    return {k: v for k, v in stage.items() if k not in _WIRE_EXCLUDE and v is not None}


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class _Breaker:
    """Remembers the last failure so calls inside the cooldown skip the network."""

    def __init__(self, cooldown_s: float):
        self.cooldown_s, self.open_until, self.last_error = cooldown_s, 0.0, ""

    def is_open(self) -> bool:
        return time.monotonic() < self.open_until

    def trip(self, error: BaseException | str) -> None:
        """Record the failure; open (skip the network) unless the service is fine and only refused this request."""
        self.last_error = _describe(error)
        if not is_refusal(error):
            self.open_until = time.monotonic() + self.cooldown_s


def is_refusal(error: BaseException | str) -> bool:
    """The service is up and turned this request down (4xx): another try, or another replica, would too."""
    return isinstance(error, httpx.HTTPStatusError) and 400 <= error.response.status_code < 500


def _describe(error: BaseException | str) -> str:
    if isinstance(error, httpx.HTTPStatusError):
        return f"HTTP {error.response.status_code}: {error.response.text[:500]}"
    return error if isinstance(error, str) else f"{type(error).__name__}: {error}"


def _parse(response: httpx.Response, sent: list[dict]) -> list[PredictionOut]:
    response.raise_for_status()
    answers = _ANSWERS.validate_json(response.content)
    if len(answers) != len(sent):
        raise ValueError(f"service answered {len(answers)} predictions for {len(sent)} stages")
    return answers


class PredictorClient:
    """Blocking client; `predict` returns within the deadline whatever the service does."""

    def __init__(self, config: ClientConfig, fallback: LocalFallback | None = None,
                 transport: httpx.BaseTransport | None = None):
        """`transport`: httpx's, e.g. `httpx.WSGITransport` or a mock; default: the network."""
        if len(config.urls) > 1:
            raise ValueError("PredictorClient talks to one service; for replicas use AsyncPredictorClient")
        self.config, self.fallback = config, fallback or LocalFallback()
        self.breaker = _Breaker(config.cooldown_s)
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
            answers.extend(_parse(self._http.post(self.config.route, json={"stages": batch}), batch))
        return answers

    def observe(self, stages: Iterable[StageTrace | dict]) -> bool:
        """Report finished stages (with labels and timings); False when the service did not take them."""
        rows = [s.model_dump(mode="json", exclude_none=True, exclude={"in_degree", "out_degree"})
                if isinstance(s, StageTrace) else s for s in stages]
        try:
            for batch in chunks(rows, self.config.max_batch):
                self._http.post("/observe", json={"stages": batch}).raise_for_status()
            return True
        except Exception as error:
            self._failed(error)
            return False

    def _failed(self, error: BaseException) -> None:
        with self._lock:
            self.breaker.trip(error if not isinstance(error, concurrent.futures.TimeoutError)
                              else f"no answer within {self.config.timeout_s} s")
        logger.warning("predictor %s: %s; answering from the local prior", self.config.url, self.breaker.last_error)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    def __enter__(self) -> "PredictorClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncPredictorClient:
    """asyncio client over one service or its replicas; the whole call is bounded by `timeout_s`.

    With replicas, each stage goes to its workflow's owner on the ring (`replicas.Ring`); a replica that
    fails (connection, timeout, 5xx) is skipped for `cooldown_s` and its stages go to the next replica on
    the ring within the same deadline. Finished stages go to the owner (/observe) and to the next replica
    (/history), so the replica a workflow fails over to already holds its history."""

    def __init__(self, config: ClientConfig, fallback: LocalFallback | None = None,
                 transport: httpx.AsyncBaseTransport | None = None):
        """`transport`: httpx's, e.g. `httpx.ASGITransport(app)` to talk to a service in process."""
        self.config, self.fallback = config, fallback or LocalFallback()
        self.breaker = _Breaker(config.cooldown_s)  # the last failure, whichever replica it came from
        self.ring = Ring(config.urls)
        self._http = {url: httpx.AsyncClient(base_url=url, timeout=config.timeout_s, transport=transport,
                                             limits=LIMITS) for url in config.urls}

    async def predict(self, stages: Iterable[StageTrace | dict]) -> list[PredictionOut]:
        return (await self.predict_or_fallback(stages))[0]

    async def predict_or_fallback(self, stages: Iterable[StageTrace | dict]
                                  ) -> tuple[list[PredictionOut], str | None]:
        """The answers, and None if the service gave them all, else why the local prior gave some: "timeout",
        "error" (connection, HTTP or parse; `breaker.last_error` says which) or "cooldown" (no replica of the
        stage's workflow is up: each failed within cooldown_s)."""
        wire = [to_wire(s) for s in stages]
        answers: list[PredictionOut | None] = [None] * len(wire)
        reasons: list[str] = []
        in_flight: set[str] = set()  # replicas with this call's /predict on the wire
        try:
            async with asyncio.timeout(self.config.timeout_s):
                await self._predict_routed(wire, answers, reasons, in_flight)
        except TimeoutError:
            self._failed(f"no answer within {self.config.timeout_s} s", *in_flight)
            reasons.append("timeout")
        missing = [i for i, a in enumerate(answers) if a is None]
        for i in missing:
            answers[i] = self.fallback.answer(wire[i])
        if missing:
            logger.warning("predictor %s: %s; %d stage(s) answered from the local prior", self.config.url,
                           self.breaker.last_error, len(missing))
        return answers, (reasons[-1] if reasons else "error") if missing else None

    async def _predict_routed(self, wire: list[dict], answers: list, reasons: list[str], in_flight: set[str]
                              ) -> None:
        """Fill `answers` from each stage's live owner; a replica that fails hands its stages to the next."""
        failed: set[str] = set()  # in this call: with cooldown_s = 0 the ring would offer them again
        while pending := [i for i, a in enumerate(answers) if a is None]:
            groups = self.ring.group([wire[i] for i in pending], skip=failed)
            if None in groups:  # no live replica left for these: one failed in this call, or lately
                reasons.append("error" if failed else "cooldown")
                groups.pop(None)
            if not groups:
                return
            results = await asyncio.gather(*(self._predict_on(url, [pending[j] for j in group], wire, answers,
                                                              in_flight) for url, group in groups.items()))
            failed.update(url for url, error in zip(groups, results) if error is not None)
            if any(is_refusal(error) for error in results):  # another replica would refuse them too
                reasons.append("error")
                return

    async def _predict_on(self, url: str, indices: list[int], wire: list[dict], answers: list,
                          in_flight: set[str]) -> BaseException | None:
        """Answer `indices` from replica `url`; the error if it failed (those stages stay unanswered)."""
        in_flight.add(url)
        try:
            for batch in chunks(indices, self.config.max_batch):
                for i, answer in zip(batch, await self._post(url, [wire[i] for i in batch])):
                    answers[i] = answer
            return None
        except Exception as error:  # connection, HTTP or parse error: the ring skips this replica for a while
            self._failed(error, url)
            return error
        finally:
            in_flight.discard(url)

    def _failed(self, error: BaseException | str, *urls: str) -> None:
        self.breaker.trip(error)
        if not is_refusal(error):
            for url in urls:
                self.ring.mark_down(url, self.config.cooldown_s)

    async def wait_ready(self, timeout_s: float, poll_s: float = 0.2) -> str | None:
        """Wait until every replica reports ready (BentoML's /readyz) and answers a warm-up stage, each request
        with the time left (not the per-call deadline); None when all did, else what went wrong last, by replica."""
        problems = await asyncio.gather(*(self._wait_ready(url, timeout_s, poll_s) for url in self._http))
        found = [f"{url}: {problem}" if len(self._http) > 1 else problem
                 for url, problem in zip(self._http, problems) if problem]
        return "; ".join(found) or None

    async def _wait_ready(self, url: str, timeout_s: float, poll_s: float) -> str | None:
        from predictor_service.engine import WARMUP_STAGE

        deadline, problem, stage = time.monotonic() + timeout_s, "no answer yet", to_wire(WARMUP_STAGE)
        http = self._http[url]
        while (left := deadline - time.monotonic()) > 0:
            try:
                (await http.get("/readyz", timeout=left)).raise_for_status()
                response = await http.post(self.config.route, json={"stages": [stage]},
                                           timeout=max(left, self.config.timeout_s))
                _parse(response, [stage])
                return None
            except Exception as error:  # not up yet, not ready yet, or refusing: try again until the deadline
                problem = _describe(error)
            await asyncio.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        return f"not ready within {timeout_s} s: {problem}"

    async def _post(self, url: str, batch: list[dict]) -> list[PredictionOut]:
        return _parse(await self._http[url].post(self.config.route, json={"stages": batch}), batch)

    async def observe(self, stages: Iterable[StageTrace | dict]) -> bool:
        """Report finished stages to their workflows' owners (/observe) and the next replica on the ring
        (/history); False when some owner did not take them."""
        rows = [s.model_dump(mode="json", exclude_none=True, exclude={"in_degree", "out_degree"})
                if isinstance(s, StageTrace) else s for s in stages]
        taken, _ = await asyncio.gather(self._send_routed("/observe", rows, rank=0),
                                        self._send_routed("/history", rows, rank=1))
        return taken

    async def _send_routed(self, route: str, rows: list[dict], rank: int) -> bool:
        """POST `rows` to each one's `rank`-th live replica, failing over; True when every row was taken."""
        left, failed = list(range(len(rows))), set()
        while left:
            groups = self.ring.group([rows[i] for i in left], rank, skip=failed)
            if None in groups:  # no such live replica (a backup with one replica up is not an error)
                return rank > 0
            results = await asyncio.gather(*(self._send_on(url, route, [rows[left[j]] for j in group])
                                              for url, group in groups.items()))
            if any(is_refusal(error) for error in results):
                return False
            failed.update(url for url, error in zip(groups, results) if error is not None)
            left = [left[j] for (url, group), error in zip(groups.items(), results) if error for j in group]
        return True

    async def _send_on(self, url: str, route: str, rows: list[dict]) -> BaseException | None:
        """Send `rows` to replica `url`; the error if it did not take them."""
        try:
            for batch in chunks(rows, self.config.max_batch):
                (await self._http[url].post(route, json={"stages": batch})).raise_for_status()
            return None
        except Exception as error:
            self._failed(error, url)
            return error

    async def aclose(self) -> None:
        await asyncio.gather(*(http.aclose() for http in self._http.values()))

    async def __aenter__(self) -> "AsyncPredictorClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
