"""The floor benchmarks/service/serve.py holds a service call against: a bare Starlette route on uvicorn that parses
the same body and answers the same shape (`bare_app`, in its own process as the service is), plus the in-process
predict of one stage (the model's share, no HTTP)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import httpx

from benchmarks.service.load import percentiles
from predictor_service.local_server import REPO, free_port


async def _bare_predict(request):
    """The HTTP floor: parse the body, answer one prediction-shaped object per stage, nothing else."""
    from starlette.responses import JSONResponse

    stages = (await request.json())["stages"]
    return JSONResponse(
        [
            {
                "workflow_id": s["workflow_id"],
                "stage_id": s["stage_id"],
                "p_tool": 0.5,
                "tokens_pred": 256,
                "tokens_reserve": 1024,
                "fallback_level": "role",
                "model_version": "bare",
                "correction": 1.0,
                "reserve_correction": 1.0,
                "source": "model",
            }
            for s in stages
        ]
    )


def bare_app():
    """A bare Starlette app with POST /predict (uvicorn's --factory target)."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    return Starlette(routes=[Route("/predict", _bare_predict, methods=["POST"])])


@contextlib.contextmanager
def bare_server(timeout_s: float = 180.0):
    """`bare_app` served by uvicorn in its own process (as the service is); yields its URL."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "benchmarks.service.floor:bare_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-access-log",
        "--log-level",
        "warning",
    ]
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
