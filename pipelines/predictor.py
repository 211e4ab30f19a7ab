"""The stage-length predictor as used at run time: one loader, shared by CLI, service, simulator and tests."""
from __future__ import annotations

from dataclasses import asdict, dataclass

FALLBACK_LEVELS = ("role", "global", "prior")


@dataclass(frozen=True)
class Prediction:
    """What the scheduler learns about a stage before it runs.

    tokens_pred is the point estimate of output tokens; tokens_reserve the calibrated upper bound
    to reserve KV for; fallback_level says which level answered: "role" (role seen in training),
    "global" (unseen role, model without role), "prior" (no usable model input: role or global quantiles).
    """

    workflow_id: str
    stage_id: str
    p_tool: float
    tokens_pred: int
    tokens_reserve: int
    fallback_level: str

    def to_dict(self) -> dict:
        return asdict(self)
