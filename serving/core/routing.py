"""Node selection: S(N,T) = A(N,T) − λ·T_ready − μ·C_deg over robustly scaled terms.

A is availability (higher is better), T_ready the seconds until the node could start the stage (model transition +
queued work) and serve its session's tool calls (where tools run on the node's host CPU, as in the simulator, the
wait for a core there times the share of it routed stages' calls have been seen to meet, `HostWaitFit`: a routed
session stays on its node; the gateway's tools run at the client, so none adds there), C_deg the degradation the node
would suffer (KV shortfall, models it would have to push out). Each term is clipped at its 5th/95th percentiles, so one
outlier node cannot dominate (the seed's choice), and scaled by its spread over the candidates; λ = μ = 1. A and C_deg
are shares (of the node's KV, of the stage's need), so their spread is taken as at least `FitnessConfig.share_span`
(1): nodes whose free KV differs by 2 % differ by 0.02 in A, not by a whole unit against seconds of T_ready. (The
seed min-max scales every term; `share_span=0` is that: on a KV-bound long-context workload it sent sessions to
nodes with a sliver more free KV but more work queued — docs/routing.md.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class FitnessConfig:
    ready_weight: float = 1.0  # λ
    degradation_weight: float = 1.0  # μ
    clip_quantiles: tuple[float, float] = (5.0, 95.0)
    share_span: float = 1.0  # the least spread A and C_deg are scaled over (0: min-max, as T_ready)

    def __post_init__(self):
        lo, hi = self.clip_quantiles
        if self.ready_weight < 0 or self.degradation_weight < 0 or self.share_span < 0 or not 0 <= lo < hi <= 100:
            raise ValueError("weights and share_span must be >= 0 and clip_quantiles 0 <= lo < hi <= 100")


def _percentile(ordered: list[float], q: float) -> float:
    """numpy.percentile's default (linear interpolation) on a sorted list: a few nodes' terms need no array."""
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _scaled(values, clip_quantiles: tuple[float, float], min_span: float = 0.0) -> list[float]:
    """Clipped to the percentiles, less the low one, over the spread between them or `min_span`, the larger."""
    values = [float(v) for v in values]
    ordered = sorted(values)
    lo, hi = (_percentile(ordered, q) for q in clip_quantiles)
    span = max(hi - lo, min_span)
    if span <= 1e-12:
        return [0.0] * len(values)
    return [(min(max(v, lo), hi) - lo) / span for v in values]


def robust_minmax(values, clip_quantiles: tuple[float, float] = (5.0, 95.0)) -> np.ndarray:
    """Clip to the given percentiles, then scale to [0, 1]; a constant vector maps to zeros."""
    return np.asarray(_scaled(values, clip_quantiles), dtype=float)


def _scores(availability, ready_s, degradation, config: FitnessConfig) -> list[float]:
    q, span = config.clip_quantiles, config.share_span
    terms = zip(_scaled(availability, q, span), _scaled(ready_s, q), _scaled(degradation, q, span))
    return [a - config.ready_weight * r - config.degradation_weight * d for a, r, d in terms]


def fitness(availability, ready_s, degradation, config: FitnessConfig) -> np.ndarray:
    return np.asarray(_scores(availability, ready_s, degradation, config), dtype=float)


def select_node(availability, ready_s, degradation, config: FitnessConfig) -> int:
    """Index of the fittest node; ties go to the lowest ready time."""
    scores = _scores(availability, ready_s, degradation, config)
    top = max(scores) - 1e-12
    ready = list(ready_s)
    return min((i for i, score in enumerate(scores) if score >= top), key=lambda i: ready[i])


SLOPE_Z = 2.576  # the two-sided 99 % normal quantile: how sure the scores must be that a shown wait is not met


class HostWaitFit:
    """How much of the differences in host wait that nodes showed when stages were routed there their tool calls then
    met: the upper end of the 99 % interval (`SLOPE_Z`) of the least-squares slope of the met wait on the shown one,
    within [0, 1] (1 until three scores, two of them different, are in: a wait is charged in full until the scores
    show that it is not met).

    The router charges a node's host-CPU wait (`HostCPU.wait_s`) times this share. The wait shown is what a call
    handed over at routing would meet; the stage's own call comes only after the stage's queueing and service. Where
    the tool calls keep the hosts' workers saturated, a queue persists and the call meets what was shown (slope near
    1); where a backlog is a burst that drains before the call comes, what it meets does not follow what was shown
    (slope near 0), and charging it sends stages to a busier GPU for nothing. A slope, not a ratio: the router compares
    nodes, and a wait every node's calls meet alike moves no choice. Measured, not set: what a live system sees of its
    own hosts."""

    def __init__(self):
        self.num_scored = 0
        self.shown_s = self.met_s = 0.0  # Σ shown, Σ met
        self.shown_s2 = self.met_s2 = self.shown_met_s2 = 0.0  # Σ shown², Σ met², Σ shown·met

    def observe(self, shown_s: float, met_s: float) -> None:
        if shown_s < 0 or met_s < 0:
            raise ValueError(f"waits must be >= 0, got shown {shown_s}, met {met_s}")
        self.num_scored += 1
        self.shown_s += shown_s
        self.met_s += met_s
        self.shown_s2 += shown_s * shown_s
        self.met_s2 += met_s * met_s
        self.shown_met_s2 += shown_s * met_s

    def share(self) -> float:
        n = self.num_scored
        if n < 3:
            return 1.0
        sxx = self.shown_s2 - self.shown_s * self.shown_s / n
        if sxx <= 1e-9 * max(1.0, self.shown_s2):
            return 1.0
        sxy = self.shown_met_s2 - self.shown_s * self.met_s / n
        syy = self.met_s2 - self.met_s * self.met_s / n
        slope = sxy / sxx
        residual_s2 = max(0.0, syy - slope * sxy) / (n - 2)
        return min(1.0, max(0.0, slope + SLOPE_Z * math.sqrt(residual_s2 / sxx)))


class HostWaitFits:
    """A `HostWaitFit` per app, learnt from the app's own routed stages (its stages' length and tool calls set how
    much of a host backlog has drained when its call comes); an app with no scores yet is charged in full."""

    def __init__(self):
        self.by_app: dict[str, HostWaitFit] = {}

    def observe(self, app: str, shown_s: float, met_s: float) -> None:
        self.by_app.setdefault(app, HostWaitFit()).observe(shown_s, met_s)

    def share(self, app: str) -> float:
        fit = self.by_app.get(app)
        return fit.share() if fit is not None else 1.0
