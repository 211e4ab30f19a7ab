"""MARS's AIMD session window: how many sessions may be active, from GPU-KV and host-CPU pressure.

Defaults are the MARS preview code's (start 30, min 4, cap 30, +1, ×0.7, hysteresis 0.90/0.85 KV and
2.0/1.0 tool jobs per worker, 5 s/2 s EMA tool wait). The issue text says ×0.5; the multiplier is
`decrease_factor` and we default to the authors' code (0.7) — see serving/README.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from serving.core.admission.cap import CapKind, CapSignals


@dataclass
class AIMDConfig:
    start_window: int = 30
    min_window: int = 4
    max_window: int = 30
    increase: int = 1
    decrease_factor: float = 0.7
    control_period_s: float = 0.2
    kv_high: float = 0.90
    kv_low: float = 0.85
    cpu_jobs_per_worker_high: float = 2.0
    cpu_jobs_per_worker_low: float = 1.0
    cpu_wait_high_s: float = 5.0
    cpu_wait_low_s: float = 2.0
    cpu_cap_per_worker: float = 1.5
    ema_alpha: float = 0.2

    def __post_init__(self):
        if not 1 <= self.min_window <= self.start_window <= self.max_window:
            raise ValueError(
                f"need 1 <= min_window <= start_window <= max_window, got "
                f"{self.min_window}, {self.start_window}, {self.max_window}"
            )
        if not 0 < self.decrease_factor < 1 or self.increase < 1:
            raise ValueError("decrease_factor must be in (0, 1) and increase >= 1")
        if not (
            self.kv_low < self.kv_high
            and self.cpu_jobs_per_worker_low < self.cpu_jobs_per_worker_high
            and self.cpu_wait_low_s < self.cpu_wait_high_s
        ):
            raise ValueError("each hysteresis band needs low < high")


class AIMDWindow:
    """How many sessions may be active; `update` is called every control period."""

    def __init__(self, config: AIMDConfig, num_tool_workers: int):
        self.config = config
        self.num_tool_workers = max(1, num_tool_workers)
        self.size = config.start_window  # sessions that may be active, before the KV and CPU caps (`limit`)
        self.is_kv_overloaded = False
        self.is_cpu_overloaded = False
        self.tool_wait_ema_s = 0.0

    def observe_tool_wait(self, wait_s: float) -> None:
        a = self.config.ema_alpha
        self.tool_wait_ema_s = a * wait_s + (1 - a) * self.tool_wait_ema_s

    def update(self, kv_usage: float, num_tool_jobs: int) -> int:
        c = self.config
        self._update_flags(kv_usage, num_tool_jobs / self.num_tool_workers)
        if self.is_kv_overloaded or self.is_cpu_overloaded:
            self.size = max(c.min_window, int(self.size * c.decrease_factor))
        else:
            self.size = min(c.max_window, self.size + c.increase)
        return self.limit(kv_usage)

    def _update_flags(self, kv_usage: float, jobs_per_worker: float) -> None:
        c, wait = self.config, self.tool_wait_ema_s
        if kv_usage >= c.kv_high:
            self.is_kv_overloaded = True
        elif kv_usage <= c.kv_low:
            self.is_kv_overloaded = False
        if jobs_per_worker >= c.cpu_jobs_per_worker_high or wait >= c.cpu_wait_high_s:
            self.is_cpu_overloaded = True
        elif jobs_per_worker <= c.cpu_jobs_per_worker_low and wait <= c.cpu_wait_low_s:
            self.is_cpu_overloaded = False

    def limit(self, kv_usage: float) -> int:
        """The effective cap: the AIMD window, the KV cap (linear between low and high), the CPU cap."""
        c = self.config
        cap = self.size
        if c.kv_low < kv_usage < c.kv_high:
            frac = (kv_usage - c.kv_low) / (c.kv_high - c.kv_low)
            cap = min(cap, int(round(c.max_window - frac * (c.max_window - c.min_window))))
        if self.is_cpu_overloaded:
            cap = min(cap, math.ceil(self.num_tool_workers * c.cpu_cap_per_worker))
        return max(c.min_window, cap)


class SessionWindow:
    """The AIMD window as a session cap: a session takes a slot when its first stage starts and holds it until it
    ends or moves away; a new session may start only while fewer than `aimd.limit(kv_usage())` hold one.
    Interactive sessions are counted like any other (MARS has no such class); with `holds_interactive` False (Maestro's
    `aimd-batch`) the window is the batch sessions': an interactive session's turn is never held, nor takes a slot."""

    def __init__(self, aimd: AIMDWindow, kv_usage: Callable[[], float], holds_interactive: bool = True):
        self.aimd, self.kv_usage, self.holds_interactive = aimd, kv_usage, holds_interactive
        self.session_ids: set[str] = set()
        self.outside: set[str] = set()  # interactive sessions, where the window is the batch sessions'

    @classmethod
    def of(cls, kind: CapKind, aimd: AIMDWindow, kv_usage: Callable[[], float]) -> SessionWindow | None:
        """The session cap a system names (`System.cap`), for the gateway and the simulator alike; None: no cap."""
        if kind is CapKind.NONE:
            return None
        return cls(aimd, kv_usage, holds_interactive=kind is CapKind.AIMD)

    def admits(self, workflow_id: str, interactive: bool, now: float) -> bool:
        if interactive and not self.holds_interactive:
            self.outside.add(workflow_id)
            return True
        return workflow_id in self.session_ids or len(self.session_ids) < self.aimd.limit(self.kv_usage())

    def enter(self, workflow_id: str, arrival_s: float) -> None:
        pass

    def started(self, workflow_id: str) -> None:
        if workflow_id not in self.outside:
            self.session_ids.add(workflow_id)

    def leave(self, workflow_id: str, now: float) -> None:
        pass

    def end(self, workflow_id: str) -> None:
        self.session_ids.discard(workflow_id)
        self.outside.discard(workflow_id)

    def adapt(self, signals: CapSignals, now: float) -> None:
        self.aimd.update(signals.kv_usage, signals.num_tool_jobs)

    def observe_tool_wait(self, wait_s: float) -> None:
        self.aimd.observe_tool_wait(wait_s)

    def snapshot(self) -> dict:
        return {"window": self.aimd.size, "sessions": len(self.session_ids), "limit": self.aimd.limit(self.kv_usage())}
