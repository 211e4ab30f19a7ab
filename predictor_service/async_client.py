"""The asyncio client the gateway calls: one predictor service or its replicas, within a strict deadline.

Like `client.PredictorClient`, it never makes scheduling wait: past `timeout_s`, or while the service is down or
refuses, each stage gets the local prior (`client.LocalFallback`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

import httpx

from maestro.contract import StageTrace
from predictor_service.client import (
    LIMITS,
    Breaker,
    ClientConfig,
    LocalFallback,
    chunks,
    describe,
    is_refusal,
    parse_answers,
    to_wire,
)
from predictor_service.replicas import Ring
from predictor_service.schemas import PredictionOut

logger = logging.getLogger(__name__)


class AsyncPredictorClient:
    """asyncio client over one service or its replicas; the whole call is bounded by `timeout_s`.

    With replicas, each stage goes to its workflow's owner on the ring (`replicas.Ring`); a replica that
    fails (connection, timeout, 5xx) is skipped for `cooldown_s` and its stages go to the next replica on
    the ring within the same deadline. Finished stages go to the owner (/observe) and to the next replica
    (/history), so the replica a workflow fails over to already holds its history."""

    def __init__(
        self,
        config: ClientConfig,
        fallback: LocalFallback | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        """`transport`: httpx's, e.g. `httpx.ASGITransport(app)` to talk to a service in process."""
        self.config, self.fallback = config, fallback or LocalFallback()
        self.breaker = Breaker(config.cooldown_s)  # the last failure, whichever replica it came from
        self.ring = Ring(config.urls)
        self._http = {
            url: httpx.AsyncClient(base_url=url, timeout=config.timeout_s, transport=transport, limits=LIMITS)
            for url in config.urls
        }

    async def predict(self, stages: Iterable[StageTrace | dict]) -> list[PredictionOut]:
        return (await self.predict_or_fallback(stages))[0]

    async def predict_or_fallback(self, stages: Iterable[StageTrace | dict]) -> tuple[list[PredictionOut], str | None]:
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
            logger.warning(
                "predictor %s: %s; %d stage(s) answered from the local prior",
                self.config.url,
                self.breaker.last_error,
                len(missing),
            )
        return answers, (reasons[-1] if reasons else "error") if missing else None

    async def _predict_routed(self, wire: list[dict], answers: list, reasons: list[str], in_flight: set[str]) -> None:
        """Fill `answers` from each stage's live owner; a replica that fails hands its stages to the next."""
        failed: set[str] = set()  # in this call: with cooldown_s = 0 the ring would offer them again
        while pending := [i for i, a in enumerate(answers) if a is None]:
            groups = self.ring.group([wire[i] for i in pending], skip=failed)
            if None in groups:  # no live replica left for these: one failed in this call, or lately
                reasons.append("error" if failed else "cooldown")
                groups.pop(None)
            if not groups:
                return
            results = await asyncio.gather(
                *(
                    self._predict_on(url, [pending[j] for j in group], wire, answers, in_flight)
                    for url, group in groups.items()
                )
            )
            failed.update(url for url, error in zip(groups, results) if error is not None)
            if any(is_refusal(error) for error in results):  # another replica would refuse them too
                reasons.append("error")
                return

    async def _predict_on(
        self, url: str, indices: list[int], wire: list[dict], answers: list, in_flight: set[str]
    ) -> BaseException | None:
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
        found = [
            f"{url}: {problem}" if len(self._http) > 1 else problem
            for url, problem in zip(self._http, problems)
            if problem
        ]
        return "; ".join(found) or None

    async def _wait_ready(self, url: str, timeout_s: float, poll_s: float) -> str | None:
        from predictor_service.engine import WARMUP_STAGE

        deadline, problem, stage = time.monotonic() + timeout_s, "no answer yet", to_wire(WARMUP_STAGE)
        http = self._http[url]
        while (left := deadline - time.monotonic()) > 0:
            try:
                (await http.get("/readyz", timeout=left)).raise_for_status()
                response = await http.post(
                    self.config.route, json={"stages": [stage]}, timeout=max(left, self.config.timeout_s)
                )
                parse_answers(response, [stage])
                return None
            except Exception as error:  # not up yet, not ready yet, or refusing: try again until the deadline
                problem = describe(error)
            await asyncio.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        return f"not ready within {timeout_s} s: {problem}"

    async def _post(self, url: str, batch: list[dict]) -> list[PredictionOut]:
        return parse_answers(await self._http[url].post(self.config.route, json={"stages": batch}), batch)

    async def observe(self, stages: Iterable[StageTrace | dict]) -> bool:
        """Report finished stages to their workflows' owners (/observe) and the next replica on the ring
        (/history); False when some owner did not take them."""
        rows = [
            s.model_dump(mode="json", exclude_none=True, exclude={"in_degree", "out_degree"})
            if isinstance(s, StageTrace)
            else s
            for s in stages
        ]
        taken, _ = await asyncio.gather(
            self._send_routed("/observe", rows, rank=0), self._send_routed("/history", rows, rank=1)
        )
        return taken

    async def _send_routed(self, route: str, rows: list[dict], rank: int) -> bool:
        """POST `rows` to each one's `rank`-th live replica, failing over; True when every row was taken."""
        left, failed = list(range(len(rows))), set()
        while left:
            groups = self.ring.group([rows[i] for i in left], rank, skip=failed)
            if None in groups:  # no such live replica (a backup with one replica up is not an error)
                return rank > 0
            results = await asyncio.gather(
                *(self._send_on(url, route, [rows[left[j]] for j in group]) for url, group in groups.items())
            )
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

    async def __aenter__(self) -> AsyncPredictorClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
