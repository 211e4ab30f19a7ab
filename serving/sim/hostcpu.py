"""A node's host CPU running tool calls, and what it does to the engine's host-side work.

Three modes, each a setting described for MARS (PAPERS.md, seed notes):
- `workers`: tools are pinned to `num_cores` cores, one worker per core; calls queue FIFO when all
  are busy (the authors' worker-pool replay). The engine is pinned to other cores (0–1): no coupling.
- `time-sliced`: one subprocess per call on the same pinned cores; the OS time-slices them, which we
  model as processor sharing (each of n calls runs at min(1, cores/n), the usual idealisation of
  Linux CFS). The engine is still on its own cores.
- `shared`: tools and the engine's host thread time-slice the same cores (the seed: "工具执行…跑在与推理
  引擎共享同一宿主 CPU 的 Docker 沙箱里", cycles taken from scheduling, tokenisation, I/O). The engine
  loop counts as one runnable thread (vLLM's EngineCore loop is single-threaded and busy while it has
  requests), so with n calls each thread gets min(1, cores/(n+1)) of a core, and the engine's
  host-side per-step time stretches by max(1, (n+1)/cores).

All calls in service progress at one common rate, so one virtual clock W (CPU-seconds delivered to
each call) orders completions: a call with `work_s` done at W_start + work_s. O(log n) per call.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections import deque
from collections.abc import Iterable

from serving.core.routing import HostWaitFits
from serving.core.scheduler.pool_window import ToolPool

_TIE = itertools.count()


class HostCPUMode(enum.Enum):
    WORKERS = "workers"
    TIME_SLICED = "time-sliced"
    SHARED = "shared"


class HostCPU:
    def __init__(self, mode: str, num_cores: int):
        if num_cores < 1:
            raise ValueError(f"num_cores must be >= 1, got {num_cores}")
        self.mode = HostCPUMode(mode)
        self.num_cores = num_cores
        self.queue: deque = deque()  # (job, work_s, submit_s), workers mode only
        self._heap: list = []  # (W at finish, tie, job, submit_s)
        self.w = 0.0
        self.last_s = 0.0
        self.version = 0  # bumped on every change, so stale completion events are skipped
        self.fits = HostWaitFits()  # how much of the wait shown at routing the call met (a fleet's hosts share one)
        self.shown: dict[int, tuple[str, float]] = {}  # id(stage routed here) → (app, wait shown) until its call

    # --- state ----------------------------------------------------------------------------------
    @property
    def num_in_service(self) -> int:
        return len(self._heap)

    def num_jobs(self) -> int:
        """Calls in flight or queued: MARS's CPU-pressure signal."""
        return len(self._heap) + len(self.queue)

    def jobs(self) -> list:
        """The calls in flight or queued."""
        return [entry[2] for entry in self._heap] + [entry[0] for entry in self.queue]

    def rate(self) -> float:
        """CPU-seconds per second each call in service receives now."""
        if self.mode is HostCPUMode.WORKERS or not self._heap:
            return 1.0
        threads = len(self._heap) + (1 if self.mode is HostCPUMode.SHARED else 0)
        return min(1.0, self.num_cores / threads)

    def engine_slowdown(self) -> float:
        """Factor on the engine's host-side per-step time (1 unless the engine shares the tool cores)."""
        if self.mode is not HostCPUMode.SHARED:
            return 1.0
        return max(1.0, (len(self._heap) + 1) / self.num_cores)

    def wait_s(self, now: float) -> float:
        """Seconds a call handed over at `now` would queue for a core (workers: the calls in service run out, then
        those queued ahead take the cores first freed, FIFO); 0 while a core is free, and in the time-sliced and
        shared modes, which never queue (there a call slows with the calls beside it instead)."""
        if self.mode is not HostCPUMode.WORKERS or len(self._heap) < self.num_cores:
            return 0.0
        w = self.w + max(0.0, now - self.last_s) * self.rate()
        free_at = sorted(max(0.0, end_w - w) for end_w, _tie, _job in self._heap)  # rate 1 in workers mode
        for _job, work_s, _submit_s in self.queue:
            heapq.heappush(free_at, heapq.heappop(free_at) + work_s)
        return free_at[0]

    def routed(self, job, app: str, now: float) -> None:
        """A stage was routed to this node at `now`: the wait shown then is scored against what its tool call (a
        call handed over with `job` as the stage) meets when it starts (`HostWaitFit`); a stage that calls no tool
        is never scored."""
        self.shown[id(job)] = (app, self.wait_s(now))

    def ended_without_call(self, job) -> None:
        """A stage routed here ended without a tool call: nothing of it is scored."""
        self.shown.pop(id(job), None)

    def charged_wait_s(self, now: float, app: str) -> float:
        """The wait the router charges a stage of `app`: `wait_s` times the share of it the app's routed stages' calls
        have met."""
        wait_s = self.wait_s(now)
        return wait_s * self.fits.share(app) if wait_s > 0 else 0.0

    def _started(self, started: list[tuple[object, float]]) -> list[tuple[object, float]]:
        for job, wait_s in started:
            shown = self.shown.pop(id(job), None)
            if shown is not None:
                self.fits.observe(*shown, wait_s)
        return started

    # --- the clock --------------------------------------------------------------------------------
    def advance(self, now: float) -> None:
        if now > self.last_s:
            if self._heap:
                self.w += (now - self.last_s) * self.rate()
            self.last_s = now

    def next_done_s(self) -> float | None:
        if not self._heap:
            return None
        return self.last_s + max(0.0, self._heap[0][0] - self.w) / self.rate()

    # --- calls ------------------------------------------------------------------------------------
    def submit(self, job, work_s: float, now: float) -> list[tuple[object, float]]:
        """Hand a call to the host; returns [(job, queue wait)] of calls that started now."""
        self.advance(now)
        self.version += 1
        if self.mode is HostCPUMode.WORKERS and len(self._heap) >= self.num_cores:
            self.queue.append((job, work_s, now))
            return []
        self._start(job, work_s)
        return self._started([(job, 0.0)])

    def pop_done(self, now: float) -> tuple[list, list[tuple[object, float]]]:
        """Calls finished by `now`, and [(job, queue wait)] of queued calls that started in their place."""
        self.advance(now)
        done = []
        while self._heap and self._heap[0][0] <= self.w + 1e-9:
            done.append(heapq.heappop(self._heap)[2])
        started = []
        while self.queue and len(self._heap) < self.num_cores:
            job, work_s, submit_s = self.queue.popleft()
            self._start(job, work_s)
            started.append((job, now - submit_s))
        if done or started:
            self.version += 1
        return done, self._started(started)

    def _start(self, job, work_s: float) -> None:
        heapq.heappush(self._heap, (self.w + max(0.0, work_s), next(_TIE), job))


def tool_pool(hosts: Iterable[HostCPU]) -> ToolPool:
    """The fleet's hosts as triage reads them: the tool work their cores run a second, and whether a call waits for one
    (workers mode) or shares one (the other modes) on some host."""
    hosts = list(hosts)
    return ToolPool(float(sum(h.num_cores for h in hosts)), any(h.num_jobs() > h.num_cores for h in hosts))
