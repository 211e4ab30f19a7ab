"""Node selection: S(N,T) = A(N,T) − λ·T_ready − μ·C_deg over robust min-max normalised terms.

A is availability (higher is better), T_ready the seconds until the node could start the stage
(model transition + queued work), C_deg the degradation the node would suffer (KV shortfall,
models it would have to push out). Each term is min-max normalised after clipping at its
5th/95th percentiles, so one outlier node cannot dominate (the seed's choice); λ = μ = 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class FitnessConfig:
    ready_weight: float = 1.0  # λ
    degradation_weight: float = 1.0  # μ
    clip_quantiles: tuple[float, float] = (5.0, 95.0)

    def __post_init__(self):
        lo, hi = self.clip_quantiles
        if self.ready_weight < 0 or self.degradation_weight < 0 or not 0 <= lo < hi <= 100:
            raise ValueError("weights must be >= 0 and clip_quantiles 0 <= lo < hi <= 100")


def robust_minmax(values: np.ndarray, clip_quantiles: tuple[float, float] = (5.0, 95.0)) -> np.ndarray:
    """Clip to the given percentiles, then scale to [0, 1]; a constant vector maps to zeros."""
    values = np.asarray(values, dtype=float)
    lo, hi = np.percentile(values, clip_quantiles)
    if hi - lo <= 1e-12:
        return np.zeros_like(values)
    return (np.clip(values, lo, hi) - lo) / (hi - lo)


def fitness(availability, ready_s, degradation, config: FitnessConfig) -> np.ndarray:
    q = config.clip_quantiles
    return (robust_minmax(availability, q) - config.ready_weight * robust_minmax(ready_s, q)
            - config.degradation_weight * robust_minmax(degradation, q))


def select_node(availability, ready_s, degradation, config: FitnessConfig) -> int:
    """Index of the fittest node; ties go to the lowest ready time."""
    scores = fitness(availability, ready_s, degradation, config)
    best = np.flatnonzero(scores >= scores.max() - 1e-12)
    return int(best[np.argmin(np.asarray(ready_s)[best])])
