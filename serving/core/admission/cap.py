"""The session cap: which workflows may have stages started now — one interface (MARS's AIMD window behind it), so a
system name picks the same cap in the gateway and the simulator.

Both count workflows, not stages, and are driven through the same calls: `enter` when a stage of a workflow is
queued, `started` when one starts, `leave` when one ends or is withdrawn, `end` when the workflow ends or moves to
another node; `admits` is the dispatch core's gate; `adapt` takes the pressure signals at the caller's control period,
`observe_tool_wait` how long a tool call waited for a host CPU.
Each cap uses the calls and signals it needs and ignores the others.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class CapSignals:
    """What a cap may adapt to; a caller fills in what it measures."""

    kv_usage: float = 0.0  # share of the node's KV in use
    num_tool_jobs: int = 0  # tool calls running or waiting on the host CPU
    preemptions: dict[str, int] = field(default_factory=dict)  # node → the engine's preemption counter
    held_fitting: bool = False  # the cap alone holds back a stage that would fit now
    waiting_since: float | None = None  # since when the longest-waiting admitted stage has waited (None: none waits)


class SessionCap(Protocol):
    def admits(self, workflow_id: str, interactive: bool, now: float) -> bool: ...

    def enter(self, workflow_id: str, arrival_s: float) -> None: ...

    def started(self, workflow_id: str) -> None: ...

    def leave(self, workflow_id: str, now: float) -> None: ...

    def end(self, workflow_id: str) -> None: ...

    def adapt(self, signals: CapSignals, now: float) -> None: ...

    def observe_tool_wait(self, wait_s: float) -> None: ...

    def snapshot(self) -> dict: ...


class CapKind(enum.Enum):
    NONE = "none"
    AIMD = "aimd"  # MARS: sessions holding a slot ≤ the AIMD window (serving/core/admission/aimd.py)
    AIMD_BATCH = "aimd-batch"  # the same window over batch sessions only: a turn never waits for it nor takes a slot
