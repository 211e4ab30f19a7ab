"""What each arm of the referee is: a system, the prediction source it is fed, and any part switched off.

    fcfs, edf, srtf            the baselines as systems (`serving.core.systems`): max-len reservation, no
                               prediction read
    vllm, vllm-edf             stock vLLM as users run it: blocks on demand, recompute on preemption; FCFS, or its
                               priority fed the deadline (EDF order); no prediction read
    mars, continuum, ...       any other baseline system of the table by its name (a scenario's extra baselines:
                               `Scenario.referee_arms`), fed `none`
    edf+admission              the Maestro system with only its order set to EDF, fed the trained model
    maestro[SOURCE]            Maestro fed SOURCE: model, prior, none, oracle, noiseσ (`serving.sim.ready`)
    maestro[model@compare]     Maestro fed the predictor of --compare-model instead of --model's (same arms, same
                               workloads: two predictors paired)
    maestro[SOURCE/ABL,...]    ... with parts off: no-gate (no batch-cost gate), no-order (EDF order), no-reserve
                               (the reserve from `none`, the point from SOURCE), no-remaining (no workflow estimate),
                               no-reject (shed workflows served behind the rest, not turned away), slack (the order
                               before triage: least predicted slack first), parametric (a running stage re-predicted
                               by the parametric bounds, not its model's progressive table); the parts stock
                               vLLM lacks: no-route (least-loaded node, not the fitness S(N,T)), no-toolkv (a
                               session's KV evicted at every tool call, not MARS's keep/evict rule), no-headroom
                               (no admission headroom), on-demand (vLLM's on-demand paging, not the predicted
                               reserve)

Every arm gets the same deadlines (the referee's per-app SLOs) and the same tool times; baselines are fed `none`,
which none of them reads for its order or its reservation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from serving.core.admission.sizing import ReservationMode
from serving.core.dispatch import Router
from serving.core.scheduler import Policy
from serving.core.systems import SYSTEMS, System, get_system
from serving.core.tool_kv import ToolKVPolicy

BASELINES = ("fcfs", "edf", "srtf")
STOCK = ("vllm", "vllm-edf")  # stock vLLM, FCFS and deadline order
# the table's other systems that read no stage prediction (Maestro's own variants are maestro[...] arms)
SYSTEM_ARMS = tuple(name for name in SYSTEMS if name not in BASELINES + STOCK and not name.startswith("maestro"))
DEFAULT_ARMS = (
    "fcfs",
    "edf",
    "srtf",
    *STOCK,
    "edf+admission",
    "maestro[model]",
    "maestro[prior]",
    "maestro[none]",
    "maestro[oracle]",
    "maestro[model/slack]",
)
ABLATIONS = (
    "no-gate",
    "no-order",
    "no-reserve",
    "no-remaining",
    "no-reject",
    "slack",
    "parametric",
    "no-route",
    "no-toolkv",
    "no-headroom",
    "on-demand",
)
# the ablations that switch one part of the system to stock vLLM's (`vllm-edf`)
PART_OFF = {
    "no-route": {"router": Router.LEAST_LOADED},
    "no-toolkv": {"tool_kv": ToolKVPolicy.EVICT_ALWAYS},
    "no-headroom": {"admission_headroom_frac": 0.0},
    "on-demand": {"reservation": ReservationMode.ON_DEMAND},
}
ORDERS = {"no-order": Policy.EDF, "slack": Policy.LEAST_SLACK}
_MAESTRO = re.compile(r"^maestro\[(model(?:@compare)?|prior|none|oracle|noise[0-9.]+)(?:/([a-z,-]+))?\]$")
COMPARE = "@compare"  # a source read from the --compare-model predictor


@dataclass(frozen=True)
class Arm:
    name: str
    system: System
    source: str
    reserve_source: str | None = None  # the reserve from another source (ablation no-reserve)
    remaining: bool = True  # the workflow's remaining-work estimate read (ablation no-remaining: 0)
    progressive: bool = True  # the model's progressive table read, where it has one (ablation parametric: not)

    @property
    def needs_model(self) -> bool:
        return self.source in ("model", "prior")

    @property
    def needs_compare_model(self) -> bool:
        return self.source.endswith(COMPARE)


def parse_arm(name: str) -> Arm:
    if name in BASELINES + STOCK + SYSTEM_ARMS:
        return Arm(name, get_system(name), "none")
    maestro = get_system("maestro")
    if name == "edf+admission":
        return Arm(name, maestro.with_overrides(scheduler=Policy.EDF), "model")
    match = _MAESTRO.match(name)
    if not match:
        raise ValueError(
            f"unknown arm '{name}'; known: {', '.join(BASELINES + STOCK + SYSTEM_ARMS)}, edf+admission, "
            f"maestro[model|model@compare|prior|none|oracle|noiseσ] with optional "
            f"/{','.join(ABLATIONS)}"
        )
    source, ablations = match.group(1), [a for a in (match.group(2) or "").split(",") if a]
    if unknown := [a for a in ablations if a not in ABLATIONS]:
        raise ValueError(f"arm '{name}': unknown ablation(s) {unknown}; known: {', '.join(ABLATIONS)}")
    system = maestro
    if "no-gate" in ablations:
        system = system.with_overrides(batch_cost=False)
    for order in (a for a in ablations if a in ORDERS):
        system = system.with_overrides(scheduler=ORDERS[order])
    if "no-reject" in ablations:
        system = system.with_overrides(triage_rejects=False)
    for part in (a for a in ablations if a in PART_OFF):
        system = system.with_overrides(**PART_OFF[part])
    return Arm(
        name,
        system,
        source,
        "none" if "no-reserve" in ablations else None,
        "no-remaining" not in ablations,
        "parametric" not in ablations,
    )


def parse_arms(text: str) -> list[Arm]:
    """Arms separated by commas; a comma inside brackets separates ablations (`maestro[model/no-gate,no-route]`)."""
    names = re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text)
    return [parse_arm(name.strip()) for name in names if name.strip()]
