"""What the gateway knows of a workflow across its calls, and the unit a stage's service is counted in."""

from __future__ import annotations

from dataclasses import dataclass

from serving.core.request import TokenPace

DECODE_S_PER_TOKEN = 0.02  # rough per-token decode time: only orders stages, never promised to anyone
SERVICE_PACE = TokenPace(DECODE_S_PER_TOKEN)  # a stage's predicted and attained service (serving/core/request.py)


@dataclass(slots=True)
class WorkflowState:
    """A workflow as the gateway knows it: its first stage's arrival, its arrival rank, the service it got.

    `attained_s` is in the unit of `StageRequest.pred_service_s`: `SERVICE_PACE.service_s` of its finished stages'
    tokens (not their measured time, which queueing and CPU contention inflate).
    """

    start_s: float
    seq: int
    attained_s: float = 0.0
    num_ready: int = 0  # stages prepared so far: the position of the next one (serving/core/scheduler/remaining.py)

    def next_position(self) -> int:
        self.num_ready += 1
        return self.num_ready - 1
