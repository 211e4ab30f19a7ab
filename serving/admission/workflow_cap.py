"""The workflow cap (a `cap.SessionCap`): stages of at most W workflows are started at a time, oldest first.

A workflow is *live* while it has a stage queued or running at the gateway, and for `idle_s` after its
last stage ended (its client is between stages: building the next prompt, or a short tool call). The W
live workflows with the earliest arrival (`StageRequest.workflow_arrival_s`) are *eligible*; a batch
stage of any other waits, even when KV is free, so whole workflows finish sooner instead of all
advancing abreast. A workflow back from a longer tool phase is live again and, being older, takes its
place among the W from the youngest (whose running stages go on; its queued ones wait). Interactive
stages are never held.

Adaptive W (AIMD-like, `adapt` at each /metrics poll): +1 when the cap alone kept a node idle for two polls
in a row (a stage of a workflow beyond the W waited, no eligible stage did, and that stage would fit
now); × `backoff` (at least −1; 1 = never) when vLLM's `num_preemptions_total` went up; optionally (`shrink_wait_s` > 0)
−1 when an eligible stage has waited for KV that long (the node is full with the W: fewer will do; at most
once per `shrink_wait_s`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from serving.admission.cap import CapSignals

DEFAULT_IDLE_S = 0.5  # a workflow keeps its place this long after its last stage ended
MIN_LIMIT = 2  # adaptive W never goes below this
MAX_LIMIT = 4096
GROW_POLLS = 2  # polls in a row the cap kept a node idle before W grows by one
DEFAULT_BACKOFF = 0.5  # W × this (at least −1) when vLLM preempted


@dataclass(slots=True)
class LiveWorkflow:
    arrival_s: float
    num_active: int = 0  # stages queued or running at the gateway
    last_end_s: float = float("-inf")


class WorkflowCap:
    """Which workflows may have stages dispatched now (see the module docstring)."""

    def __init__(self, limit: int, adaptive: bool = False, idle_s: float = DEFAULT_IDLE_S, shrink_wait_s: float = 0.0,
                 backoff: float = DEFAULT_BACKOFF):
        if limit < 1:
            raise ValueError(f"workflow cap must be >= 1, got {limit}")
        self.limit = max(MIN_LIMIT, limit) if adaptive else limit
        self.adaptive, self.idle_s, self.shrink_wait_s, self.backoff = adaptive, idle_s, shrink_wait_s, backoff
        self.live: dict[str, LiveWorkflow] = {}
        self._eligible: set[str] | None = None  # cached; None = recompute
        self._expires_s = math.inf  # when a live-by-idle workflow stops being live (the cache goes stale)
        self._num_idle_polls = 0
        self._last_shrink_s = -math.inf
        self._preemptions: dict[str, int] = {}
        self.num_grown = self.num_shrunk = self.num_halved = 0
        self.max_limit_seen = self.limit

    # ---- stage lifecycle ------------------------------------------------------------------
    def enter(self, workflow_id: str, arrival_s: float) -> None:
        state = self.live.get(workflow_id)
        if state is None:
            state = self.live[workflow_id] = LiveWorkflow(arrival_s)
            self._eligible = None
        elif state.num_active == 0:
            self._eligible = None  # may have stopped being live
        state.num_active += 1

    def started(self, workflow_id: str) -> None:
        pass

    def end(self, workflow_id: str) -> None:
        pass  # a workflow stops being live `idle_s` after its last stage

    def leave(self, workflow_id: str, now: float) -> None:
        state = self.live.get(workflow_id)
        if state is None or state.num_active <= 0:
            return
        state.num_active -= 1
        if state.num_active == 0:
            state.last_end_s = now
            self._expires_s = min(self._expires_s, now + self.idle_s)

    # ---- who may go -------------------------------------------------------------------------
    def eligible(self, now: float) -> set[str]:
        if self._eligible is None or now >= self._expires_s:
            self._recompute(now)
        return self._eligible

    def admits(self, workflow_id: str, interactive: bool, now: float) -> bool:
        return interactive or workflow_id in self.eligible(now)

    def _recompute(self, now: float) -> None:
        for workflow_id in [w for w, s in self.live.items() if s.num_active == 0 and now - s.last_end_s >= self.idle_s]:
            del self.live[workflow_id]  # done, or in a long tool phase: it comes back with its arrival time
        oldest = sorted(self.live.items(), key=lambda item: (item[1].arrival_s, item[0]))[: self.limit]
        self._eligible = {w for w, _ in oldest}
        self._expires_s = min((s.last_end_s + self.idle_s for s in self.live.values() if s.num_active == 0),
                              default=math.inf)

    def set_limit(self, limit: int) -> None:
        limit = min(MAX_LIMIT, max(MIN_LIMIT, limit))
        if limit != self.limit:
            self.limit, self._eligible = limit, None
            self.max_limit_seen = max(self.max_limit_seen, limit)

    # ---- adaptation -------------------------------------------------------------------------
    def observe_tool_wait(self, wait_s: float) -> None:
        pass  # W adapts to preemptions and waiting stages, not to the host CPU

    def adapt(self, signals: CapSignals, now: float) -> None:
        """At a /metrics poll: grow, shrink or halve W (adaptive only), from `signals.preemptions` (node → vLLM's
        counter), `held_fitting` and `waiting_since` (of the longest-waiting eligible stage)."""
        if not self.adaptive:
            return
        preemptions, held_fitting = signals.preemptions, signals.held_fitting
        eligible_waiting_since = signals.waiting_since
        preempted = any(n in self._preemptions and count > self._preemptions[n] for n, count in preemptions.items())
        self._preemptions.update(preemptions)
        if preempted and self.backoff < 1:
            self.set_limit(min(self.limit - 1, math.floor(self.limit * self.backoff)))
            self.num_halved += 1
            self._num_idle_polls = 0
            return
        wait_s = self.shrink_wait_s
        if wait_s > 0 and eligible_waiting_since is not None and now - eligible_waiting_since >= wait_s:
            if now - self._last_shrink_s >= wait_s:
                self._last_shrink_s = now
                self.set_limit(self.limit - 1)
                self.num_shrunk += 1
            self._num_idle_polls = 0
            return
        self._num_idle_polls = self._num_idle_polls + 1 if held_fitting else 0
        if self._num_idle_polls >= GROW_POLLS:
            self._num_idle_polls = 0
            self.set_limit(self.limit + 1)
            self.num_grown += 1

    def snapshot(self) -> dict:
        return {"limit": self.limit, "adaptive": self.adaptive, "live": len(self.live), "grown": self.num_grown,
                "shrunk": self.num_shrunk, "halved": self.num_halved, "max_limit": self.max_limit_seen}
