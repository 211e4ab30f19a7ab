"""Where the simulator's per-stage predictions come from: oracle, a stated noise model, or the trained predictor.

Noise model: tokens_pred = true · exp(ε), ε ~ N(0, σ²) with σ = 0.5 by default (roughly the
R² ≈ 0.78 the seed reports on log tokens); tokens_reserve = tokens_pred · exp(σ·z_q), the q-quantile
of the true length given the prediction (q = 0.8 by default), i.e. a reserve that covers the true
length for ~80% of stages; the rest grow during decode. The oracle's and the noise model's reserves are
calibrated by construction; a trained model's are sized by `admission.sizing.reserve_output_tokens`, as the
gateway sizes them (its conformal bound as is, a prior's × (1 + rho)). All are capped at max_tokens.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from maestro.prediction import OutputSize
from serving.core.admission.sizing import DEFAULT_RHO, LengthPrediction, is_calibrated, reserve_output_tokens
from serving.sim.workload import SimStage, SimWorkflow, to_contract


class PredictionSource(enum.Enum):
    ORACLE = "oracle"
    NOISE = "noise"
    MODEL = "model"
    PRIOR = "prior"  # the trained predictor's per-role priors alone: the role's median, its (1 − α) quantile
    NONE = "none"  # no prediction: every stage the no-model prior (what the gateway answers without a model)


@dataclass
class PredictionConfig:
    source: str = "noise"
    sigma: float = 0.5
    reserve_quantile: float = 0.8
    model_dir: str | None = None
    seed: int = 0
    rho: float = DEFAULT_RHO  # margin on a model source's prior answers (admission/sizing.py)

    def __post_init__(self):
        if self.source not in {s.value for s in PredictionSource}:
            raise ValueError(
                f"unknown prediction source '{self.source}'; known: {', '.join(s.value for s in PredictionSource)}"
            )
        if self.source in ("model", "prior") and not self.model_dir:
            raise ValueError(f"prediction source '{self.source}' needs model_dir (--model DIR)")
        if self.sigma < 0 or not 0 < self.reserve_quantile < 1 or not 0 <= self.rho <= 1:
            raise ValueError("sigma must be >= 0, reserve_quantile in (0, 1) and rho in [0, 1]")


def annotate(workflows: list[SimWorkflow], config: PredictionConfig) -> None:
    """Size every stage's output (its `size`)."""
    source = PredictionSource(config.source)
    if source is PredictionSource.MODEL:
        return _from_model(workflows, config.model_dir, config.rho)
    if source in (PredictionSource.PRIOR, PredictionSource.NONE):
        return _from_priors(workflows, config.model_dir if source is PredictionSource.PRIOR else None, config.rho)
    rng = np.random.default_rng(config.seed)
    widen = math.exp(config.sigma * NormalDist().inv_cdf(config.reserve_quantile))
    for workflow in workflows:
        for stage in workflow.stages:
            true = stage.output_tokens
            pred = true if source is PredictionSource.ORACLE else true * math.exp(rng.normal(0.0, config.sigma))
            reserve = true if source is PredictionSource.ORACLE else pred * widen
            tokens_pred = int(min(stage.max_tokens, max(1, round(pred))))
            reserve = reserve_output_tokens(tokens_pred, math.ceil(reserve), stage.max_tokens, is_calibrated=True)
            stage.size = OutputSize(tokens_pred=tokens_pred, tokens_reserve=reserve)


def apply_prediction(stage: SimStage, prediction: LengthPrediction, rho: float = DEFAULT_RHO) -> None:
    """Set a stage's size from a predictor's answer, sized as the gateway sizes it."""
    reserve = reserve_output_tokens(
        prediction.tokens_pred,
        prediction.tokens_reserve,
        stage.max_tokens,
        is_calibrated=is_calibrated(prediction),
        rho=rho,
    )
    stage.size = OutputSize(
        tokens_pred=int(min(stage.max_tokens, max(1, prediction.tokens_pred))), tokens_reserve=reserve
    )


def _from_model(workflows: list[SimWorkflow], model_dir: str, rho: float, batch_size: int = 4096) -> None:
    from pipelines.predictor import Predictor  # lazily: the trained predictor is optional here

    predictor = Predictor.load(model_dir)
    stages = [s for w in workflows for s in w.stages]
    for start in range(0, len(stages), batch_size):
        chunk = stages[start : start + batch_size]
        for stage, prediction in zip(chunk, predictor.predict([to_contract(s) for s in chunk])):
            apply_prediction(stage, prediction, rho)


def _from_priors(workflows: list[SimWorkflow], model_dir: str | None, rho: float) -> None:
    """Each stage answered by its role's prior in the trained predictor (the global one for an unseen role), or by
    the no-model prior when there is no predictor; sized as the gateway sizes a prior's answer (× (1 + rho))."""
    from pipelines.predictor import NO_MODEL_PRIOR, Prior

    priors = {}
    if model_dir:
        priors = {role: Prior(**v) for role, v in json.loads((Path(model_dir) / "priors.json").read_text()).items()}
    for stage in (s for w in workflows for s in w.stages):
        prior = priors.get(stage.role) or priors.get("") or NO_MODEL_PRIOR
        tokens_pred = int(min(stage.max_tokens, max(1, round(prior.tokens_median))))
        reserve = reserve_output_tokens(
            tokens_pred, math.ceil(prior.tokens_upper), stage.max_tokens, is_calibrated=False, rho=rho
        )
        stage.size = OutputSize(tokens_pred=tokens_pred, tokens_reserve=reserve)
