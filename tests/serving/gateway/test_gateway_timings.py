"""What a stage's trace line and the gateway's counters say: times from the call's arrival that add up and match what
the client measured, the SLO the call sent and the deadline it was scheduled by (also vLLM's `priority`, on the
wire), and every call counted once, by what became of it."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from serving.gateway.vllm_priority import BATCH_PRIORITY, NO_DEADLINE

from .conftest import run_app

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
COUNTERS = ("requests", "rejected_invalid", "rejected_full", "rejected_no_node", "rejected_shed", "failed")


def trace_lines(directory) -> list[dict]:
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("stream", [True, False])
def test_a_calls_times_count_from_its_arrival_add_up_and_match_the_clients(tmp_path, stream):
    """A call that waits 0.3 s in the queue behind another, then streams 20 tokens 10 ms apart (or answers JSON):
    its e2e_s is what the client measured and holds its queue_s, its ttft_s is the first token's (the in-process
    client gets a stream whole: test_gateway_vllm.py checks a streamed ttft_s against a client's on the wire)."""

    async def calls(client, gateway):
        body = {"messages": USER, "max_tokens": 20, "stream": stream}
        ahead = asyncio.ensure_future(client.post(CHAT, json=body, headers={"X-Maestro-Workflow": "ahead"}))
        await asyncio.sleep(0.05)
        sent_unix, sent = time.time(), time.monotonic()
        assert (await client.post(CHAT, json=body, headers={"X-Maestro-Workflow": "timed"})).status_code == 200
        await ahead
        return sent_unix, time.monotonic() - sent

    sent_unix, client_e2e_s = asyncio.run(
        run_app(
            tmp_path,
            {"a": True},
            calls,
            node_kw={"token_delay_s": 0.01, "tail_delay_s": 0.2},
            limits={"max_inflight_per_node": 1},
        )
    )
    line = next(t for t in trace_lines(tmp_path) if t["workflow_id"] == "timed")
    assert line["outcome"] == "completed" and line["queue_s"] > 0.1  # it waited for "ahead"
    assert sent_unix - 0.01 <= line["arrival_s"] <= sent_unix + 0.05
    assert line["predict_s"] + line["queue_s"] <= line["ttft_s"] <= line["e2e_s"]
    assert line["upstream_s"] <= line["e2e_s"] - line["queue_s"]
    assert abs(line["e2e_s"] - client_e2e_s) < 0.05
    if stream:  # the first content event (JSON: the whole answer is its first token)
        assert line["e2e_s"] - line["ttft_s"] > 0.15


def test_the_trace_line_has_the_slo_the_call_sent_and_vllm_gets_its_deadline_as_priority(tmp_path):
    """Deadline = the workflow's first arrival + its SLO, in the trace on the clock of arrival_s, and to stock vLLM as
    `priority`: interactive first, then the earliest deadline (ms since the gateway started), stages without one
    last in their class."""
    received: list[dict] = []

    async def calls(client, gateway):
        async def call(workflow: str, slo_s: float | None, interactive: bool = True):
            headers = {"X-Maestro-Workflow": workflow, "X-Maestro-Interactive": str(interactive).lower()}
            if slo_s is not None:
                headers["X-Maestro-SLO-S"] = str(slo_s)
            response = await client.post(CHAT, json={"messages": USER, "max_tokens": 4}, headers=headers)
            assert response.status_code == 200

        for workflow, slo_s, interactive in (("late", 30, True), ("soon", 5, True), ("none", None, True)):
            await call(workflow, slo_s, interactive)
        await call("batch", 1, False)
        await call("default", None, False)  # system.slo_s: 60
        return gateway.started_s, time.time() - time.monotonic()

    started_s, unix_minus_monotonic = asyncio.run(
        run_app(tmp_path, {"a": True}, calls, node_kw={"received": received}, system={"slo_s": 0})
    )
    lines = {t["workflow_id"]: t for t in trace_lines(tmp_path)}
    priorities = {t["workflow_id"]: body["priority"] for t, body in zip(trace_lines(tmp_path), received, strict=True)}
    for workflow, slo_s in (("late", 30), ("soon", 5), ("batch", 1)):
        line = lines[workflow]
        assert line["slo_s"] == slo_s and line["deadline_s"] == pytest.approx(line["arrival_s"] + slo_s, abs=0.01)
        deadline_ms = (line["deadline_s"] - unix_minus_monotonic - started_s) * 1000
        offset = 0 if workflow != "batch" else BATCH_PRIORITY
        assert priorities[workflow] - offset == pytest.approx(deadline_ms, abs=20)
    assert "slo_s" not in lines["none"] and "deadline_s" not in lines["none"]
    assert priorities["soon"] < priorities["late"] < priorities["none"] < priorities["batch"]
    assert NO_DEADLINE <= priorities["none"] < BATCH_PRIORITY < priorities["batch"] < priorities["default"]


