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
# maestro[SOURCE/VARIANT]: MaestroScheduler with these `MaestroSchedulerConfig` fields over the engine's own.
MAESTRO_VARIANTS = {
    # Maestro's order may preempt: vLLM's admission, the victim the last in Maestro's order (vllm_plugin/victims.py)
    "preempt": {"preemptive": True},
    # vLLM's admission as in `preempt`, the default victim (the most predicted work left): what the admission alone buys
    "admit": {"preemptive": True, "victim": "remaining"},
    # Hold-back by predicted footprint (admission.py), named so that it stays the same arm whatever the default
    "hold": {"admission": "hold"},
    # vLLM's admission and Maestro's victim, but held back where the re-prefill would cost more than the wait
    # (vllm_plugin/adaptive.py)
    "adaptive": {"admission": "adaptive"},
}
SOURCES = r"model|prior|none|oracle|noise[0-9.]*"
MAESTRO_ARM = re.compile(rf"maestro\[({SOURCES})(?:/({'|'.join(MAESTRO_VARIANTS)}))?\]")


@dataclass(frozen=True)
class EngineArm:
    """vLLM's scheduler under `policy`, its priority from `priority` (None, `rank`, `deadline`), or MaestroScheduler
    (`maestro`) fed `source`, in its `variant` (a key of `MAESTRO_VARIANTS`) if named."""

    name: str
    scheduler: str
    policy: str
    source: str | None
    priority: str | None = None
    variant: str | None = None

    @property
    def maestro_options(self) -> dict:
        """The `MaestroSchedulerConfig` fields this arm sets over the engine's (none but for a variant)."""
        return dict(MAESTRO_VARIANTS[self.variant]) if self.variant else {}

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
            f"unknown engine arm '{name}'; known: {', '.join(VLLM_ARMS)}, maestro[model|prior|none|oracle|noiseσ], "
            f"optionally /VARIANT with VARIANT one of {', '.join(MAESTRO_VARIANTS)} (maestro[model/preempt])"
        )
    return EngineArm(name, "maestro", "priority", match.group(1), variant=match.group(2))
