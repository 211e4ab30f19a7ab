"""Node selection: S(N,T) = A(N,T) − λ·T_ready − μ·C_deg over robust min-max normalised terms.

A is availability (higher is better), T_ready the seconds until the node could start the stage
(model transition + queued work) and serve its session's tool calls (where tools run on the node's host
CPU, as in the simulator, the wait for a core there: a routed session stays on its node; the gateway's
tools run at the client, so none adds there), C_deg the degradation the node would suffer (KV shortfall,
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


def _percentile(ordered: list[float], q: float) -> float:
    """numpy.percentile's default (linear interpolation) on a sorted list: a few nodes' terms need no array."""
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _scaled(values, clip_quantiles: tuple[float, float]) -> list[float]:
    values = [float(v) for v in values]
    ordered = sorted(values)
    lo, hi = (_percentile(ordered, q) for q in clip_quantiles)
    if hi - lo <= 1e-12:
        return [0.0] * len(values)
    return [(min(max(v, lo), hi) - lo) / (hi - lo) for v in values]


def robust_minmax(values, clip_quantiles: tuple[float, float] = (5.0, 95.0)) -> np.ndarray:
    """Clip to the given percentiles, then scale to [0, 1]; a constant vector maps to zeros."""
    return np.asarray(_scaled(values, clip_quantiles), dtype=float)


def _scores(availability, ready_s, degradation, config: FitnessConfig) -> list[float]:
    q = config.clip_quantiles
    terms = zip(_scaled(availability, q), _scaled(ready_s, q), _scaled(degradation, q))
    return [a - config.ready_weight * r - config.degradation_weight * d for a, r, d in terms]


def fitness(availability, ready_s, degradation, config: FitnessConfig) -> np.ndarray:
    return np.asarray(_scores(availability, ready_s, degradation, config), dtype=float)


def select_node(availability, ready_s, degradation, config: FitnessConfig) -> int:
    """Index of the fittest node; ties go to the lowest ready time."""
    scores = _scores(availability, ready_s, degradation, config)
    top = max(scores) - 1e-12
    ready = list(ready_s)
    return min((i for i, score in enumerate(scores) if score >= top), key=lambda i: ready[i])
