"""Predictor service benchmark against a real `bentoml serve` on 127.0.0.1.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.service.serve --out benchmarks/results/predictor_service.json

First, c8 one-stage /predict p99 against its floor, in interleaved rounds (`--rounds`): the floor is a
bare Starlette route on uvicorn that parses the same body and answers the same shape (`bare_app`, its own
process like the service) plus the in-process predict of one stage (`--quick` stops there). Beside them, the
same BentoML settings, schemas and Guard without the model (benchmarks/service/framework.py): what the
framework alone takes of the floor's budget. Then latency
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
import contextlib
import http.server
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import httpx
import numpy as np

if __name__ == "__main__" and not __package__:
    # Run as a file, this script's own directory comes first on sys.path and its name would shadow
    # the predictor_service package; drop that entry (as `python -m benchmarks.service.serve` does).
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from predictor_service.client import ClientConfig, LocalFallback, PredictorClient, to_wire
from predictor_service.local_server import REPO, LocalServer, ServerConfig, free_port

FRAMEWORK_ONLY = "benchmarks.service.framework:FrameworkOnly"  # the service's BentoML path without the model


def percentiles(latencies_s: list[float]) -> dict:
    ms = np.asarray(latencies_s) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "max_ms": round(float(ms.max()), 2), "num_requests": len(ms)}


async def closed_loop(url: str, route: str, payloads: list[dict], concurrency: int, duration_s: float,
                      client: str = "aiohttp") -> dict:
    """`concurrency` clients, each sending its next request as soon as the last one answered.

    client: "aiohttp" (≈ 0.2 ms of CPU a request: the load generator takes little from the server it
    shares the two cores with) or "httpx" (≈ 1 ms a request: what an httpx-based caller, such as
    `AsyncPredictorClient`, spends itself)."""
    latencies, errors, stages = [], 0, 0
    deadline = time.perf_counter() + duration_s
    bodies = [json.dumps(p).encode() for p in payloads]
    sizes = [len(p["stages"]) for p in payloads]

    async def worker(post, offset: int) -> None:
        nonlocal errors, stages
        i = offset
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            status = await post(bodies[i % len(bodies)])
            latencies.append(time.perf_counter() - started)
            errors += status != 200
            stages += sizes[i % len(sizes)]
            i += concurrency

    async def run(post) -> float:
        started = time.perf_counter()
        await asyncio.gather(*(worker(post, k) for k in range(concurrency)))
        return time.perf_counter() - started

    headers = {"content-type": "application/json"}
    if client == "aiohttp":
        async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=concurrency),
                                         timeout=aiohttp.ClientTimeout(total=30), headers=headers) as http:
            async def post(body: bytes) -> int:
                async with http.post(route, data=body) as response:
                    await response.read()
                    return response.status
            elapsed = await run(post)
    else:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits, headers=headers) as http:
            async def post(body: bytes) -> int:
                return (await http.post(route, content=body)).status_code
            elapsed = await run(post)
    return {**percentiles(latencies), "concurrency": concurrency, "client": client, "errors": errors,
            "requests_per_s": round(len(latencies) / elapsed, 1), "stages_per_s": round(stages / elapsed, 1)}


async def _bare_predict(request):
    """The HTTP floor: parse the body, answer one prediction-shaped object per stage, nothing else."""
    from starlette.responses import JSONResponse

    stages = (await request.json())["stages"]
    return JSONResponse([{"workflow_id": s["workflow_id"], "stage_id": s["stage_id"], "p_tool": 0.5,
                          "tokens_pred": 256, "tokens_reserve": 1024, "fallback_level": "role",
                          "model_version": "bare", "correction": 1.0, "reserve_correction": 1.0,
                          "source": "model"} for s in stages])


def bare_app():
    """A bare Starlette app with POST /predict (uvicorn's --factory target)."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    return Starlette(routes=[Route("/predict", _bare_predict, methods=["POST"])])


@contextlib.contextmanager
def bare_server(timeout_s: float = 180.0):
    """`bare_app` served by uvicorn in its own process (as the service is); yields its URL."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "--factory", "benchmarks.service.serve:bare_app",
               "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"]
    server = subprocess.Popen(command, cwd=REPO)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
    try:
        while not _answers(url):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"the bare route on {url} did not answer within {timeout_s} s")
            time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        return httpx.post(f"{url}/predict", json={"stages": []}, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def warm(url: str, stages: list[dict]) -> None:
    with httpx.Client(base_url=url, timeout=120) as http:
        for start in range(0, len(stages), 64):
            http.post("/predict_unbatched", json={"stages": stages[start:start + 64]}).raise_for_status()


def service_benchmarks(url: str, stages: list[dict], duration_s: float) -> dict:
    singles = [{"stages": [s]} for s in stages]
    batches = [{"stages": stages[i:i + 32]} for i in range(0, len(stages) - 31, 32)]
    run = lambda route, payloads, c, client="aiohttp": asyncio.run(
        closed_loop(url, route, payloads, c, duration_s, client))
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
    return {"rounds": arms, **{f"{arm}_p{q}_ms_median": median(arm, f"p{q}_ms") for arm in arms for q in (50, 99)},
            "p99_over_floor_each": [round(r, 2) for r in over_floor["service"]],
            "p99_over_floor_median": round(float(np.median(over_floor["service"])), 2), "target": 1.5,
            "framework_only_p99_over_floor_each": [round(r, 2) for r in over_floor["framework_only"]],
            "framework_only_p99_over_floor_median": round(float(np.median(over_floor["framework_only"])), 2)}


def in_process_predict(model: str, stages: list[dict]):
    """A callable timing Predictor.predict on one warm stage at a time, no HTTP: the model's share of the floor."""
    from maestro.contract import StageTrace
    from predictor_service import loading

    predictor = loading.load(loading.resolve(model))
    parsed = [StageTrace.model_validate(s) for s in stages]
    predictor.predict(parsed)  # warm: every prompt's embedding is cached

    def measure(n: int = 300) -> dict:
        latencies, cpu_started = [], time.process_time()
        for i in range(n):
            started = time.perf_counter()
            predictor.predict([parsed[i % len(parsed)]])
            latencies.append(time.perf_counter() - started)
        return {**percentiles(latencies), "cpu_ms_per_call": round((time.process_time() - cpu_started) / n * 1000, 2)}
    return measure


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
    return {"timeout_s": timeout_s, "connection_refused": percentiles(refused),
            "hanging_service": percentiles(hung), "within_cooldown": percentiles(cooldown)}


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
    env = {"MAESTRO_MODEL": args.model, "MAESTRO_TRACE_DIR": "off",
           **({"MLFLOW_TRACKING_URI": args.tracking_uri} if args.tracking_uri else {})}
    in_process = in_process_predict(args.model, stages)
    framework = ServerConfig(target=FRAMEWORK_ONLY, log_path="/tmp/predictor_service_bench_framework.log")
    with LocalServer(ServerConfig(env=env, log_path="/tmp/predictor_service_bench.log")) as server, \
            LocalServer(framework) as framework_only, bare_server() as bare_url:
        warm(server.url, stages)
        stats = httpx.get(f"{server.url}/stats").json()
        urls = {"service": server.url, "framework_only": framework_only.url, "bare_route": bare_url}
        results = {"c8_against_floor": against_floor(urls, [{"stages": [s]} for s in stages], in_process,
                                                     args.rounds, args.duration_s)}
        if not args.quick:
            results.update(service_benchmarks(server.url, stages, args.duration_s))
    if not args.quick:
        results["in_process_predict_one_stage"] = in_process()
        results["client_fallback"] = fallback_benchmarks(stages, args.client_timeout_s)
    results["setup"] = {"model": args.model, "model_version": stats["model_version"], "distinct_stages": len(stages),
                        "duration_s_per_point": args.duration_s, "cpus": os.cpu_count(),
                        "load_avg_1m": round(os.getloadavg()[0], 2), "python": platform.python_version(),
                        "server": "bentoml serve, 1 worker, OMP_NUM_THREADS=1",
                        "in_process_omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
