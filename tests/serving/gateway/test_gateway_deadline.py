"""The stage's deadline (request_timeout_s) bounds every path: JSON and stream, a node that sends nothing (not even
its headers), one that stalls before its first byte of body or mid-body, a retry, a queue wait, the wait for the
predictor's history. In process, over a vLLM-like node (conftest.vllm_like) behind a `FaultProxy`.

Each path runs on a loop that wakes every millisecond (as a loaded gateway's does: other calls, polls), so that a
timer fires as soon as the loop's clock says it is due: under uvloop (the gateway's loop under uvicorn; its clock is
in whole milliseconds, so a timer may fire up to ~1 ms before `time.monotonic()` reaches its time) and under a loop
whose clock runs 1 % fast (every timer fires early, by 10 ms a second). An attempt cut by the deadline must end the
stage with 504 even though `Job.remaining_s()` then still says some time is left: retrying then sent a call with no
time left, which aiohttp read as a call with no limit, and the stage waited out the node's stall timeout
(test_gateway_faults: 33 s for a 3 s deadline).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import uvloop

from serving.gateway.config import merged
from serving.gateway.predict import LocalPredictor
from serving.gateway.upstream import Upstream, is_deadline
from tests.serving.faultproxy import Fault, FaultProxy

from .conftest import fake_nodes, serve_app

DEADLINE_S = 1.0
NODE_TIMEOUT_S = 30.0  # only the deadline can end a stalled attempt in time
STALL_S = 60.0
SLACK_S = 2.0  # the gateway's own work past the deadline on a loaded 2-core box; the bug costs NODE_TIMEOUT_S
CLOCK_RATE = 1.01
HEADERS = {"X-Maestro-Workflow": "wf-deadline", "X-Maestro-Role": "planner"}


class FastClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock runs CLOCK_RATE times as fast as time.monotonic(): its timers fire early."""

    def __init__(self):
        super().__init__()
        self._origin = super().time()

    def time(self) -> float:
        return self._origin + (super().time() - self._origin) * CLOCK_RATE


LOOPS = {"uvloop": uvloop.new_event_loop, "fast-clock": FastClockLoop}


def run(loop: str, coro):
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(busy(coro))


async def busy(coro):
    """`coro` with the loop woken every millisecond."""

    async def tick():
        while True:
            await asyncio.sleep(0.001)

    ticker = asyncio.ensure_future(tick())
    try:
        return await coro
    finally:
        ticker.cancel()


async def through_faults(tmp_path, faults: list[Fault], calls, num_ports: int = 2, **sections):
    """The gateway in process over `num_ports` nodes, each a port of one FaultProxy before one vLLM-like node."""
    config = merged(
        {"upstream": {"node_timeout_s": NODE_TIMEOUT_S}, "limits": {"request_timeout_s": DEADLINE_S}}, sections
    )
    async with fake_nodes({"vllm": True}) as engine:
        with FaultProxy(engine["vllm"], faults, num_ports=num_ports) as proxy:
            urls = {f"node{i}": url for i, url in enumerate(proxy.urls)}
            return await serve_app(tmp_path, urls, calls, **config)


def timed_call(stage: str, stream: bool, max_tokens: int = 8):
    async def call(client, gateway):
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": stream}
        started = time.monotonic()
        response = await client.post("/v1/chat/completions", json=body, headers={**HEADERS, "X-Maestro-Stage": stage})
        return response, time.monotonic() - started

    return call


def trace_lines(directory) -> list[dict]:
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]


def sse_payloads(text: str) -> list:
    payloads = [line[5:].strip() for line in text.split("\n") if line.startswith("data:")]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


def assert_within_deadline(elapsed_s: float) -> None:
    assert DEADLINE_S / CLOCK_RATE - 0.01 <= elapsed_s < DEADLINE_S + SLACK_S, elapsed_s


def assert_traced_past_deadline(tmp_path, attempts: int) -> dict:
    [line] = trace_lines(tmp_path)
    assert "deadline" in line["error"] and line["attempts"] == attempts, line
    return line


# (stream to the client, the upstream sent streamed, the fault both nodes meet: kind, after_events)
PATHS = {
    "json-no-headers": (False, False, "hang", 0),
    "json-stall-before-body": (False, False, "stall", 0),
    "json-streamed-upstream-stall-mid-body": (False, True, "stall", 2),
    "stream-no-headers": (True, False, "hang", 0),
    "stream-stall-before-first-event": (True, False, "stall", 0),
}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("path", PATHS)
def test_a_stall_on_any_path_before_the_client_gets_a_byte_is_a_504_at_the_deadline(tmp_path, path, loop):
    """Nothing reached the client: the attempt is cut at the deadline and not retried; the client gets a 504."""
    stream, stream_upstream, kind, after_events = PATHS[path]
    fault = Fault(kind, after_events=after_events, stall_s=STALL_S, times=2)
    response, elapsed_s = run(
        loop, through_faults(tmp_path, [fault], timed_call(path, stream), upstream={"stream": stream_upstream})
    )
    assert response.status_code == 504 and "deadline" in response.json()["error"]["message"], response.text
    assert_within_deadline(elapsed_s)
    assert_traced_past_deadline(tmp_path, attempts=1)
    assert len(fault.hit_ports) == 1  # the other node was never tried


