"""Arrival processes: Poisson, bursty (two-state MMPP), or replayed from a real trace file.

Replay reads Azure LLM traces (CSV with TIMESTAMP) or Mooncake traces (JSONL with `timestamp` in
ms), takes inter-arrival gaps from the file, and rescales them to the requested mean rate when
one is given (the shape of the process is kept, its level is set by the scenario). The file is
given by path; nothing here knows where ../shared is.
"""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path

import numpy as np


def poisson(num: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    return np.cumsum(rng.exponential(1.0 / rate_per_s, size=num))


def bursty(
    num: int,
    rate_per_s: float,
    rng: np.random.Generator,
    burst_factor: float = 4.0,
    burst_frac: float = 0.2,
    mean_period_s: float = 60.0,
) -> np.ndarray:
    """MMPP-2: bursts at burst_factor × the base rate for burst_frac of the time, same mean rate."""
    base = rate_per_s / (burst_frac * burst_factor + (1 - burst_frac))
    times, t, in_burst = [], 0.0, False
    switch = rng.exponential(mean_period_s * (1 - burst_frac))
    while len(times) < num:
        rate = base * (burst_factor if in_burst else 1.0)
        gap = rng.exponential(1.0 / rate)
        if t + gap > switch:
            t, in_burst = switch, not in_burst
            switch = t + rng.exponential(mean_period_s * (burst_frac if in_burst else 1 - burst_frac))
            continue
        t += gap
        times.append(t)
    return np.array(times)


def read_timestamps_s(path: str | Path) -> np.ndarray:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"arrival trace {path} does not exist")
    if path.suffix == ".csv":
        with path.open() as handle:
            rows = csv.DictReader(handle)
            stamps = [datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp() for r in rows]
    else:
        with path.open() as handle:
            stamps = [json.loads(line)["timestamp"] / 1000.0 for line in handle if line.strip()]
    if len(stamps) < 2:
        raise ValueError(f"{path}: need at least two timestamps to replay arrivals")
    stamps = np.sort(np.array(stamps, dtype=float))
    return stamps - stamps[0]


def replay(path: str | Path, num: int, rate_per_s: float | None = None) -> np.ndarray:
    """`num` arrival times with the file's gaps (looped if needed), rescaled to `rate_per_s` if given."""
    gaps = np.diff(read_timestamps_s(path))
    gaps = np.tile(gaps, -(-num // len(gaps)))[:num]
    if rate_per_s:
        gaps = gaps * (1.0 / rate_per_s) / max(gaps.mean(), 1e-9)
    return np.cumsum(gaps)


def arrival_times(kind: str, num: int, rate_per_s: float, seed: int) -> np.ndarray:
    """`kind` is "poisson", "bursty", or a path to a trace file to replay."""
    rng = np.random.default_rng(seed)
    if kind == "poisson":
        return poisson(num, rate_per_s, rng)
    if kind == "bursty":
        return bursty(num, rate_per_s, rng)
    if Path(kind).suffix in (".csv", ".jsonl"):
        return replay(kind, num, rate_per_s)
    raise ValueError(f"unknown arrival process '{kind}'; use poisson, bursty or a .csv/.jsonl trace path")
