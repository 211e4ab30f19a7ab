"""Admission and dispatch: may a stage start on a node now, with what reservation, and which stage goes first.

`sizing` sizes a stage's reserve (the one prediction → tokens rule, the reservation modes); `cap` is the
session-cap interface, with MARS's AIMD window (`aimd`) behind it; `dispatch`
is the dispatch core (queue, cap, backfill, node choice) the gateway and the simulator both drive. Each caller checks
KV against its own pages: the gateway's `Node` against vLLM's blocks, the simulator's `kv_plan` against its pool.
"""

from serving.core.admission.aimd import AIMDConfig, AIMDWindow, SessionWindow
from serving.core.admission.cap import CapKind, CapSignals, SessionCap
from serving.core.admission.sizing import (
    DEFAULT_RHO,
    ReservationMode,
    is_calibrated,
    output_tokens_to_map,
    reserve_output_tokens,
)

__all__ = [
    "AIMDConfig",
    "AIMDWindow",
    "CapKind",
    "CapSignals",
    "DEFAULT_RHO",
    "ReservationMode",
    "SessionCap",
    "SessionWindow",
    "is_calibrated",
    "output_tokens_to_map",
    "reserve_output_tokens",
]
