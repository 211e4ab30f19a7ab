"""The engine replay's arms: vLLM's scheduler under a policy and priority, or MaestroScheduler fed a source; either
behind the gateway's decisions (`gateway+ARM`, benchmarks/engine/gateway_arm.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

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
    "gateway+vllm-priority-deadline",
    "gateway+maestro[model]",
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
# gateway+ARM: the gateway's triage and deadline priority in front of ARM, one of these engine sides; gateway+gate+ARM
# with the gateway's batch-cost gate and dispatch queue too (benchmarks/engine/gateway_arm.py)
GATEWAY_PREFIX = "gateway+"
GATE_PREFIX = "gate+"
GATEWAY_ENGINES = ("vllm-priority-deadline", "maestro[")
GATEWAY_SOURCE = "model"  # what the gateway predicts with in front of stock vLLM: its trained predictor
MAESTRO_ARM = re.compile(rf"maestro\[({SOURCES})(?:/({'|'.join(MAESTRO_VARIANTS)}))?\]")


@dataclass(frozen=True)
class EngineArm:
    """vLLM's scheduler under `policy`, its priority from `priority` (None, `rank`, `deadline`), or MaestroScheduler
    (`maestro`) fed `source`, in its `variant` (a key of `MAESTRO_VARIANTS`) if named; with `is_gateway`, behind the
    gateway's triage, which is fed `source` too and sends the deadline as vLLM's priority; with `is_gated`, behind its
    batch-cost gate too."""

    name: str
    scheduler: str
    policy: str
    source: str | None
    priority: str | None = None
    variant: str | None = None
    is_gateway: bool = False
    is_gated: bool = False

    @property
    def maestro_options(self) -> dict:
        """The `MaestroSchedulerConfig` fields this arm sets over the engine's (none but for a variant)."""
        return dict(MAESTRO_VARIANTS[self.variant]) if self.variant else {}

    @property
    def needs_model(self) -> bool:
        return self.source in ("model", "prior")


def engine_arm(name: str) -> EngineArm:
    if name.startswith(GATEWAY_PREFIX):
        engine = name.removeprefix(GATEWAY_PREFIX)
        is_gated = engine.startswith(GATE_PREFIX)
        engine = engine.removeprefix(GATE_PREFIX)
        if not engine.startswith(GATEWAY_ENGINES):
            raise ValueError(
                f"unknown engine arm '{name}': the gateway goes in front of vllm-priority-deadline or "
                "maestro[SOURCE] (gateway+vllm-priority-deadline, gateway+maestro[model]), with its batch-cost gate as "
                "gateway+gate+ARM"
            )
        arm = engine_arm(engine)
        return replace(
            arm, name=name, source=arm.source or GATEWAY_SOURCE, priority=None, is_gateway=True, is_gated=is_gated
        )
    if name in VLLM_ARMS:
        policy, priority = VLLM_ARMS[name]
        return EngineArm(name, "vllm", policy, "model" if priority == "rank" else None, priority)
    match = MAESTRO_ARM.fullmatch(name)
    if not match:
        raise ValueError(
            f"unknown engine arm '{name}'; known: {', '.join(VLLM_ARMS)}, maestro[model|prior|none|oracle|noiseσ], "
            f"optionally /VARIANT with VARIANT one of {', '.join(MAESTRO_VARIANTS)} (maestro[model/preempt]), and "
            f"{GATEWAY_PREFIX}[{GATE_PREFIX}]ARM for ARM vllm-priority-deadline or a maestro arm"
        )
    return EngineArm(name, "maestro", "priority", match.group(1), variant=match.group(2))
