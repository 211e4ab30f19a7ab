"""Two real `bentoml serve` replicas and two gateway-side clients (as two gateway replicas hold them): a workflow's
stages reach the same replica whichever client sends them, so a child predicted through one gateway carries the
history its parents left through the other; one replica is killed mid-run and nothing is lost."""

import asyncio
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipelines.features import StageHistory
from pipelines.synth import generate
from predictor_service.async_client import AsyncPredictorClient
from predictor_service.client import ClientConfig, to_wire
from predictor_service.config import ServiceConfig
from predictor_service.engine import PredictorEngine
from predictor_service.local_server import LocalServer, ServerConfig
from predictor_service.online import CorrectionConfig
from predictor_service.replicas import Ring
from predictor_service.schemas import ObservedStage, PredictRequest

pytestmark = pytest.mark.slow
# The online correction off: answers are the model's own, so they can be checked against an engine in process.
NO_CORRECTION = CorrectionConfig(min_observations=10**6, reserve_step=0.0)
NO_CORRECTION_ENV = {"MAESTRO_CORRECTION_MIN_OBSERVATIONS": str(10**6), "MAESTRO_CORRECTION_RESERVE_STEP": "0"}
FALLBACK_REASONS = {"timeout", "error", "cooldown"}


@pytest.fixture(scope="module")
def replicas(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("replicas")
    servers = [
        LocalServer(
            ServerConfig(
                env={
                    "MAESTRO_MODEL": str(model_dir),
                    **NO_CORRECTION_ENV,
                    "MAESTRO_TRACE_DIR": str(root / f"observed-{i}"),
                },
                log_path=str(root / f"server-{i}.log"),
            )
        )
        for i in range(2)
    ]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(LocalServer.__enter__, servers))
        yield servers, [root / f"observed-{i}" for i in range(2)]
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def reference(model_dir):
    """The service's engine in process, on the same model, to say what an answer with full history is."""
    return PredictorEngine(ServiceConfig(model=str(model_dir), trace=None, correction=NO_CORRECTION))


def model_answer(engine: PredictorEngine, child: dict, ancestors: list[dict]) -> tuple:
    engine.history = StageHistory()
    engine.history.add([ObservedStage.model_validate(a) for a in ancestors])
    (answer,) = engine.predict(PredictRequest.model_validate({"stages": [to_wire(child)]}).stages)
    return answer.p_tool, answer.tokens_pred, answer.tokens_reserve


def workflows_by_owner(ring: Ring) -> dict[str, list[list[dict]]]:
    """Synthetic workflows of 3+ stages (in call order), by the replica that owns them."""
    stages = defaultdict(list)
    for row in generate(400, seed=7):
        stages[row["workflow_id"]].append(row)
    owned = defaultdict(list)
    for workflow_id, rows in stages.items():
        if len(rows) >= 3:
            owned[ring.preference(workflow_id)[0]].append(sorted(rows, key=lambda r: r["call_index"]))
    return owned


def children(workflows: list[list[dict]]) -> list[dict]:
    return [rows[-1] for rows in workflows]


def ancestors(workflows: list[list[dict]]) -> list[dict]:
    return [row for rows in workflows for row in rows[:-1]]


async def keep_predicting(client: AsyncPredictorClient, stages: list[dict], stop: asyncio.Event) -> list:
    outcomes = []
    while not stop.is_set():
        outcomes.append(await client.predict_or_fallback(stages))
    return outcomes


def num_trace_lines(directory: Path) -> int:
    return sum(len(path.read_text().splitlines()) for path in directory.glob("*.jsonl"))


def test_two_replicas_agree_and_lose_nothing_when_one_dies(replicas, reference):
    servers, trace_dirs = replicas
    config = ClientConfig(url=",".join(s.url for s in servers), timeout_s=10.0, cooldown_s=30.0)
    owned = workflows_by_owner(Ring(config.urls))
    killed, survivor = servers[0].url, servers[1].url
    assert len(owned[killed]) >= 6 and len(owned[survivor]) >= 6, "the ring should spread workflows over both"
    before = owned[killed][:2] + owned[survivor][:2]  # parents observed and children predicted before the kill
    across = owned[killed][2:4] + owned[survivor][2:4]  # parents observed before the kill, children after it
    after = owned[killed][4:6] + owned[survivor][4:6]  # parents observed and children predicted after it
    expected = {id(rows): model_answer(reference, rows[-1], rows[:-1]) for rows in before + across + after}
    without_history = [model_answer(reference, rows[-1], []) for rows in before + across + after]
    assert without_history != list(expected.values()), "history must change some answer, or this test proves nothing"

    def check(workflows, answers):
        assert [(a.source, a.p_tool, a.tokens_pred, a.tokens_reserve) for a in answers] == [
            ("model", *expected[id(rows)]) for rows in workflows
        ]

    async def scenario():
        async with AsyncPredictorClient(config) as gateway_a, AsyncPredictorClient(config) as gateway_b:
            assert await gateway_a.observe(ancestors(before + across))
            answers, reason = await gateway_b.predict_or_fallback(children(before))
            assert reason is None
            check(before, answers)
            assert all(num_trace_lines(d) > 0 for d in trace_dirs), "each replica owns some of the workflows"

            stop = asyncio.Event()
            load = asyncio.create_task(keep_predicting(gateway_b, children(after), stop))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(servers[0].stop)  # mid-run: calls are on the wire
            await asyncio.sleep(0.5)
            stop.set()
            outcomes = await load
            assert outcomes and all(len(answers) == len(after) for answers, _ in outcomes)  # every stage answered
            for answers, reason in outcomes:  # by the model, or by the prior with the reason why
                sources = {a.source for a in answers}
                assert (
                    sources == {"model"}
                    if reason is None
                    else (reason in FALLBACK_REASONS and sources <= {"model", "local-fallback"})
                )

            answers, reason = await gateway_b.predict_or_fallback(children(across))
            assert reason is None
            check(across, answers)  # the survivor held the killed replica's workflows' history (/history)
            assert await gateway_a.observe(ancestors(after))  # gateway A fails over to the survivor
            answers, reason = await gateway_b.predict_or_fallback(children(after))
            assert reason is None
            check(after, answers)

    asyncio.run(scenario())
    # Each finished stage was traced once, by its owner: no replica duplicates another's lines.
    assert sum(num_trace_lines(d) for d in trace_dirs) == len(ancestors(before + across + after))
