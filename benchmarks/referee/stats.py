"""Intervals for the referee: paired, seed-stratified cluster bootstrap over workflows.

Per seed, every arm replays the same workflows; a replay cycles each held-out workflow many times, so the unit of
resampling is the held-out workflow (all its copies together: a cluster), drawn with replacement within each seed.
One draw weights every arm alike (paired), each statistic is computed per seed and averaged over seeds, and the 95 %
interval is the 2.5–97.5 percentile of the draws. An abandoned or unfinished workflow counts as a miss and as +∞ in
latency percentiles; a percentile that lands on +∞ is reported as null. Folds are pooled (`pool`) seed by seed,
each fold's held-out workflows clusters of their own, so one interval covers every fold's workflows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Outcomes:
    """One arm's run on one seed: per replayed workflow, whether it met its SLO and its latency (inf: unfinished)."""

    met: np.ndarray
    e2e_s: np.ndarray
    clusters: np.ndarray  # index of the held-out workflow each replayed one copies
    extra: dict  # per-run counters (preemptions, demotions, ...)


def mean_counters(runs: list[Outcomes]) -> dict[str, float | None]:
    """Counters over several runs (an arm's seeds, or one seed's folds): each the mean over the runs that counted it,
    None where none did (a fold whose family has no interactive turn counts no turns); what is no number (a run's
    decision log) is left out."""
    means = {}
    for key in dict.fromkeys(k for o in runs for k in o.extra):
        values = [o.extra.get(key) for o in runs]
        numbers = [v for v in values if isinstance(v, int | float | np.number)]
        if numbers or all(v is None for v in values):
            means[key] = float(np.mean(numbers)) if numbers else None
    return means


def draw_weights(clusters: np.ndarray, draws: int, rng: np.random.Generator) -> np.ndarray:
    """(draws, rows) weights: each row's cluster drawn that many times."""
    n = int(clusters.max()) + 1
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=draws)  # (draws, clusters)
    return counts[:, clusters].astype(float)


def attainment(o: Outcomes, weights: np.ndarray) -> np.ndarray:
    return weights @ o.met.astype(float) / weights.sum(axis=1)


def weighted_p95(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    sorted_values, cum = values[order], np.cumsum(weights[:, order], axis=1)
    index = (cum < 0.95 * cum[:, -1:]).sum(axis=1)
    return sorted_values[np.minimum(index, len(values) - 1)]


STATS = {
    "slo_attainment": attainment,
    "e2e_p95_s": lambda o, w: weighted_p95(o.e2e_s, w),
    # over the workflows that finished only (an unfinished one weighs nothing; null if none finished)
    "served_p95_s": lambda o, w: weighted_p95(o.e2e_s, w * np.isfinite(o.e2e_s)),
}


def interval(point: float, draws: np.ndarray) -> dict:
    def clean(x: float) -> float | None:
        return None if not np.isfinite(x) else round(float(x), 4)

    lo, hi = np.percentile(draws, [2.5, 97.5]) if not np.isnan(draws).any() else (np.nan, np.nan)
    return {"mean": clean(point), "lo": clean(lo), "hi": clean(hi)}


def summarize(
    by_arm: dict[str, list[Outcomes]], pairs: list[tuple[str, str]], draws: int = 1000, seed: int = 0
) -> tuple[dict, dict]:
    """`by_arm[arm][s]`: the arm's outcomes on seed s. Returns (results, differences), each statistic as
    {mean, lo, hi}."""
    rng = np.random.default_rng(seed)
    arms = list(by_arm)
    seeds = len(next(iter(by_arm.values())))
    weights = [draw_weights(by_arm[arms[0]][s].clusters, draws, rng) for s in range(seeds)]
    ones = [np.ones((1, len(by_arm[arms[0]][s].met))) for s in range(seeds)]
    point, boot = {}, {}
    for arm in arms:
        for name, stat in STATS.items():
            point[arm, name] = float(np.mean([stat(by_arm[arm][s], ones[s])[0] for s in range(seeds)]))
            boot[arm, name] = np.mean([stat(by_arm[arm][s], weights[s]) for s in range(seeds)], axis=0)
    results = {arm: {name: interval(point[arm, name], boot[arm, name]) for name in STATS} for arm in arms}
    differences = {}
    with np.errstate(invalid="ignore"):  # inf − inf (both p95s unfinished) is nan, reported as null
        for a, b in pairs:
            if a in by_arm and b in by_arm:
                differences[f"{a} - {b}"] = {
                    name: interval(point[a, name] - point[b, name], boot[a, name] - boot[b, name]) for name in STATS
                }
    return results, differences


def pool(runs: list[Outcomes]) -> Outcomes:
    """Several replays (one per fold, same seed) as one: their workflows side by side, each fold's held-out
    workflows clusters of their own, each counter the mean over the runs that counted it (`mean_counters`: a run's
    count, as for one fold)."""
    offsets = np.cumsum([0] + [int(o.clusters.max()) + 1 for o in runs[:-1]])
    return Outcomes(
        np.concatenate([o.met for o in runs]),
        np.concatenate([o.e2e_s for o in runs]),
        np.concatenate([o.clusters + offset for o, offset in zip(runs, offsets)]),
        mean_counters(runs),
    )


def pool_grids(grids: list[dict[str, dict[str, list[Outcomes]]]], rates: list[list[float]], keys: list[str]) -> dict:
    """`grids[f][str(rate)][arm][seed]` and `rates[f]`, one per fold, each fold with as many rates as `keys`: the
    folds pooled by rate index (every fold's i-th rate under `keys[i]`; two rates of a fold may be one run), seed by
    seed."""
    pooled = {}
    for index, key in enumerate(keys):
        rows = [grid[str(fold_rates[index])] for grid, fold_rates in zip(grids, rates)]
        pooled[key] = {
            arm: [pool([row[arm][seed] for row in rows]) for seed in range(len(runs))] for arm, runs in rows[0].items()
        }
    return pooled
