"""Predictor service benchmark against a real `bentoml serve` on 127.0.0.1.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.service.serve --out benchmarks/results/predictor_service.json

First, c8 one-stage /predict p99 against its floor, in interleaved rounds (`--rounds`): the floor is a
bare Starlette route on uvicorn that parses the same body and answers the same shape (`bare_app`, its own
process like the service) plus the in-process predict of one stage (benchmarks/service/floor.py; `--quick`
stops there). Beside them, the same BentoML settings, schemas and Guard without the model
(benchmarks/service/framework.py): what the framework alone takes of the floor's budget. Then latency
p50/p99 of one-stage /predict at concurrency 1, 8, 32 (closed loop, caches warm: every prompt was
predicted once before timing, so its embedding is cached); throughput of one-stage
requests with adaptive batching (/predict) and without (/predict_unbatched), and of client-side
batches; the client's fallback latency when the service is down or hangs. The load generator
shares the machine's two cores with the server, as a scheduler on the same node would; it is aiohttp
(≈ 0.2 ms of CPU a request), and c8 is measured once more with httpx (≈ 1 ms a request) beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

if __name__ == "__main__" and not __package__:
    # Run as a file, this script's own directory comes first on sys.path and its name would shadow
    # the predictor_service package; drop that entry, and put the repository first so that benchmarks/
    # imports (as `python -m benchmarks.service.serve` has it).
    here = Path(__file__).resolve().parent
    sys.path[:] = [str(here.parents[1])] + [p for p in sys.path if Path(p or ".").resolve() != here]

from benchmarks.service.floor import bare_server, in_process_predict
from benchmarks.service.load import closed_loop, percentiles
from predictor_service.client import ClientConfig, LocalFallback, PredictorClient, to_wire
from predictor_service.local_server import LocalServer, ServerConfig, free_port

FRAMEWORK_ONLY = "benchmarks.service.framework:FrameworkOnly"  # the service's BentoML path without the model


def warm(url: str, stages: list[dict]) -> None:
    with httpx.Client(base_url=url, timeout=120) as http:
        for start in range(0, len(stages), 64):
            http.post("/predict_unbatched", json={"stages": stages[start : start + 64]}).raise_for_status()


def service_benchmarks(url: str, stages: list[dict], duration_s: float) -> dict:
    singles = [{"stages": [s]} for s in stages]
    batches = [{"stages": stages[i : i + 32]} for i in range(0, len(stages) - 31, 32)]
    run = lambda route, payloads, c, client="aiohttp": asyncio.run(
        closed_loop(url, route, payloads, c, duration_s, client)
    )
    out = {"latency_one_stage": {f"c{c}": run("/predict", singles, c) for c in (1, 8, 32)}}
    out["latency_one_stage_httpx_load_generator"] = {"c8": run("/predict", singles, 8, "httpx")}
    out["latency_one_stage_unbatched"] = {f"c{c}": run("/predict_unbatched", singles, c) for c in (1, 8, 32)}
    out["throughput"] = {
        "adaptive_batching_c32_one_stage": out["latency_one_stage"]["c32"]["stages_per_s"],
        "no_batching_c32_one_stage": out["latency_one_stage_unbatched"]["c32"]["stages_per_s"],
        "client_batches_of_32_c4": run("/predict_unbatched", batches, 4)["stages_per_s"],
    }
    return out


def against_floor(urls: dict[str, str], singles: list[dict], in_process, rounds: int, duration_s: float) -> dict:
    """c8 one-stage /predict p99 against its floor, bare route p99 + in-process predict p99, in interleaved
    rounds (service, framework only, bare route, in process, back to back) so that a shared box's swings hit
    all alike. `urls`: the service, the framework-only service and the bare route, by arm name."""
    arms = {"service": [], "framework_only": [], "bare_route": [], "in_process": []}
    for _ in range(rounds):
        for arm in ("service", "framework_only", "bare_route"):
            arms[arm].append(asyncio.run(closed_loop(urls[arm], "/predict", singles, 8, duration_s)))
        arms["in_process"].append(in_process())
    floors = [b["p99_ms"] + i["p99_ms"] for b, i in zip(arms["bare_route"], arms["in_process"])]
    over_floor = {arm: [r["p99_ms"] / f for r, f in zip(arms[arm], floors)] for arm in ("service", "framework_only")}
    median = lambda arm, key: round(float(np.median([r[key] for r in arms[arm]])), 2)
    return {
        "rounds": arms,
        **{f"{arm}_p{q}_ms_median": median(arm, f"p{q}_ms") for arm in arms for q in (50, 99)},
        "p99_over_floor_each": [round(r, 2) for r in over_floor["service"]],
        "p99_over_floor_median": round(float(np.median(over_floor["service"])), 2),
        "target": 1.5,
        "framework_only_p99_over_floor_each": [round(r, 2) for r in over_floor["framework_only"]],
        "framework_only_p99_over_floor_median": round(float(np.median(over_floor["framework_only"])), 2),
    }


class _Hanging(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        time.sleep(5)

    def log_message(self, *args):
        pass


def fallback_benchmarks(stages: list[dict], timeout_s: float, n: int = 200) -> dict:
    """Client answers when nothing listens (connection refused) and when the service hangs."""

    def timed(client: PredictorClient, count: int) -> list[float]:
        out = []
        for i in range(count):
            started = time.perf_counter()
            answers = client.predict([stages[i % len(stages)]])
            out.append(time.perf_counter() - started)
            assert answers[0].source == "local-fallback"
        return out

    down = ClientConfig(url=f"http://127.0.0.1:{free_port()}", timeout_s=timeout_s, cooldown_s=0)
    with PredictorClient(down, LocalFallback()) as client:
        refused = timed(client, n)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hanging)
    server.daemon_threads = True  # closing must not wait for the handlers still sleeping
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hanging = ClientConfig(url=f"http://127.0.0.1:{server.server_address[1]}", timeout_s=timeout_s, cooldown_s=0)
    with PredictorClient(hanging, LocalFallback()) as client:
        hung = timed(client, 10)
    server.shutdown()
    server.server_close()
    cooled = ClientConfig(url=down.url, timeout_s=timeout_s, cooldown_s=60)
    with PredictorClient(cooled, LocalFallback()) as client:
        client.predict([stages[0]])
        cooldown = timed(client, n)
    return {
        "timeout_s": timeout_s,
        "connection_refused": percentiles(refused),
        "hanging_service": percentiles(hung),
        "within_cooldown": percentiles(cooldown),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/predictor", help="predictor directory or models:/ URI to serve")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--stages", type=int, default=256, help="distinct stages cycled through")
    parser.add_argument("--duration-s", type=float, default=8.0, help="per measurement")
    parser.add_argument("--client-timeout-s", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of c8 against the floor")
    parser.add_argument("--quick", action="store_true", help="c8 one-stage /predict against its floor only")
    parser.add_argument("--out", default="benchmarks/results/predictor_service.json")
    args = parser.parse_args()
    from pipelines.synth import generate

    stages = [to_wire(r) for r in generate(args.stages, seed=123)][: args.stages]
    env = {
        "MAESTRO_MODEL": args.model,
        "MAESTRO_TRACE_DIR": "off",
        **({"MLFLOW_TRACKING_URI": args.tracking_uri} if args.tracking_uri else {}),
    }
    in_process = in_process_predict(args.model, stages)
    framework = ServerConfig(target=FRAMEWORK_ONLY, log_path="/tmp/predictor_service_bench_framework.log")
    with (
        LocalServer(ServerConfig(env=env, log_path="/tmp/predictor_service_bench.log")) as server,
        LocalServer(framework) as framework_only,
        bare_server() as bare_url,
    ):
        warm(server.url, stages)
        stats = httpx.get(f"{server.url}/stats").json()
        urls = {"service": server.url, "framework_only": framework_only.url, "bare_route": bare_url}
        results = {
            "c8_against_floor": against_floor(
                urls, [{"stages": [s]} for s in stages], in_process, args.rounds, args.duration_s
            )
        }
        if not args.quick:
            results.update(service_benchmarks(server.url, stages, args.duration_s))
    if not args.quick:
        results["in_process_predict_one_stage"] = in_process()
        results["client_fallback"] = fallback_benchmarks(stages, args.client_timeout_s)
    results["setup"] = {
        "model": args.model,
        "model_version": stats["model_version"],
        "distinct_stages": len(stages),
        "duration_s_per_point": args.duration_s,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "server": "bentoml serve, 1 worker, OMP_NUM_THREADS=1",
        "in_process_omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
