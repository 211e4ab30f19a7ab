"""GET /coverage: the served model's live coverage, per group, and which groups drift past their bound.

A group (app, role, history condition) drifts when its recent share of stages above the served reserve stands
above the model's promised miss rate α by more than `drift_sd` standard errors (predictor_service/online.py).
`maestro retrain --on-drift` reads this from every node; a reload starts every group afresh.
"""

from __future__ import annotations

from pydantic import BaseModel

from predictor_service.online import OnlineCorrection


class CoverageGroup(BaseModel):
    app: str
    role: str
    history: str
    share_above_reserve: float  # EWMA of "the stage went above its served reserve"
    num_observations: int
    is_drifting: bool


class CoverageResponse(BaseModel):
    model_version: str
    alpha: float  # the share of stages the reserve is calibrated to miss
    groups: list[CoverageGroup]

    @property
    def drifting(self) -> list[CoverageGroup]:
        return [g for g in self.groups if g.is_drifting]


def coverage_report(model_version: str, corrections: OnlineCorrection) -> CoverageResponse:
    """Every coverage group the service observed under the active model (the engine keys each by app, role and
    history condition; a group keyed by role alone comes only from direct OnlineCorrection use)."""
    groups = [
        CoverageGroup(app=key[0], role=key[1], history=key[2], **state)
        for key, state in corrections.coverage().items()
        if isinstance(key, tuple)
    ]
    return CoverageResponse(model_version=model_version, alpha=corrections.alpha, groups=groups)
