"""The trained model's own thread in the gateway: calls wait in a queue, those that waited together go through
the model in one pass, and answers go back to the event loop that asked (`asyncio.Future`s)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from maestro.contract import StageRow, StageTrace
from pipelines.predictor import Prediction

MAX_BATCH_STAGES = 64  # stages the model thread predicts in one go (the calls that waited while it was busy)
NUM_TIMED_BATCHES = 1024  # the latest batches whose times /maestro/status summarizes


@dataclass(slots=True)
class _Call:
    stages: list[StageRow]
    future: asyncio.Future
    deadline_s: float  # time.monotonic(): past it the caller has answered from the prior
    submitted_s: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class BatchTime:
    """Where a model pass's time went: the oldest call's wait for the thread, the pass's wall time, the CPU the
    thread got during it, and its wait in the kernel's run queue for a core (Linux; NaN elsewhere). What the wall
    time holds beyond CPU and run queue is mostly the wait for the GIL."""

    queued_s: float
    wall_s: float
    cpu_s: float
    runqueue_s: float


def runqueue_s() -> float:
    """The calling thread's total wait for a core so far (/proc/thread-self/schedstat's second field, ns)."""
    try:
        with open("/proc/thread-self/schedstat") as schedstat:
            return int(schedstat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


class ModelWorker:
    """The trained model's own thread. The calls that arrived while it was busy go through the model together
    (one featurization, one MiniLM batch); a call whose deadline has passed is skipped, not computed. A call's
    future gets its predictions and the instant (monotonic) the model finished them.

    `parse(stage dicts)` → one call's StageTraces (raises ValueError on a bad one); `predict_batch(stages)` → one
    Prediction per stage (`Predictor.predict` with the live history)."""

    def __init__(
        self,
        parse: Callable[[list[StageRow]], list[StageTrace]],
        predict_batch: Callable[[list[StageTrace]], list[Prediction]],
        max_batch_stages: int = MAX_BATCH_STAGES,
    ):
        self.parse = parse
        self.predict_batch = predict_batch
        self.max_batch_stages = max_batch_stages
        self.num_batches = self.num_expired = 0
        self.batch_times: deque[BatchTime] = deque(maxlen=NUM_TIMED_BATCHES)
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self, warm_up: Callable[[], None]) -> concurrent.futures.Future:
        """Start the thread; it runs `warm_up` first. The future resolves when that is done (or raises its error)."""
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(warm_up, ready), name="gateway-predictor", daemon=True)
        self._thread.start()
        return ready

    def submit(self, stages: list[StageRow], deadline_s: float) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._calls.put(_Call(stages, future, deadline_s))
        return future

    def stop(self) -> None:
        if self._thread is not None:
            self._calls.put(None)
            self._thread.join(timeout=5)

    def _run(self, warm_up: Callable[[], None], ready: concurrent.futures.Future) -> None:
        try:
            warm_up()
        except BaseException as error:  # noqa: BLE001 — reported to start()'s caller
            ready.set_exception(error)
            return
        ready.set_result(None)
        while (batch := self._next_batch()) is not None:
            self._answer(batch)

    def _next_batch(self) -> list[_Call] | None:
        """The next call (blocking) and every call already waiting behind it, up to max_batch_stages."""
        first = self._calls.get()
        if first is None:
            return None
        batch, num_stages = [first], len(first.stages)
        while num_stages < self.max_batch_stages:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                break
            if call is None:
                self._calls.put(None)  # stop after this batch
                break
            batch.append(call)
            num_stages += len(call.stages)
        return batch

    def _answer(self, batch: list[_Call]) -> None:
        now = time.monotonic()
        live = [c for c in batch if c.deadline_s > now]
        self.num_expired += len(batch) - len(live)
        parsed: list[tuple[_Call, list[StageTrace]]] = []
        for call in live:
            try:
                parsed.append((call, self.parse(call.stages)))
            except Exception as error:  # noqa: BLE001 — a stage the contract refuses fails its own call only
                _settle(call.future, error)
        if parsed:
            self.num_batches += 1
            # the run queue is read inside the wall clock's span: reading it (a file) may wait for the GIL again
            started_s, started_cpu_s, started_runqueue_s = time.monotonic(), time.thread_time(), runqueue_s()
            self._predict(parsed)
            cpu_s, waited_s = time.thread_time() - started_cpu_s, runqueue_s() - started_runqueue_s
            self.batch_times.append(
                BatchTime(
                    started_s - min(c.submitted_s for c, _ in parsed), time.monotonic() - started_s, cpu_s, waited_s
                )
            )

    def time_summary(self) -> dict:
        """p50 / p99 (ms) of the latest batches' queue wait, wall time, CPU time and run-queue wait (`BatchTime`)."""
        if not self.batch_times:
            return {}
        summary = {}
        for what in ("queued", "wall", "cpu", "runqueue"):
            times_ms = np.array([getattr(t, f"{what}_s") for t in self.batch_times]) * 1000
            if not np.isnan(times_ms).all():
                summary[f"{what}_ms"] = {f"p{q}": round(float(np.nanpercentile(times_ms, q)), 1) for q in (50, 99)}
        return summary

    def _predict(self, parsed: list[tuple[_Call, list[StageTrace]]]) -> None:
        """One model pass for all the calls; if it raises, one pass per call: a stage the model chokes on fails
        its own call only (its caller answers from the prior)."""
        try:
            answers = self.predict_batch([s for _, stages in parsed for s in stages])
        except Exception as error:  # noqa: BLE001 — reported to the caller, counted there
            if len(parsed) == 1:
                _settle(parsed[0][0].future, error)
            else:
                for one in parsed:
                    self._predict([one])
            return
        start, done_s = 0, time.monotonic()
        for call, stages in parsed:
            _settle(call.future, (answers[start : start + len(stages)], done_s))
            start += len(stages)


def _settle(future: asyncio.Future, outcome: object) -> None:
    """Hand a result (or an exception) to the event loop that waits on `future`."""

    def settle() -> None:
        if future.done():  # the caller stopped waiting (its deadline)
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    try:
        future.get_loop().call_soon_threadsafe(settle)
    except RuntimeError:  # the loop has closed: nobody waits any more
        pass
