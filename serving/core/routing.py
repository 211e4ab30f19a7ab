"""Node selection: S(N,T) = A(N,T) − λ·T_ready − μ·C_deg over robustly scaled terms.

A is availability (higher is better), T_ready the seconds until the node could start the stage (model transition +
queued work, the latter times the delay routed stages met per second of it, `GpuDelayFit`) and serve its session's
tool calls (where tools run on the node's host CPU, as in the simulator, the wait for a core there times the share of
it routed stages' calls have been seen to meet, `HostWaitFit`: a routed session stays on its node; the gateway's tools
run at the client, so none adds there, and its T_ready is one term, which no scale moves), C_deg the degradation the
node would suffer (KV shortfall, models it would have to push out). Each term is clipped at its 5th/95th percentiles,
so one outlier node cannot dominate (the seed's choice), and scaled by its spread over the candidates; λ = μ = 1. A and
C_deg are shares (of the node's KV, of the stage's need), so their spread is taken as at least
`FitnessConfig.share_span` (1): nodes whose free KV differs by 2 % differ by 0.02 in A, not by a whole unit against
seconds of T_ready. (The seed min-max scales every term; `share_span=0` is that: on a KV-bound long-context workload
it sent sessions to nodes with a sliver more free KV but more work queued — docs/routing.md.)
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


class SlopeFit:
    """The least-squares slope of what routed stages met on what their node showed when they were routed there, one
    score at a time."""

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

    def slope(self) -> tuple[float, float] | None:
        """(the slope, its standard error); None until three scores, two of them different, are in."""
        n = self.num_scored
        if n < 3:
            return None
        sxx = self.shown_s2 - self.shown_s * self.shown_s / n
        if sxx <= 1e-9 * max(1.0, self.shown_s2):
            return None
        sxy = self.shown_met_s2 - self.shown_s * self.met_s / n
        syy = self.met_s2 - self.met_s * self.met_s / n
        slope = sxy / sxx
        return slope, math.sqrt(max(0.0, syy - slope * sxy) / (n - 2) / sxx)


class HostWaitFit(SlopeFit):
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

    def share(self) -> float:
        fit = self.slope()
        return 1.0 if fit is None else min(1.0, max(0.0, fit[0] + SLOPE_Z * fit[1]))


class GpuDelayFit(SlopeFit):
    """Seconds of delay routed stages met per second of T_ready's GPU part their node showed: the least-squares slope
    of the delay (routing to the end of the LLM call, less the call's service on an idle GPU) on the GPU part shown,
    at least 0 (1 until three scores, two of them different, are in: the GPU part is charged as computed).

    The GPU part is the node's work ahead over the batch width (`SimSlot.gpu_work_s`): a count of the work, not of
    what it does to a stage that joins it. Where every running stage holds a long context, each one more slows every
    step, and a stage on a busier node meets many times the work shown (slope ≫ 1); where contexts are short a
    wide batch absorbs it. Scaled by what was met, the GPU part weighs against the host wait (`HostWaitFit`, also in
    met seconds) as the two cost the stages of that app. Measured, not set: a live system sees when its calls end."""

    def scale(self) -> float:
        fit = self.slope()
        return 1.0 if fit is None else max(0.0, fit[0])


class _FitsByApp:
    """A fit per app, learnt from the app's own routed stages (their lengths and tool calls set what of a node's
    backlog they meet)."""

    fit_type: type[SlopeFit] = SlopeFit

    def __init__(self):
        self.by_app: dict[str, SlopeFit] = {}

    def observe(self, app: str, shown_s: float, met_s: float) -> None:
        self.by_app.setdefault(app, self.fit_type()).observe(shown_s, met_s)


class HostWaitFits(_FitsByApp):
    """`HostWaitFit` per app; an app with no scores yet is charged in full."""

    fit_type = HostWaitFit

    def share(self, app: str) -> float:
        fit = self.by_app.get(app)
        return fit.share() if fit is not None else 1.0


class GpuDelayFits(_FitsByApp):
    """`GpuDelayFit` per app, and the stages routed but not yet ended (the GPU part shown, when)."""

    fit_type = GpuDelayFit

    def __init__(self):
        super().__init__()
        self.pending: dict[int, tuple[str, float, float]] = {}  # id(stage) → (app, GPU part shown, routed at)

    def routed(self, job, app: str, shown_s: float, now: float) -> None:
        self.pending[id(job)] = (app, shown_s, now)

    def ended(self, job, now: float, idle_service_s: float) -> None:
        """The LLM call of a routed stage ended at `now`; it would have taken `idle_service_s` on an idle GPU."""
        entry = self.pending.pop(id(job), None)
        if entry is not None:
            app, shown_s, routed_s = entry
            self.observe(app, shown_s, max(0.0, now - routed_s - idle_service_s))

    def scale(self, app: str) -> float:
        fit = self.by_app.get(app)
        return fit.scale() if fit is not None else 1.0
