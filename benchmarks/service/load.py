"""The service benchmark's load generator (benchmarks/service/serve.py): closed-loop clients on one HTTP route, and
the latency percentiles it reports."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import httpx
import numpy as np


def percentiles(latencies_s: list[float]) -> dict:
    ms = np.asarray(latencies_s) * 1000
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
        "num_requests": len(ms),
    }


async def closed_loop(
    url: str, route: str, payloads: list[dict], concurrency: int, duration_s: float, client: str = "aiohttp"
) -> dict:
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
        async with aiohttp.ClientSession(
            url,
            connector=aiohttp.TCPConnector(limit=concurrency),
            timeout=aiohttp.ClientTimeout(total=30),
            headers=headers,
        ) as http:

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
    return {
        **percentiles(latencies),
        "concurrency": concurrency,
        "client": client,
        "errors": errors,
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "stages_per_s": round(stages / elapsed, 1),
    }
