"""The referee's folds: what each fold's sides and SLOs were, and the folds pooled into the top-level figures.

A fold of `--folds family` replays one app family with the predictor trained on the other families
(`sides.split_model`) and the family's per-app SLOs declared from its calibration tasks (`sides.family_split`,
`SLOTable.declared`); `--folds K` task folds fix every SLO on their train side. Each fold's JSON says which
(`split`, `sides`, `slo_source`, `model`); `pooled` puts every fold's i-th rate under one key.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from benchmarks.referee.grid import RATE_TARGETS
from benchmarks.referee.sides import CALIBRATION_FRACTION, Split
from benchmarks.referee.stats import pool_grids
from maestro.contract import StageTrace, task_id


def side_record(stages: list[StageTrace]) -> dict:
    """A side's apps and sizes, for the JSON."""
    return {
        "apps": sorted({str(s.app) for s in stages}),
        "num_tasks": len({task_id(s) for s in stages}),
        "num_workflows": len({s.workflow_id for s in stages}),
        "num_stages": len(stages),
    }


def slo_source(split: Split) -> dict:
    """Where the split's SLOs come from: the train side's apps from the train side, the others from calibration."""
    train_apps = {str(s.app) for s in split.train}
    source = {"train side": sorted(train_apps & {str(s.app) for s in split.test})}
    if split.calibration:
        source["calibration"] = sorted({str(s.app) for s in split.calibration} - train_apps)
    return {
        "by_apps": source,
        "rule": "scale × the median unloaded latency of the app's workflows of that class on its source side "
        "(serving.sim.slo.SLOTable)",
        "calibration": (
            f"the owner's pilot: {CALIBRATION_FRACTION:.0%} of the replayed family's tasks by a salted hash of the "
            "task id, never replayed nor trained on"
            if split.calibration
            else None
        ),
        "otherwise": "the train side's global SLO (scale × the median over every training workflow)",
    }


def sides_record(split: Split) -> dict:
    return {
        "train": side_record(split.train),
        "calibration": side_record(split.calibration),
        "test": side_record(split.test),
    }


def pooled(runs: list[dict], grids: list[dict], keys: list[str] | None, figures: Callable, slo_scale: float) -> dict:
    """The folds pooled by rate index: top-level figures over every fold's workflows, and how they were pooled.
    `keys`: the pooled rates' names (None: `RATE_TARGETS`, each fold having found its own rates); `figures(grid,
    ceiling)`: a grid's JSON figures."""
    keys = list(RATE_TARGETS) if keys is None else keys
    ceiling = round(float(np.mean([next(iter(r["results"].values()))["ceiling"] for r in runs])), 4)
    figures_pooled = figures(pool_grids(grids, [r["rates"] for r in runs], keys), ceiling)
    return {
        "slo": {"mode": "per-app, per fold (folds[*].slo, folds[*].slo_source)", "scale": slo_scale},
        "rates": keys,
        "tool_times": runs[0]["tool_times"],
        "num_test_workflows": sum(r["num_test_workflows"] for r in runs),
        **figures_pooled,
        "pooled": {
            "by": "rate index: each fold's i-th rate pooled under rates[i] (with --rates auto each fold finds its own "
            "rates: light, knee, past, heavy); attainment over every fold's workflows, each fold's held-out "
            "workflows clusters of the bootstrap; counters: the mean run over folds",
            "rates_by_fold": {key: {r["split"]: r["rates"][i] for r in runs} for i, key in enumerate(keys)},
            "ceiling_by_fold": {r["split"]: next(iter(r["results"].values()))["ceiling"] for r in runs},
            **figures_pooled,
        },
    }
