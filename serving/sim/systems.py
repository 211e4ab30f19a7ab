"""What each policy name means as a whole serving system: ordering, KV reservation, tool-KV, routing.

Baselines of the Maestro paper (FCFS, EDF, SRTF) reserve KV for max_tokens, the traditional
static reservation the −67.2% is read against; the agent baselines of MARS (Continuum,
Continuum-Dy, InferCept, keep/evict-always) run on vLLM's paged, on-demand allocation.
"""
from __future__ import annotations

from dataclasses import dataclass

from serving.admission.cap import CapKind
from serving.admission.sizing import ReservationMode

# The reservation modes the simulator runs (projected admission is the gateway's; the sim has no projection).
SIM_RESERVATIONS = (ReservationMode.MAX_LEN, ReservationMode.PREDICTED, ReservationMode.ON_DEMAND)
SIM_CAPS = (CapKind.NONE, CapKind.AIMD)  # the workflow cap needs the gateway's W (GatewayConfig.workflow_cap)


@dataclass(frozen=True)
class SystemConfig:
    name: str
    scheduler: str
    reservation: str
    tool_kv: str
    router: str = "least-loaded"  # or "fitness"
    cap: str = "none"  # the session cap (admission/cap.py): none, aimd (MARS's window), workflow
    admission_headroom_frac: float = 0.0  # keep this share of the pool free when admitting
    batch_cost: bool = False  # admit only what the running stages' slack can afford (admission/batch_cost.py)

    def __post_init__(self):
        if ReservationMode(self.reservation) not in SIM_RESERVATIONS:
            raise ValueError(f"system '{self.name}': reservation '{self.reservation}' is not simulated; "
                             f"known: {', '.join(m.value for m in SIM_RESERVATIONS)}")
        if self.router not in ("least-loaded", "fitness"):
            raise ValueError(f"unknown router '{self.router}'; known: least-loaded, fitness")
        if CapKind(self.cap) not in SIM_CAPS:
            raise ValueError(f"system '{self.name}': cap '{self.cap}' is not simulated; "
                             f"known: {', '.join(c.value for c in SIM_CAPS)}")
        if not 0 <= self.admission_headroom_frac < 1:
            raise ValueError("admission_headroom_frac must be in [0, 1)")


SYSTEMS = {s.name: s for s in [
    SystemConfig("fcfs", "fcfs", "max-len", "evict-always"),
    SystemConfig("edf", "edf", "max-len", "evict-always"),
    SystemConfig("srtf", "srtf", "max-len", "evict-always"),
    SystemConfig("maestro", "maestro", "predicted", "mars", "fitness", admission_headroom_frac=0.05, batch_cost=True),
    # Maestro before the slack policy: predicted SRTF, every stage whose reserve fits admitted at once.
    SystemConfig("maestro-srtf", "predicted-srtf", "predicted", "mars", "fitness", admission_headroom_frac=0.05),
    SystemConfig("mars", "mars", "on-demand", "mars", cap="aimd"),
    SystemConfig("continuum", "continuum", "on-demand", "continuum"),
    SystemConfig("continuum-dy", "continuum", "on-demand", "continuum-dy"),
    SystemConfig("infercept", "fcfs", "on-demand", "infercept"),
    SystemConfig("keep-always", "fcfs", "on-demand", "keep-always"),
    SystemConfig("evict-always", "fcfs", "on-demand", "evict-always"),
    SystemConfig("vllm", "fcfs", "on-demand", "evict-always"),
]}


def get_system(name: str) -> SystemConfig:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown policy '{name}'; known policies: {', '.join(SYSTEMS)}") from None
