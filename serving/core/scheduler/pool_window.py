"""A pool's measured capacity (serving/core/scheduler/triage.py): the unloaded seconds of service it finishes per wall
second over windows through which it was saturated, a moving average; the same windows measure one node's rate over
every model it serves.

A stage's work is counted when it ends, so a window shorter than the stages it counts reads the pace at which stages
started before it end: where the caller reports wall times, a window stays open until it is at least as long as the
longest stage it counts. The stretch (wall over unloaded seconds of the stages a window finished) says how much slower
than alone they ran; with `TriageConfig.saturated_stretch` set, it marks a window saturated and seeds the capacity
before the first such window (`Pool.seeded_capacity_s`).

`moore_hodgson` is the shedding rule both of triage's pools use, the GPU pools and the hosts' tool workers (`ToolPool`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from serving.core.residency import ModelNodes


@dataclass
class TriageConfig:
    window_s: float = 10.0  # the capacity measurement's window
    smoothing: float = 0.5  # weight of the newest saturated window in the capacity's moving average
    # stages slowed this much (wall / unloaded) mean the pool is saturated, and its capacity is seeded before the first
    # saturated window; None: saturated only while work waits for it (the default: see serving/EXPERIMENTS.md)
    saturated_stretch: float | None = None
    min_seed_stages: int = 8  # timed finishes before the stretch (and the seeded capacity) is read
    patience_slo_x: float | None = None  # callers give a workflow up this many × its SLO after it arrived, if known

    def __post_init__(self):
        if self.window_s <= 0 or not 0 < self.smoothing <= 1:
            raise ValueError("TriageConfig: window_s must be > 0 and smoothing in (0, 1]")
        if (self.saturated_stretch is not None and self.saturated_stretch < 1) or self.min_seed_stages < 1:
            raise ValueError("TriageConfig: saturated_stretch must be >= 1 and min_seed_stages >= 1")
        if self.patience_slo_x is not None and self.patience_slo_x < 1:
            raise ValueError("TriageConfig: patience_slo_x must be >= 1 (callers wait at least the SLO) or None")

    def is_stretched(self, stretch: float | None) -> bool:
        threshold = self.saturated_stretch
        return threshold is not None and stretch is not None and stretch >= threshold


@dataclass
class Pool:
    """One model's pool (or one node's, over every model it serves): its windows and what they measured."""

    capacity: float | None = None  # unloaded seconds served per wall second while the pool is saturated
    stretch: float | None = None  # wall seconds per unloaded second of the stages it finished (last window)
    num_in_flight: int = 0  # stages assessed and not yet served (over-counts those never served: the seed's side)
    window_start_s: float | None = None
    window_work_s: float = 0.0
    window_backlogged: bool = True
    window_timed_work_s: float = 0.0  # the window's work whose wall time was reported
    window_wall_s: float = 0.0
    window_max_wall_s: float = 0.0  # the longest wall time of a stage the window credits
    window_num_timed: int = 0
    open: dict[str, tuple[float, float]] = field(default_factory=dict)  # workflow → (deadline, predicted work)
    nodes: ModelNodes | None = None  # where the router would load the model, as its caller last said
    measured_on: frozenset[str] | None = None  # the nodes the model ran on when its capacity was last measured
    models: set[str] = field(default_factory=set)  # a node's: the models whose stages it finished

    def stretch_now(self, config: TriageConfig) -> float | None:
        """Wall seconds per unloaded second of the pool's stages: the last closed window's, else the open window's
        once `min_seed_stages` of its finishes were timed; None before."""
        if self.stretch is not None:
            return self.stretch
        if self.window_num_timed >= config.min_seed_stages and self.window_timed_work_s > 0:
            return self.window_wall_s / self.window_timed_work_s
        return None

    def seeded_capacity_s(self, config: TriageConfig) -> float | None:
        """The measured capacity; before the first saturated window (with `saturated_stretch` set), its stages in
        flight at the pace its finished stages ran (`num_in_flight` / stretch), which over-counts rather than
        under-counts (queued stages are in flight too)."""
        if self.capacity is not None or config.saturated_stretch is None:
            return self.capacity
        stretch = self.stretch_now(config)
        return self.num_in_flight / stretch if stretch is not None and self.num_in_flight > 0 else None

    def count(self, work_s: float, now: float, backlogged: bool, wall_s: float | None, config: TriageConfig) -> None:
        """A stage finished here after `work_s` unloaded seconds (`wall_s` on the clock, where known); `backlogged`:
        work was waiting for the pool. Closes the window once it is `window_s` and its longest stage long."""
        if self.window_start_s is None:
            self.window_start_s = now
        self.window_work_s += work_s
        self.window_backlogged &= backlogged
        if wall_s is not None:
            self.window_timed_work_s += work_s
            self.window_wall_s += wall_s
            self.window_num_timed += 1
            self.window_max_wall_s = max(self.window_max_wall_s, wall_s)
        elapsed = now - self.window_start_s
        if elapsed >= max(config.window_s, self.window_max_wall_s):
            self.close_window(self.window_work_s / elapsed, config)
            self.window_start_s, self.window_work_s, self.window_backlogged = now, 0.0, True
            self.window_timed_work_s, self.window_wall_s, self.window_num_timed = 0.0, 0.0, 0
            self.window_max_wall_s = 0.0

    def close_window(self, rate: float, config: TriageConfig) -> None:
        """A window closed having served `rate` unloaded seconds a second: that is the capacity where the pool was
        saturated all through it (work waited at every finish, or its stages ran `saturated_stretch` × slower); the
        first such window's rate, biased low by the stages still running at its end, is raised to the seed. The nodes
        the model ran on then are the ones the figure measured."""
        seed = self.seeded_capacity_s(config)
        if self.window_num_timed >= config.min_seed_stages and self.window_timed_work_s > 0:
            self.stretch = self.window_wall_s / self.window_timed_work_s
        if self.window_backlogged or config.is_stretched(self.stretch):
            a = config.smoothing
            self.capacity = max(rate, seed or 0.0) if self.capacity is None else a * rate + (1 - a) * self.capacity
            self.measured_on = self.nodes.running if self.nodes is not None else None


@dataclass(frozen=True)
class ToolPool:
    """The host CPUs that run the fleet's tool calls, as the caller reads them when a stage becomes ready."""

    capacity_s: float  # CPU-seconds of tool work they run per wall second (their workers)
    is_saturated: bool  # calls wait for a worker


def moore_hodgson(open_work: dict[str, tuple[float, float]], capacity: float, now: float) -> list[str]:
    """Whom to shed so that every kept workflow's work (deadline, work) ends by its deadline at `capacity`: in deadline
    order, while some prefix is over budget, the one with the most work up to the first such prefix."""
    names = [w for w, (deadline, _) in open_work.items() if math.isfinite(deadline)]
    deadlines = np.array([open_work[w][0] for w in names])
    work = np.array([open_work[w][1] for w in names])
    order = np.argsort(deadlines, kind="stable")
    names, deadlines, work = [names[i] for i in order], deadlines[order], work[order]
    kept = np.ones(len(names), dtype=bool)
    budget = capacity * (deadlines - now)
    shed = []
    while True:
        late = np.flatnonzero(kept & (np.cumsum(np.where(kept, work, 0.0)) > budget))
        if len(late) == 0:
            return shed
        prefix = np.flatnonzero(kept[: late[0] + 1])[::-1]  # of equal work, the latest deadline goes
        longest = prefix[np.argmax(work[prefix])]
        kept[longest] = False
        shed.append(names[longest])
