"""The two-stage length model's configuration (`ModelConfig`, validated once) and the LightGBM parameters its
boosters are trained with: the shared settings (`lgb_params`) and the regressor's asymmetric loss
(`regression_objective`: pinball, or the squared `asymmetric_l2`). The model itself is pipelines/model.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import lightgbm as lgb
import numpy as np


@dataclass(frozen=True)
class ModelConfig:
    under_weight: float = 1.5
    loss: str = "pinball"  # pinball | squared: the regressor's asymmetric loss, absolute or squared
    alpha: float = 0.05  # target share of stages above their reserve
    rho: float = 0.2  # the fixed-margin reserve, kept for comparison: pred × (1 + rho)
    reserve_method: str = "conformal"  # conformal | rho
    folds: int = 5
    min_group_calibration: int = 40
    # the quantile the reserve's bound model fits before calibration lifts it to a miss rate of alpha;
    # None: 1 − alpha
    bound_quantile: float | None = None
    role_dropout: float = 0.1  # rows trained with role="unknown" so unseen roles have a learnt fallback
    calibration: str = "sigmoid"  # sigmoid (Platt: keeps the ranking) | isotonic (steps: ties scores)
    seed: int = 0
    # LightGBM threads. One by default: OpenMP threads spin-waiting on each other stall a training when other
    # work shares the cores (pipelines/EXPERIMENTS.md)
    num_threads: int = 1
    classifier: dict = field(
        default_factory=lambda: dict(
            n_estimators=300,
            learning_rate=0.05,
            num_leaves=31,
            min_child_samples=10,
            subsample=0.8,
            subsample_freq=1,
            colsample_bytree=0.8,
        )
    )
    quantile: dict = field(
        default_factory=lambda: dict(
            n_estimators=300,
            learning_rate=0.05,
            num_leaves=15,
            min_child_samples=20,
            subsample=0.8,
            subsample_freq=1,
            colsample_bytree=0.8,
        )
    )
    # extra_trees: split thresholds drawn at random, a variance cut for ~1k training stages
    regressor: dict = field(
        default_factory=lambda: dict(
            n_estimators=500,
            learning_rate=0.05,
            num_leaves=31,
            min_child_samples=10,
            subsample=0.8,
            subsample_freq=1,
            colsample_bytree=0.8,
            extra_trees=True,
        )
    )
    # regressors averaged (in log space) for the point prediction, seeds seed..seed+bags-1: bagging and
    # random thresholds differ per member, so the average is steadier than any one
    regressor_bags: int = 1
    # whether the tool-call classifier reads the prompt embedding's columns (emb_*); the regressors and the bound
    # read them either way
    classifier_embedding: bool = True
    # save the boosters compiled to native code beside the predictor (pipelines.compiled_trees; the `fast` extra)
    compile_trees: bool = False
    # save the boosters packed for pipelines.row_walker beside the predictor (gcc, < 1 s): one stage's trees in native
    # code; without gcc, LightGBM's single-row API
    row_walker: bool = True

    @property
    def bound_level(self) -> float:
        return 1 - self.alpha if self.bound_quantile is None else self.bound_quantile

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5), got {self.alpha}")
        if self.under_weight <= 0:
            raise ValueError(f"under_weight must be > 0, got {self.under_weight}")
        if self.loss not in ("pinball", "squared"):
            raise ValueError(f"loss must be 'pinball' or 'squared', got {self.loss!r}")
        if self.reserve_method not in ("conformal", "rho"):
            raise ValueError(f"reserve_method must be 'conformal' or 'rho', got {self.reserve_method!r}")
        if self.calibration not in ("sigmoid", "isotonic"):
            raise ValueError(f"calibration must be 'sigmoid' or 'isotonic', got {self.calibration!r}")
        if self.bound_quantile is not None and not 0.5 <= self.bound_quantile < 1:
            raise ValueError(f"bound_quantile must be in [0.5, 1), got {self.bound_quantile}")
        if self.folds < 2:
            raise ValueError(f"folds must be ≥ 2, got {self.folds}")
        if self.num_threads < 1:
            raise ValueError(f"num_threads must be ≥ 1, got {self.num_threads}")
        if self.regressor_bags < 1:
            raise ValueError(f"regressor_bags must be ≥ 1, got {self.regressor_bags}")


def asymmetric_l2(under_weight: float):
    """LightGBM objective: squared error, `under_weight`× heavier where the prediction is below the label."""

    def objective(preds: np.ndarray, data: lgb.Dataset) -> tuple[np.ndarray, np.ndarray]:
        residual = preds - data.get_label()
        weight = np.where(residual < 0, under_weight, 1.0)
        return 2.0 * weight * residual, 2.0 * weight

    return objective


def regression_objective(loss: str, under_weight: float) -> dict:
    """LightGBM parameters for an asymmetric loss weighing under-estimation `under_weight`× more.
    Absolute (pinball) loss with weights w : 1 is minimised by the w/(1+w) quantile."""
    if loss == "pinball":
        return {"objective": "quantile", "alpha": under_weight / (1 + under_weight)}
    return {"objective": asymmetric_l2(under_weight)}


def lgb_params(params: dict, config: ModelConfig, **extra) -> dict:
    """LightGBM's parameters of one of the config's models: `params` less n_estimators, shared settings, `extra`."""
    out = {k: v for k, v in params.items() if k != "n_estimators"}
    return {"verbosity": -1, "seed": config.seed, "num_threads": config.num_threads, **out, **extra}
