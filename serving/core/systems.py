"""One table: what each system name means, for the gateway, the simulator and the in-engine scheduler alike.

A system is a scheduler policy (queue order), a KV reservation mode (what a starting stage maps), a tool-KV policy
(a session's context during its tool call), a router (which node), a session cap, an admission headroom and whether
Maestro's batch-cost gate holds stages back. The gateway's config names a system and may override any of these
(`System.with_overrides`); the simulator runs a system by name; the vLLM plugin takes its queue order from it.

Baselines of the Maestro paper (FCFS, EDF, SRTF) reserve KV for max_tokens, the traditional static reservation the
−67.2 % is read against; the agent baselines of MARS (Continuum, Continuum-Dy, InferCept, keep/evict-always) run on
vLLM's paged, on-demand allocation, as does stock vLLM (`vllm`: FCFS; `vllm-edf`: its priority fed the deadline).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from serving.core.admission.cap import CapKind
from serving.core.admission.sizing import ReservationMode
from serving.core.dispatch import Router
from serving.core.scheduler import Policy
from serving.core.tool_kv import ToolKVPolicy

DEFAULT_SYSTEM = "maestro"


@dataclass(frozen=True)
class System:
    name: str
    scheduler: Policy
    reservation: ReservationMode
    tool_kv: ToolKVPolicy
    router: Router = Router.LEAST_LOADED
    cap: CapKind = CapKind.NONE  # the session cap (admission/cap.py): none, aimd (MARS's window) or aimd-batch
    admission_headroom_frac: float = 0.0  # keep this share of the pool free when admitting
    batch_cost: bool = False  # admit only what the running stages' slack can afford (admission/batch_cost.py)
    # with the triage order: a workflow the triage sheds is turned away then, rather than served behind the rest
    triage_rejects: bool = False

    def __post_init__(self):
        if self.reservation is ReservationMode.PROJECTED:
            raise ValueError(
                f"system '{self.name}': 'projected' is how the gateway admits a predicted reservation "
                "(its kv.admission), not a reservation of its own; use 'predicted'"
            )
        if not 0 <= self.admission_headroom_frac < 1:
            raise ValueError(f"system '{self.name}': admission_headroom_frac must be in [0, 1)")

    def with_overrides(self, **changes) -> System:
        """This system with some of its parts (enum members, as the gateway config parses them) changed."""
        known = {f.name for f in dataclasses.fields(self)} - {"name"}
        if unknown := sorted(set(changes) - known):
            raise ValueError(f"system '{self.name}': unknown part(s) {unknown}; known: {sorted(known)}")
        return dataclasses.replace(self, **changes)


_P, _R, _T = Policy, ReservationMode, ToolKVPolicy
SYSTEMS: dict[str, System] = {
    s.name: s
    for s in [
        System("fcfs", _P.FCFS, _R.MAX_LEN, _T.EVICT_ALWAYS),
        System("edf", _P.EDF, _R.MAX_LEN, _T.EVICT_ALWAYS),
        System("srtf", _P.SRTF, _R.MAX_LEN, _T.EVICT_ALWAYS),
        System(
            "maestro",
            _P.TRIAGE,
            _R.PREDICTED,
            _T.MARS_BATCH,
            Router.FITNESS,
            admission_headroom_frac=0.05,
            batch_cost=True,
            triage_rejects=True,
        ),
        # Maestro before workflow triage: least predicted slack first, late work demoted, nothing turned away.
        System(
            "maestro-slack",
            _P.LEAST_SLACK,
            _R.PREDICTED,
            _T.MARS,
            Router.FITNESS,
            admission_headroom_frac=0.05,
            batch_cost=True,
        ),
        # Maestro before the slack policy: predicted SRTF, every stage whose reserve fits admitted at once.
        System("maestro-srtf", _P.PREDICTED_SRTF, _R.PREDICTED, _T.MARS, Router.FITNESS, admission_headroom_frac=0.05),
        System("mars", _P.MARS, _R.ON_DEMAND, _T.MARS, cap=CapKind.AIMD),
        System("continuum", _P.CONTINUUM, _R.ON_DEMAND, _T.CONTINUUM),
        System("continuum-dy", _P.CONTINUUM, _R.ON_DEMAND, _T.CONTINUUM_DY),
        System("infercept", _P.FCFS, _R.ON_DEMAND, _T.INFERCEPT),
        System("keep-always", _P.FCFS, _R.ON_DEMAND, _T.KEEP_ALWAYS),
        System("evict-always", _P.FCFS, _R.ON_DEMAND, _T.EVICT_ALWAYS),
        System("vllm", _P.FCFS, _R.ON_DEMAND, _T.EVICT_ALWAYS),
        # stock vLLM with its request priority fed the workflow's deadline: EDF order, blocks on demand, recompute
        System("vllm-edf", _P.EDF, _R.ON_DEMAND, _T.EVICT_ALWAYS),
    ]
}


def get_system(name: str) -> System:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown policy '{name}'; known policies: {', '.join(SYSTEMS)}") from None
