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
                               by the parametric bounds, not its model's progressive table)

Every arm gets the same deadlines (the referee's per-app SLOs) and the same tool times; baselines are fed `none`,
which none of them reads for its order or its reservation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from serving.core.scheduler import Policy
from serving.core.systems import SYSTEMS, System, get_system

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
ABLATIONS = ("no-gate", "no-order", "no-reserve", "no-remaining", "no-reject", "slack", "parametric")
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
    return Arm(
        name,
        system,
        source,
        "none" if "no-reserve" in ablations else None,
        "no-remaining" not in ablations,
        "parametric" not in ablations,
    )


def parse_arms(text: str) -> list[Arm]:
    return [parse_arm(name.strip()) for name in text.split(",") if name.strip()]
