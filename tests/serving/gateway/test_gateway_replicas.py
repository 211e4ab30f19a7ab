"""Two `maestro gateway` replicas in front of one vLLM-CPU engine, both calling two `bentoml serve` replicas of the
predictor service, driven by `maestro drive` over both gateways; one gateway is SIGKILLed while calls are in flight.

What a caller sees when a gateway replica dies: its calls in flight break (a transport error), calls sent after
the kill are refused at connect; the driver sends each of them again, same X-Maestro metadata, to the other
gateway. What is kept: the workflow's history, held by the service replica that owns the workflow (ketama ring on
the workflow id, the same in both gateways), so a stage predicted through one gateway sees the outcomes of
parents that finished behind the other. What is not: the idempotency key lives in the dead gateway's process, so
a call retried on the survivor runs again on the engine (if it had finished behind the dead one, that engine run
is the second); a call re-sent to the gateway that ran it is answered from that gateway's memory.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from driver.runner import DriveConfig, drive
from driver.testbed.engines import free_port
from driver.testbed.gateway_process import GatewayProcess
from predictor_service.local_server import LocalServer, ServerConfig

from .conftest import fake_nodes
from .test_gateway_predictor import model_dir  # noqa: F401 — the small trained predictor the services load

KILL_AFTER_STAGES = 6  # stages completed behind the doomed gateway before it is killed (one at least in flight)


def read_traces(directory: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]


@pytest.fixture
def services(model_dir, tmp_path):  # noqa: F811
    """Two service replicas on the same model, each with its own trace directory."""
    servers = [
        LocalServer(
            ServerConfig(
                env={"MAESTRO_MODEL": str(model_dir), "MAESTRO_TRACE_DIR": str(tmp_path / f"observed-{i}")},
                log_path=str(tmp_path / f"service-{i}.log"),
            )
        )
        for i in range(2)
    ]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(LocalServer.__enter__, servers))
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def gateways(vllm_engine, services, model_dir, tmp_path):  # noqa: F811
    """Two gateway processes, the same engine node and both service replicas each, their own trace directories."""
    replicas = []
    try:
        for name in ("a", "b"):
            fields = {
                "nodes": [{"name": "vllm", "url": vllm_engine.url}],
                "traces": {"dir": str(tmp_path / f"gateway-{name}")},
                "predictor": {"source": ",".join(s.url for s in services), "model": str(model_dir), "timeout_s": 10.0},
            }
            replicas.append(GatewayProcess(fields, tmp_path).start())
        yield [g.wait_ready() for g in replicas]
    finally:
        for gateway in replicas:
            gateway.stop()


async def kill_when_busy(gateway: GatewayProcess) -> dict:
    """SIGKILL `gateway` once it has completed KILL_AFTER_STAGES stages and has one in flight; its last status."""
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            status = (await client.get(f"{gateway.url}/maestro/status")).json()
            if status["trace_lines"] >= KILL_AFTER_STAGES and status["inflight"]:
                await asyncio.to_thread(gateway.kill)
                return status
            await asyncio.sleep(0.02)


async def drive_and_kill(config: DriveConfig, doomed: GatewayProcess) -> tuple[dict, dict]:
    killer = asyncio.create_task(kill_when_busy(doomed))
    report = await drive(config)
    assert killer.done(), "the doomed gateway was never busy enough to be killed mid-run"
    return report, killer.result()


def test_drive_sends_a_call_a_gateway_does_not_take_to_the_next(tmp_path):
    """A dead gateway (nobody listening) and a live vLLM-like target: every stage is answered, the ones that
    started at the dead one after failing over; with every target dead, each stage fails saying why."""

    async def scenario():
        async with fake_nodes({"dead": False, "live": True}) as urls:
            config = DriveConfig(
                target=f"{urls['dead']},{urls['live']}",
                app="swe_coding",
                num_workflows=2,
                max_tokens_cap=8,
                run_tools=False,
                timeout_s=10,
            )
            report = await drive(config)
            config.target = urls["dead"] + "," + f"http://127.0.0.1:{free_port()}"
            return report, await drive(config)

    report, refused = asyncio.run(scenario())
    rows = report["stages"]
    assert report["summary"]["num_stages_ok"] == len(rows) and {r["target"] for r in rows} == {rows[0]["target"]}
    failed_over = [r for r in rows if "failed_over" in r]
    assert 0 < len(failed_over) < len(rows)  # a workflow's stages alternate between the two targets
    assert all("ConnectError" in r["failed_over"][0] for r in failed_over)
    first = [r for r in refused["stages"] if r["error"] != "a parent stage failed"]
    assert first and all(r["error"].startswith("every target failed (2 tried): http://127.0.0.1:") for r in first)
    assert refused["summary"]["num_stages_lost"] == 0


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(400)
def test_a_gateway_killed_mid_run_loses_no_stage_and_no_history(gateways, tmp_path):
    doomed, survivor = gateways
    config = DriveConfig(
        target=f"{doomed.url},{survivor.url}",
        app="all",
        num_workflows=4,
        concurrency=4,
        max_tokens_cap=24,
        max_prompt_chars=1500,
        run_tools=False,
        seed=3,
        timeout_s=120,
    )
    report, last_status = asyncio.run(drive_and_kill(config, doomed))
    summary, rows = report["summary"], report["stages"]
    by_key = {(r["workflow_id"], r["stage_id"]): r for r in rows}

    # Every stage completed: the survivor took each call the dead gateway dropped or refused.
    assert summary["num_stages_lost"] == summary["num_stages_duplicated"] == 0
    assert summary["num_stages_ok"] == summary["num_stages"], summary["failure_reasons"]
    failed_over = [r for r in rows if "failed_over" in r]
    assert failed_over and all(r["target"] == survivor.url for r in failed_over)
    broken = [r for r in failed_over if "ConnectError" not in r["failed_over"][0]]
    assert broken, f"no call was in flight at the kill ({last_status['inflight']} said the gateway)"

    # Each stage ran on the engine once, except those whose first gateway died under them: those ran again.
    completed = [
        line
        for name in ("a", "b")
        for line in read_traces(tmp_path / f"gateway-{name}")
        if line["outcome"] == "completed"
    ]
    runs = Counter((line["workflow_id"], line["stage_id"]) for line in completed)
    assert set(runs) == set(by_key)
    assert {key for key, n in runs.items() if n > 1} <= {(r["workflow_id"], r["stage_id"]) for r in broken}

    # What is lost: outcomes the dead gateway had not yet sent to /observe when it died (it sends them at once).
    observed = {
        (line["workflow_id"], line["stage_id"]) for i in (0, 1) for line in read_traces(tmp_path / f"observed-{i}")
    }
    lost = set(runs) - observed
    assert lost <= {(r["workflow_id"], r["stage_id"]) for r in rows if r["target"] == doomed.url}, lost

    # A stage whose parents finished behind the other gateway was predicted with their outcomes: the workflow's
    # owner replica had them (/observe), whichever gateway sent them.
    crossed = [
        line
        for name, gateway in (("a", doomed), ("b", survivor))
        for line in read_traces(tmp_path / f"gateway-{name}")
        if line["outcome"] == "completed"
        and line["parent_ids"]
        and all(
            by_key[(line["workflow_id"], p)]["target"] != gateway.url and (line["workflow_id"], p) not in lost
            for p in line["parent_ids"]
        )
    ]
    assert crossed, "no stage had its parents behind the other gateway: nothing was checked"
    assert [line["history"] for line in crossed] == ["full"] * len(crossed), [
        (line["stage_id"], line["history"], line["prediction_source"]) for line in crossed
    ]

    # The survivor's idempotency key: a stage it ran, sent to it again, is answered from memory, not run again.
    asyncio.run(check_replay_and_no_history(survivor, rows, tmp_path / "gateway-b"))


async def check_replay_and_no_history(survivor: GatewayProcess, rows: list[dict], trace_dir: Path) -> None:
    ran = next(r for r in rows if r["target"] == survivor.url)
    headers = {
        "X-Maestro-Workflow": ran["workflow_id"],
        "X-Maestro-Stage": ran["stage_id"],
        "X-Maestro-Role": ran["role"],
        "X-Maestro-App": ran["app"],
    }
    body = {"model": "tiny", "messages": [{"role": "user", "content": "again"}], "max_tokens": 4}
    num_lines = len(read_traces(trace_dir))
    async with httpx.AsyncClient(timeout=60) as client:
        replay = await client.post(f"{survivor.url}/v1/chat/completions", json=body, headers=headers)
        assert replay.status_code == 200 and replay.headers.get("x-maestro-replay") == "1"
        assert len(read_traces(trace_dir)) == num_lines
        # The control: a stage whose parent no replica ever observed is predicted without history.
        orphan = {**headers, "X-Maestro-Workflow": "orphan", "X-Maestro-Stage": "1", "X-Maestro-Parents": "0"}
        assert (await client.post(f"{survivor.url}/v1/chat/completions", json=body, headers=orphan)).status_code == 200
    assert read_traces(trace_dir)[-1]["history"] == "none"
