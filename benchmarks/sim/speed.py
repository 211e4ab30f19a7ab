"""Simulator benchmark: events/s at small scale, and the wall time of the 64-node maestro-paper run.

    .venv/bin/python benchmarks/sim/speed.py --out benchmarks/results/simulator.json [--skip-64]

The 64-node run is the issue's target (< 10 min on 2 cores, ≥ 100k stages); it runs EDF and
Maestro on the same workload and reports stages, events, events/s and wall time per policy.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from serving.core.systems import get_system
from serving.sim.engine import Simulator
from serving.sim.runner import RunConfig, build_workload
from serving.sim.scenarios import get_scenario
from serving.sim.workload import reset


def bench(nodes: int, policies: tuple[str, ...], num_workflows: int | None = None) -> dict:
    started = time.perf_counter()
    scenario = get_scenario("maestro-paper", nodes)
    scenario.cluster.show_progress = False
    workflows = build_workload(scenario, RunConfig(policies=policies, num_workflows=num_workflows), scenario.regimes[0])
    out = {
        "nodes": nodes,
        "num_workflows": len(workflows),
        "num_stages": sum(len(w.stages) for w in workflows),
        "build_s": time.perf_counter() - started,
        "policies": {},
    }
    for name in policies:
        reset(workflows)
        t0 = time.perf_counter()
        sim = Simulator(scenario.cluster, get_system(name), workflows)
        sim.run()
        wall = time.perf_counter() - t0
        out["policies"][name] = {
            "wall_s": round(wall, 2),
            "num_events": sim.num_events,
            "events_per_s": round(sim.num_events / wall),
        }
    out["total_wall_s"] = round(time.perf_counter() - started, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/simulator.json")
    parser.add_argument("--skip-64", action="store_true", help="only the small run")
    args = parser.parse_args()
    results = {"small_8_nodes": bench(8, ("edf", "maestro"), 2000)}
    if not args.skip_64:
        results["maestro_paper_64_nodes"] = bench(64, ("edf", "maestro"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
