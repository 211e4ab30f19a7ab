"""The empirical priors: a stage's answer without a model (per role, else over everything), what a predictor fitted
on too few stages answers, and NO_MODEL_PRIOR, the answer with no data at all."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from maestro.prediction import WORKFLOW_PRIOR, FallbackLevel, Prediction, WorkflowRemaining


@dataclass(frozen=True)
class Prior:
    """Empirical answer for a role (or for everything): median length, tool rate, (1−α) quantile."""

    p_tool: float
    tokens_median: float
    tokens_upper: float

    @classmethod
    def of(cls, tokens: np.ndarray, is_tool: np.ndarray, alpha: float) -> Prior:
        return cls(float(np.mean(is_tool)), float(np.median(tokens)), float(np.quantile(tokens, 1 - alpha)))

    def answer(self, workflow_id: str, stage_id: str, remaining: WorkflowRemaining = WORKFLOW_PRIOR) -> Prediction:
        """This prior as a stage's prediction: its median, its quantile as the (uncalibrated) reserve, no history;
        `remaining`: the workflow fields."""
        return Prediction(
            workflow_id,
            stage_id,
            round(self.p_tool, 4),
            FallbackLevel.PRIOR,
            "none",
            tokens_pred=int(round(self.tokens_median)),
            tokens_reserve=math.ceil(self.tokens_upper),
            **remaining.remaining_fields(),
        )


# The answer when there is no data at all (no model, no fitted priors): the gateway without a trained model, the
# predictor client when the service is down and no local priors are given, a predictor fitted on no labels. Its
# upper bound is not calibrated, so sizing adds the margin rho to it (serving/core/admission/sizing.py).
NO_MODEL_PRIOR = Prior(p_tool=0.0, tokens_median=256.0, tokens_upper=1024.0)


def fit_priors(labels: pd.DataFrame, alpha: float, min_count: int = 5) -> dict[str, Prior]:
    """Per-role priors where a role has `min_count` stages, plus the global one under key ''."""
    if labels.empty:
        return {"": NO_MODEL_PRIOR}
    priors = {"": Prior.of(labels["tokens"].to_numpy(float), labels["is_tool"].to_numpy(float), alpha)}
    for role, group in labels.groupby("role"):
        if len(group) >= min_count:
            priors[str(role)] = Prior.of(group["tokens"].to_numpy(float), group["is_tool"].to_numpy(float), alpha)
    return priors
