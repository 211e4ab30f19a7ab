"""The engine replay's arms: vLLM's scheduler under a policy and priority, or MaestroScheduler fed a source."""

from __future__ import annotations

import re
from dataclasses import dataclass

VLLM_ARMS = {
    "vllm-fcfs": ("fcfs", None),
    "vllm-priority": ("priority", "rank"),
    "vllm-priority-deadline": ("priority", "deadline"),
}
DEFAULT_ARMS = (
    "vllm-fcfs",
    "vllm-priority",
    "vllm-priority-deadline",
    "maestro[model]",
    "maestro[prior]",
    "maestro[none]",
    "maestro[oracle]",
)
MAESTRO_ARM = re.compile(r"maestro\[(model|prior|none|oracle|noise[0-9.]*)\]")


@dataclass(frozen=True)
class EngineArm:
    """vLLM's scheduler under `policy`, its priority from `priority` (None, `rank`, `deadline`), or MaestroScheduler
    (`maestro`) fed `source`."""

    name: str
    scheduler: str
    policy: str
    source: str | None
    priority: str | None = None

    @property
    def needs_model(self) -> bool:
        return self.source in ("model", "prior")


def engine_arm(name: str) -> EngineArm:
    if name in VLLM_ARMS:
        policy, priority = VLLM_ARMS[name]
        return EngineArm(name, "vllm", policy, "model" if priority == "rank" else None, priority)
    match = MAESTRO_ARM.fullmatch(name)
    if not match:
        raise ValueError(
            f"unknown engine arm '{name}'; known: {', '.join(VLLM_ARMS)}, maestro[model|prior|none|oracle|noiseσ]"
        )
    return EngineArm(name, "maestro", "priority", match.group(1))
