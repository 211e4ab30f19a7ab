"""Serving-core micro-benchmarks: scheduler decisions/s at 10k and 100k queued stages; allocator ops/s.

    .venv/bin/python benchmarks/core/ops.py --out benchmarks/results/serving_core.json

A "decision" is one pop of the next stage plus one add of a new stage (the queue stays at size n).
Allocator ops are reserve / grow / release on the host backend (benchmarks/core/kv_vmm.py runs the same mix on a GPU).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from serving.core.kv import KVAllocator, KVAllocatorConfig
from serving.core.request import StageRequest
from serving.core.scheduler import Policy, create_scheduler


def _requests(n: int, rng: np.random.Generator) -> list[StageRequest]:
    return [
        StageRequest(
            f"w{i}",
            "0",
            interactive=bool(i % 3 == 0),
            ready_s=float(i),
            deadline_s=float(rng.uniform(0, 1e4)),
            prompt_tokens=int(rng.integers(10, 60000)),
            pred_service_s=float(rng.exponential(5)),
            workflow_remaining_s=float(rng.exponential(20)),
            attained_service_s=float(rng.exponential(10)),
        )
        for i in range(n)
    ]


def bench_scheduler(policy: str, queued: int, decisions: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    scheduler = create_scheduler(policy)
    for r in _requests(queued, rng):
        scheduler.add(r, 0.0)
    fresh = _requests(decisions, rng)
    started = time.perf_counter()
    for i, r in enumerate(fresh):
        scheduler.pop(float(i))
        r.ready_s = float(queued + i)
        scheduler.add(r, float(i))
    return decisions / (time.perf_counter() - started)


def bench_allocator(num_ops: int, seed: int = 0, backend: str = "host") -> float:
    rng = np.random.default_rng(seed)
    kv = KVAllocator(KVAllocatorConfig(pool_bytes=32 * 1024**3, backend=backend))
    live, ops = [], 0
    started = time.perf_counter()
    while ops < num_ops:
        if len(live) < 200 and (not live or rng.random() < 0.5):
            r = kv.reserve(int(rng.integers(100, 3000)), 8192, 131072)
            if r is not None:
                live.append(r)
        elif rng.random() < 0.5:
            kv.grow(live[int(rng.integers(len(live)))], int(rng.integers(100, 8192)))
        else:
            kv.release(live.pop(int(rng.integers(len(live)))))
        ops += 1
    return num_ops / (time.perf_counter() - started)


def write_results(results: dict, out: str) -> None:
    """The benchmark's JSON, to `out` and to stdout."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/serving_core.json")
    parser.add_argument("--decisions", type=int, default=50000)
    args = parser.parse_args()
    results = {
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "scheduler_decisions_per_s": {},
        "allocator_ops_per_s": round(bench_allocator(200000)),
    }
    for policy in (p.value for p in Policy):
        results["scheduler_decisions_per_s"][policy] = {
            str(n): round(bench_scheduler(policy, n, args.decisions)) for n in (10_000, 100_000)
        }
    write_results(results, args.out)


if __name__ == "__main__":
    main()