@pytest.mark.parametrize("loop", LOOPS)
def test_a_stream_stalled_mid_body_ends_at_the_deadline_with_a_504_error_event(tmp_path, loop):
    """Events already reached the client: its stream ends at the deadline with an error event (code 504) and
    `data: [DONE]`, well-formed."""
    fault = Fault("stall", after_events=2, stall_s=STALL_S)
    response, elapsed_s = run(loop, through_faults(tmp_path, [fault], timed_call("mid-body", stream=True)))
    assert response.status_code == 200
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]" and len(payloads) == 4, payloads  # two relayed events, the error, [DONE]
    error = payloads[-2]["error"]
    assert error["code"] == 504 and "deadline" in error["message"], error
    assert_within_deadline(elapsed_s)
    assert_traced_past_deadline(tmp_path, attempts=1)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_retry_after_a_5xx_is_cut_at_the_same_deadline(tmp_path, loop):
    faults = [Fault("status", status=503), Fault("stall", stall_s=STALL_S)]
    response, elapsed_s = run(loop, through_faults(tmp_path, faults, timed_call("retry", stream=False)))
    assert response.status_code == 504, response.text
    assert_within_deadline(elapsed_s)
    assert_traced_past_deadline(tmp_path, attempts=2)
    assert faults[0].hit_ports != faults[1].hit_ports  # the retry went to the other node


@pytest.mark.parametrize("loop", LOOPS)
def test_a_stage_queued_behind_a_stalled_one_is_cut_at_its_own_deadline(tmp_path, loop):
    """One node taking one stage at a time: the second stage waits in the queue, then (if the node frees in time)
    meets the stall too; either way it ends with 504 by its deadline."""
    fault = Fault("stall", stall_s=STALL_S, times=2)

    async def calls(client, gateway):
        return await asyncio.gather(
            timed_call("first", False)(client, gateway), timed_call("second", False)(client, gateway)
        )

    answers = run(loop, through_faults(tmp_path, [fault], calls, num_ports=1, limits={"max_inflight_per_node": 1}))
    for response, elapsed_s in answers:
        assert response.status_code == 504, response.text
        assert_within_deadline(elapsed_s)
    lines = trace_lines(tmp_path)
    assert sorted(line["stage_id"] for line in lines) == ["first", "second"]
    assert all("deadline" in line["error"] for line in lines), lines


class NeverSettles(LocalPredictor):
    """The priors, with a history that never confirms an observed stage (a predictor service that hangs)."""

    async def settled(self) -> None:
        await asyncio.Event().wait()


@pytest.mark.parametrize("loop", LOOPS)
def test_the_wait_for_the_predictors_history_ends_at_the_deadline(tmp_path, loop):
    """A JSON answer waits for the predictor's history to take its stage, but not past the stage's deadline."""
    response, elapsed_s = run(
        loop, through_faults(tmp_path, [], timed_call("settle", stream=False), predictor=NeverSettles())
    )
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 8, response.text
    assert_within_deadline(elapsed_s)
    [line] = trace_lines(tmp_path)
    assert line["output_tokens"] == 8 and "error" not in line


def test_an_upstream_call_with_no_time_left_is_not_sent_and_a_deadline_is_told_from_a_stall():
    """aiohttp reads `total=0` as no limit: a call with no time left must fail at once, unsent. A call cut by its
    `total` (the deadline) is told from one cut by the node's stall timeout (`sock_read`)."""

    async def main():
        async with fake_nodes({"vllm": True}) as engine:
            with FaultProxy(engine["vllm"], [Fault("stall", stall_s=STALL_S, times=2)]) as proxy:
                url = f"{proxy.urls[0]}/v1/chat/completions"
                body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                patient, impatient = Upstream(NODE_TIMEOUT_S, 2.0), Upstream(0.3, 2.0)
                await patient.start(), await impatient.start()
                try:
                    outcomes = []
                    for upstream, remaining_s in ((patient, 0.0), (patient, 0.3), (impatient, NODE_TIMEOUT_S)):
                        started = time.monotonic()
                        with pytest.raises(asyncio.TimeoutError) as error:
                            await upstream.post_json(url, body, {}, remaining_s)
                        outcomes.append((is_deadline(error.value), time.monotonic() - started, len(proxy.received)))
                finally:
                    await patient.close(), await impatient.close()
                return outcomes

    (unsent, unsent_s, num_sent), (cut, cut_s, _), (stalled, stalled_s, _) = run("uvloop", main())
    assert unsent and num_sent == 0 and unsent_s < 0.1
    assert cut and 0.25 <= cut_s < SLACK_S
    assert not stalled and 0.25 <= stalled_s < SLACK_S
