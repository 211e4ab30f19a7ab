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
                               (= none-reserve), no-remaining (= none-remaining: no workflow estimate), no-reject
                               (shed workflows served behind the rest, not turned away), slack (the order
                               before triage: least predicted slack first), parametric (a running stage re-predicted
                               by the parametric bounds, not its model's progressive table); the parts stock
                               vLLM lacks: no-route (least-loaded node, not the fitness S(N,T)), no-toolkv (a
                               session's KV evicted at every tool call, not MARS's keep/evict rule), no-headroom
                               (no admission headroom), on-demand (vLLM's on-demand paging, not the predicted
                               reserve)
    maestro[SOURCE/OTHER-USE]  one use of the prediction fed from OTHER (model, prior, none, oracle), the rest from
                               SOURCE (`USES`): `service` (the point tokens_pred and the running stage's re-prediction
                               table: service estimates, order, triage's queued work, the batch-cost gate's point),
                               `reserve` (tokens_reserve: the KV reserve, the router's KV need, the gate's upper
                               bound), `remaining` (the workflow's remaining work: triage). Keep-or-evict at a tool
                               call reads no length prediction (the tool's measured time against the re-prefill).

Every arm gets the same deadlines (the referee's per-app SLOs) and the same tool times; baselines are fed `none`,
which none of them reads for its order or its reservation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from serving.core.admission.sizing import ReservationMode
from serving.core.dispatch import Router
from serving.core.scheduler import Policy
from serving.core.systems import SYSTEMS, System, get_system
from serving.core.tool_kv import ToolKVPolicy
from serving.sim.workload import SimStage

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
USES = ("service", "reserve", "remaining")  # the prediction's uses an arm can feed from another source
FED_FROM = ("model", "prior", "none", "oracle")
ALIASES = {"no-reserve": "none-reserve", "no-remaining": "none-remaining"}
FEEDS = tuple(f"{source}-{use}" for source in FED_FROM for use in USES)
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
    fed: tuple[tuple[str, str], ...] = ()  # (use, source): the uses fed from another source than `source`
    progressive: bool = True  # the model's progressive table read, where it has one (ablation parametric: not)

    @property
    def sources(self) -> tuple[str, ...]:
        """Every source the arm reads, its own first."""
        return tuple(dict.fromkeys((self.source, *(name for _, name in self.fed))))

    @property
    def needs_model(self) -> bool:
        return any(name in ("model", "prior") for name in self.sources)

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
            f"/{','.join(ABLATIONS)} or SOURCE-USE ({'|'.join(FED_FROM)}-{'|'.join(USES)})"
        )
    source, ablations = match.group(1), [a for a in (match.group(2) or "").split(",") if a]
    if unknown := [a for a in ablations if a not in ABLATIONS + FEEDS]:
        raise ValueError(
            f"arm '{name}': unknown ablation(s) {unknown}; known: {', '.join(ABLATIONS)}, or SOURCE-USE with SOURCE "
            f"one of {', '.join(FED_FROM)} and USE one of {', '.join(USES)}"
        )
    fed = {}
    for feed in (ALIASES.get(a, a) for a in ablations if ALIASES.get(a, a) in FEEDS):
        other, use = feed.split("-", 1)
        if fed.setdefault(use, other) != other:
            raise ValueError(f"arm '{name}': the use '{use}' is fed from two sources; name one")
    system = maestro
    if "no-gate" in ablations:
        system = system.with_overrides(batch_cost=False)
    for order in (a for a in ablations if a in ORDERS):
        system = system.with_overrides(scheduler=ORDERS[order])
    if "no-reject" in ablations:
        system = system.with_overrides(triage_rejects=False)
    for part in (a for a in ablations if a in PART_OFF):
        system = system.with_overrides(**PART_OFF[part])
    fed = tuple((use, other) for use, other in fed.items() if other != source)
    return Arm(name, system, source, fed, "parametric" not in ablations)


def predict_ready(arm: Arm, sources: dict[str, Callable[[SimStage], None]]) -> Callable[[SimStage], None]:
    """The arm's prediction at readiness: every use from the arm's source but those it feeds from another (`fed`)."""

    def predict(stage: SimStage) -> None:
        taken = []
        for use, name in arm.fed:
            sources[name](stage)
            taken.append((use, read_use(stage, use)))
        sources[arm.source](stage)
        for use, value in taken:
            write_use(stage, use, value)
        if not arm.progressive:
            stage.progressive = None

    return predict


def read_use(stage: SimStage, use: str) -> object:
    """What one use of the prediction reads off a predicted stage (`USES`)."""
    if use == "service":
        return stage.size.tokens_pred, stage.progressive
    if use == "reserve":
        return stage.size.tokens_reserve, stage.unseen_reserve
    return stage.remaining


def write_use(stage: SimStage, use: str, value) -> None:
    if use == "service":
        tokens_pred, stage.progressive = value
        stage.size = replace(stage.size, tokens_pred=tokens_pred)
    elif use == "reserve":
        tokens_reserve, stage.unseen_reserve = value
        stage.size = replace(stage.size, tokens_reserve=tokens_reserve)
    else:
        stage.remaining = value


def parse_arms(text: str) -> list[Arm]:
    """Arms separated by commas; a comma inside brackets separates ablations (`maestro[model/no-gate,no-route]`)."""
    names = re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text)
    return [parse_arm(name.strip()) for name in names if name.strip()]
