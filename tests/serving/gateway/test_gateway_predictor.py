"""The gateway with the real predictor service: in process through to_asgi(), and behind `bentoml serve` (slow).

vLLM is faked here (conftest's vLLM-like handlers); what is real is the predictor side: the
service, its AsyncPredictorClient, /predict answers from a trained model and /observe taking
the gateway's finished stages.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from maestro.contract import StageTrace
from pipelines.collect import collect
from pipelines.features import FeaturizerConfig
from pipelines.model import ModelConfig
from pipelines.predictor import Predictor
from pipelines.synth import generate
from predictor_service.async_client import AsyncPredictorClient
from predictor_service.client import ClientConfig
from predictor_service.local_server import LocalServer, ServerConfig
from serving.gateway.http_predictor import HttpPredictor

from .conftest import run_app

FAST_MODEL = ModelConfig(
    folds=3, classifier=dict(n_estimators=40, learning_rate=0.1), regressor=dict(n_estimators=80, learning_rate=0.1)
)
ROLES = ("planner", "coder", "planner")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A small two-stage predictor without embeddings (trains in seconds)."""
    stages = [StageTrace.model_validate(r) for r in generate(300, seed=11)]
    model = Predictor.train(stages, FeaturizerConfig(use_embedding=False), FAST_MODEL)
    return model.save(tmp_path_factory.mktemp("model") / "predictor")


def service_env(model_dir, root) -> dict:
    return {"MAESTRO_MODEL": str(model_dir), "MAESTRO_TRACE_DIR": str(root / "observed")}


async def three_stages(client, gateway) -> list[httpx.Response]:
    responses = []
    for i, role in enumerate(ROLES):
        headers = {
            "X-Maestro-Workflow": "w",
            "X-Maestro-Stage": str(i),
            "X-Maestro-Role": role,
            "X-Maestro-Parents": str(i - 1) if i else "",
            "X-Maestro-App": "coding_agent",
        }
        body = {"messages": [{"role": "user", "content": f"step {i}: write the parser"}], "max_tokens": 5}
        responses.append(await client.post("/v1/chat/completions", json=body, headers=headers))
    return responses


def assert_model_answered_and_observed(responses, trace_dir, num_observed: int) -> None:
    assert [r.status_code for r in responses] == [200] * len(ROLES)
    stages = collect(trace_dir)[0]
    assert len(stages) == len(ROLES)
    assert {s.model_extra["fallback_level"] for s in stages} <= {
        "role",
        "new_app",
        "global",
    }  # the model, not the prior
    assert num_observed == len(ROLES)


def test_gateway_predicts_and_observes_through_the_service_in_process(model_dir, tmp_path, monkeypatch, bentoml_asgi):
    from predictor_service.service import PredictorService

    for key, value in service_env(model_dir, tmp_path).items():
        monkeypatch.setenv(key, value)
    service = bentoml_asgi(PredictorService)

    async def scenario():
        async with service.router.lifespan_context(service):
            # In process, the client talks to the ASGI app instead of a socket.
            client = AsyncPredictorClient(
                ClientConfig(url="http://predictor", timeout_s=5.0), transport=httpx.ASGITransport(service)
            )
            responses = await run_app(
                tmp_path / "traces", {"a": True}, three_stages, HttpPredictor(client, observe_period_s=0.01)
            )
            async with httpx.AsyncClient(transport=httpx.ASGITransport(service), base_url="http://p") as probe:
                got = await probe.get("/stats")
                assert got.status_code == 200, got.text
                stats = got.json()
            return responses, stats

    responses, stats = asyncio.run(scenario())
    assert_model_answered_and_observed(responses, tmp_path / "traces", stats["num_observed"])
    assert stats["num_stages_predicted"] == len(ROLES) + 1  # and the warm-up stage of the gateway's readiness check


def test_unreachable_service_costs_the_deadline_and_answers_from_the_prior(tmp_path):
    from driver.testbed.engines import free_port

    async def calls(client, gateway):
        responses = await three_stages(client, gateway)
        return responses, await client.get("/ready"), (await client.get("/maestro/status")).json()["predictor"]

    client = AsyncPredictorClient(ClientConfig(url=f"http://127.0.0.1:{free_port()}", timeout_s=0.05))
    predictor = HttpPredictor(client, observe_period_s=0.01, startup_timeout_s=0.3)
    responses, ready, status = asyncio.run(run_app(tmp_path, {"a": True}, calls, predictor))
    assert [r.status_code for r in responses] == [200] * len(ROLES)
    stages = collect(tmp_path)[0]
    assert {s.model_extra["fallback_level"] for s in stages} == {"prior"}
    # The first call finds the service down (error), the next ones fall within the client's cooldown.
    assert [s.model_extra["prediction_source"] for s in stages] == ["error", "unavailable", "unavailable"]
    assert ready.status_code == 503 and ready.json()["predictor_ready"] is False
    assert status["fallback_reasons"] == {"timeout": 0, "error": 1, "unavailable": 2, "no_model": 0}
    assert "not ready within 0.3 s" in status["startup_error"] and status["answered_by_model"] == 0
    assert client.breaker.last_error and predictor.num_observed == 0 and len(predictor.pending) == len(ROLES)


def test_closing_waits_for_the_batch_on_the_wire_and_sends_the_rest():
    """The race behind a flaky 'observed 1 of 3': the gateway stopped while a batch was being sent."""

    class SlowClient:
        config = ClientConfig(url="http://slow")

        def __init__(self):
            self.received: list[str] = []

        async def observe(self, rows) -> bool:
            await asyncio.sleep(0.2)  # a slow /observe (a loaded box)
            self.received.extend(r["stage_id"] for r in rows)
            return True

        async def aclose(self) -> None:
            pass

    async def scenario() -> SlowClient:
        client = SlowClient()
        predictor = HttpPredictor(client, observe_period_s=0.01)
        predictor.observe({"workflow_id": "w", "stage_id": "0"})
        await asyncio.sleep(0.05)  # its batch is on the wire now
        predictor.observe({"workflow_id": "w", "stage_id": "1"})
        predictor.observe({"workflow_id": "w", "stage_id": "2"})
        await predictor.aclose()
        assert predictor.num_observed == 3 and not predictor.pending
        return client

    assert sorted(asyncio.run(scenario()).received) == ["0", "1", "2"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gateway_with_a_real_bentoml_serve(model_dir, tmp_path):
    config = ServerConfig(env=service_env(model_dir, tmp_path), log_path=str(tmp_path / "server.log"))
    with LocalServer(config) as server:
        # Generous deadlines: on a loaded 2-core box a first /predict or /observe can take seconds.
        predictor = HttpPredictor.from_url(server.url, str(model_dir), timeout_s=30.0)
        predictor.observe_period_s = 0.01
        responses = asyncio.run(run_app(tmp_path / "traces", {"a": True}, three_stages, predictor))
        # The gateway's stop flushed what it had; wait on the service's own count, not a fixed time.
        deadline, stats = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            stats = httpx.get(f"{server.url}/stats", timeout=30).json()
            if stats["num_observed"] >= len(ROLES):
                break
            time.sleep(0.2)
    assert predictor.num_observed == len(ROLES) and not predictor.pending, (
        predictor.num_observed,
        predictor.client.breaker.last_error,
    )
    assert_model_answered_and_observed(responses, tmp_path / "traces", stats["num_observed"])