def counts_after(tmp_path, calls, alive: dict | None = None, **sections) -> dict:
    async def run(client, gateway):
        await calls(client)
        return {name: gateway.counters[name] for name in COUNTERS}

    return asyncio.run(run_app(tmp_path, alive or {"a": True}, run, **sections))


def test_client_errors_count_as_rejected_invalid_only(tmp_path):
    async def calls(client):
        await client.post(CHAT, content=b"not json", headers={"Content-Type": "application/json"})
        await client.post(CHAT, json={"messages": USER}, headers={"X-Maestro-Workflow-Id": "w"})  # a header
        await client.post(CHAT, json={"messages": USER, "max_tokens": -1})  # a field the endpoint refuses
        huge = [{"role": "user", "content": "x" * 10_000}]  # ≈ 3,300 tokens: more than the node's 2,048 hold
        assert (await client.post(CHAT, json={"messages": huge, "max_tokens": 4})).status_code == 413

    counts = counts_after(tmp_path, calls)
    assert counts == {**dict.fromkeys(COUNTERS, 0), "requests": 4, "rejected_invalid": 4}


def test_a_call_with_no_node_counts_as_rejected_no_node_only(tmp_path):
    async def calls(client):
        assert (await client.post(CHAT, json={"messages": USER})).status_code == 503

    counts = counts_after(tmp_path, calls, alive={"a": False})
    assert counts == {**dict.fromkeys(COUNTERS, 0), "requests": 1, "rejected_no_node": 1}


def test_a_full_queue_counts_as_rejected_full_only(tmp_path):
    async def calls(client):
        body = {"messages": USER, "max_tokens": 4}
        running = [asyncio.ensure_future(client.post(CHAT, json=body)) for _ in range(2)]  # one runs, one queues
        await asyncio.sleep(0.1)
        assert (await client.post(CHAT, json=body)).status_code == 429
        assert [r.status_code for r in await asyncio.gather(*running)] == [200, 200]

    counts = counts_after(
        tmp_path, calls, node_kw={"tail_delay_s": 0.3}, limits={"max_queued": 1, "max_inflight_per_node": 1}
    )
    assert counts == {**dict.fromkeys(COUNTERS, 0), "requests": 3, "rejected_full": 1}


def test_an_engine_failure_counts_as_failed_only(tmp_path):
    async def calls(client):
        assert (await client.post(CHAT, json={"messages": USER, "max_tokens": 4})).status_code == 502

    async def run(client, gateway):
        gateway.nodes[0].url = "http://127.0.0.1:9"  # healthy at the last poll, gone now: every attempt fails
        await calls(client)
        return {name: gateway.counters[name] for name in COUNTERS}

    counts = asyncio.run(run_app(tmp_path, {"a": True}, run, limits={"max_attempts": 1}))
    assert counts == {**dict.fromkeys(COUNTERS, 0), "requests": 1, "failed": 1}
