"""Overload: past `max_inflight` calls the service answers 503 + Retry-After at once instead of queueing them;
health probes and /stats are never shed."""

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from predictor_service.client import to_wire
from predictor_service.config import ServiceConfig
from predictor_service.guard import Guard
from predictor_service.local_server import LocalServer, ServerConfig


def held_app(release: asyncio.Event) -> Starlette:
    """/predict waits for `release`; /observe answers 503 as BentoML's batcher does (no Retry-After)."""

    async def predict(_):
        await release.wait()
        return PlainTextResponse("ok")

    async def busy(_):
        return JSONResponse({"error": "process is overloaded"}, status_code=503)

    async def probe(_):
        return PlainTextResponse("ok")

    return Starlette(
        routes=[
            Route("/predict", predict, methods=["POST"]),
            Route("/observe", busy, methods=["POST"]),
            *(Route(path, probe) for path in ("/livez", "/readyz", "/stats")),
        ]
    )


def test_calls_past_max_inflight_get_503_with_retry_after_and_probes_pass():
    async def run():
        release = asyncio.Event()
        guard = Guard(held_app(release), ServiceConfig(model="m", max_inflight=2))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(guard), base_url="http://svc") as client:
            held = [asyncio.create_task(client.post("/predict")) for _ in range(2)]
            while guard.num_inflight < 2:
                await asyncio.sleep(0.01)
            shed = await client.post("/predict")
            probes = [(await client.get(path)).status_code for path in ("/livez", "/readyz", "/stats")]
            release.set()
            done = [r.status_code for r in await asyncio.gather(*held)]
            after, inner = await client.post("/predict"), await client.post("/observe")
        return shed, probes, done, after, inner, guard.num_inflight

    shed, probes, done, after, inner, num_inflight = asyncio.run(run())
    assert shed.status_code == 503 and shed.headers["Retry-After"] == "1"
    assert "limit of 2 calls in flight (MAESTRO_MAX_INFLIGHT)" in shed.json()["error"]
    assert probes == [200, 200, 200] and done == [200, 200] and after.status_code == 200 and num_inflight == 0
    assert inner.status_code == 503 and inner.headers["Retry-After"] == "1"


def test_max_inflight_is_read_from_the_environment_and_checked():
    assert ServiceConfig.from_env({"MAESTRO_MAX_INFLIGHT": "8"}).max_inflight == 8
    assert ServiceConfig.from_env({}).max_inflight == 64
    with pytest.raises(ValueError, match="MAESTRO_MAX_INFLIGHT"):
        ServiceConfig.from_env({"MAESTRO_MAX_INFLIGHT": "-1"})


@pytest.mark.slow
def test_a_real_service_sheds_a_burst_with_503_and_stays_ready(model_dir, sample_records, tmp_path):
    """`bentoml serve` with MAESTRO_MAX_INFLIGHT=2 and 24 calls of 256 stages at once: some are answered, the rest
    get 503 + Retry-After, nothing else; /livez and /readyz answer 200 during the burst."""
    body = {"stages": [to_wire(r) for r in (sample_records * 2)[:256]]}
    env = {"MAESTRO_MODEL": str(model_dir), "MAESTRO_TRACE_DIR": "off", "MAESTRO_MAX_INFLIGHT": "2"}

    async def burst(url: str):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            calls = [asyncio.create_task(client.post("/predict_unbatched", json=body)) for _ in range(24)]
            await asyncio.sleep(0.2)
            probes = [(await client.get(path)).status_code for path in ("/livez", "/readyz")]
            return await asyncio.gather(*calls), probes

    with LocalServer(ServerConfig(env=env, log_path=str(tmp_path / "server.log"))) as server:
        responses, probes = asyncio.run(burst(server.url))
    statuses = [r.status_code for r in responses]
    assert probes == [200, 200] and set(statuses) == {200, 503}, statuses
    assert all(r.headers.get("Retry-After") == "1" for r in responses if r.status_code == 503)
