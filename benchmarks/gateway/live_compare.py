"""The predictor's worth to live serving: the same replayed real workflows through five arms in one run.

    .venv/bin/python benchmarks/gateway/live_compare.py --out benchmarks/results/live_compare.json

Needs .venv-vllm (scripts/setup-vllm.sh). The real traces are split by task as `benchmarks/sim/replay.py` splits
them (the same split and, unless --retrain, the same trained model in its work directory); `--workflows` test-side
workflows, taken round-robin over apps, are replayed live (`maestro drive --traces`: recorded prompts, DAG, tool
waits, lengths forced to the recorded output tokens) against one vLLM-CPU engine (the tests' tiny model), per arm:

- direct   — straight at vLLM
- prior    — gateway, built-in prior (no model)
- model    — gateway, the trained predictor in process (`predictor: local`, `predictor_model`)
- service  — gateway, the trained predictor through a real `bentoml serve` (`predictor: <url>`)
- oracle   — gateway, built-in prior, and each call declares its true length as max_tokens: the reserve is
             min(prior, max_tokens) = the true length, exact while --max-tokens-cap <= the prior's median (256)

In every other arm a call declares `--declared-max-tokens` (what an application sends) and the length is forced
by min_tokens + an end-of-sequence bias, so no arm but the oracle learns the length from max_tokens. Arms run
interleaved, each round in reverse order of the last, with a fresh vLLM prefix-cache salt per run.

SLO: a workflow meets it when its time is at most --slo-factor × its unloaded time, estimated from solo calls
made at the start (one call's time = a + b × output tokens, least squares) summed along the workflow's longest
path, plus its tool waits. KV: the gateway's reservation per stage (prompt estimate + output reserve) over the
max-len one (vLLM's prompt tokens + the declared max_tokens); vLLM's blocks in use sampled from /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx
import numpy as np
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks.gateway.live_compare_report import SLO_FACTORS, markdown_table, plot, table, trace_stats  # noqa: E402
from benchmarks.gateway.live_engine import KvSampler, calibrate, unloaded_s, vllm_metrics  # noqa: E402
from benchmarks.sim.replay import split  # noqa: E402
from driver.runner import DriveConfig, drive  # noqa: E402
from driver.testbed.engines import Engine, EngineConfig  # noqa: E402  (our test fixtures)
from driver.testbed.gateway_process import GatewayProcess  # noqa: E402
from driver.testbed.tiny_model import build_tiny_model  # noqa: E402
from maestro.cli import main as maestro_main  # noqa: E402
from maestro.contract import read_traces, write_jsonl  # noqa: E402
from predictor_service.local_server import LocalServer, ServerConfig  # noqa: E402
from serving.gateway.config import merged  # noqa: E402

ARMS = ("direct", "prior", "model", "service", "oracle")
PRIOR_MEDIAN_TOKENS = 256  # pipelines.predictor.NO_MODEL_PRIOR's median: the oracle arm is exact up to it


def pick_workflows(replay: Path, out: Path, num_workflows: int) -> Path:
    """The first test-side workflows of each app, taken round-robin over the apps, written as one contract file."""
    by_app: dict[str, dict[str, list]] = defaultdict(dict)
    for stage in read_traces(replay, derive=False).stages:
        by_app[stage.app or "trace"].setdefault(stage.workflow_id, []).append(stage)
    queues = [list(by_app[app].values()) for app in sorted(by_app)]
    chosen = []
    while len(chosen) < num_workflows and any(queues):
        for queue in queues:
            if queue and len(chosen) < num_workflows:
                chosen.append(queue.pop(0))
    write_jsonl((s for workflow in chosen for s in workflow), out)
    return out


def gateway_fields(arm: str, engine: Engine, trace_dir: Path, model: Path, service_url: str | None, args) -> dict:
    predictor = {"timeout_s": args.predictor_timeout_s}
    if arm == "model":
        predictor.update(source="local", model=str(model))
    elif arm == "service":
        predictor.update(source=service_url, model=str(model))
    return merged(
        {"nodes": [{"name": "node0", "url": engine.url}], "traces": {"dir": str(trace_dir)}, "predictor": predictor},
        json.loads(args.gateway),
    )


def run_arm(
    arm: str,
    index: int,
    engine: Engine,
    picked: Path,
    model: Path,
    service_url: str | None,
    fit: dict,
    eos: int,
    work: Path,
    args,
) -> dict:
    trace_dir = work / f"traces-{index:02d}-{arm}"
    config = DriveConfig(
        target=engine.url,
        traces=str(picked),
        num_workflows=args.workflows,
        concurrency=args.concurrency,
        max_tokens_cap=args.max_tokens_cap,
        max_prompt_chars=args.max_prompt_chars,
        tool_wait_scale=args.tool_wait_scale,
        max_stages_per_workflow=args.max_stages,
        workflow_suffix=f"{index:02d}-{arm}",
        cache_salt=f"{index:02d}-{arm}",
        eos_token_id=eos,
        declared_max_tokens=0 if arm == "oracle" else args.declared_max_tokens,
    )
    gateway = (
        None
        if arm == "direct"
        else GatewayProcess(gateway_fields(arm, engine, trace_dir, model, service_url, args), work)
    )
    before = vllm_metrics(engine.url)
    try:
        if gateway:
            gateway.start().wait_ready()
            config.target = gateway.url
        with KvSampler(engine.url) as sampler:
            report = asyncio.run(drive(config, work / f"drive-{index:02d}-{arm}.json"))
        status = httpx.get(f"{gateway.url}/maestro/status", timeout=10).json() if gateway else {}
    finally:
        if gateway:
            gateway.stop()
    after = vllm_metrics(engine.url)
    return summarize(arm, index, report, before, after, sampler.blocks, status, trace_dir, fit, args)


def summarize(arm, index, report, before, after, blocks, status, trace_dir, fit, args) -> dict:
    s = report["summary"]
    times = {w["workflow_id"]: w["e2e_s"] for w in report["workflows"] if w["status"] == "ok"}
    unloaded = {w[0]["workflow_id"]: unloaded_s(w, fit) for w in report["plan"]}
    attained = lambda k: round(sum(times.get(w, np.inf) <= k * t for w, t in unloaded.items()) / len(unloaded), 4)  # noqa: E731
    delta = lambda name: after.get(name, 0.0) - before.get(name, 0.0)  # noqa: E731
    queued = delta("vllm:request_queue_time_seconds_count")
    out = {
        "arm": arm,
        "run": index,
        "num_workflows": s["num_workflows"],
        "num_stages": s["num_stages"],
        "slo_attainment": attained(args.slo_factor),
        "slo_attainment_by_factor": {k: attained(k) for k in SLO_FACTORS},
        "workflow_s": {
            "mean": round(float(np.mean(list(times.values()))), 3),
            "p95": round(float(np.percentile(list(times.values()), 95)), 3),
        }
        if times
        else {},
        "wall_s": s["wall_s"],
        "preemptions": int(delta("vllm:num_preemptions_total")),
        "vllm_queue_s_mean": round(delta("vllm:request_queue_time_seconds_sum") / queued, 4) if queued else None,
        "vllm_blocks_used": {"mean": round(float(np.mean(blocks)), 1), "max": round(float(np.max(blocks)), 1)}
        if blocks
        else {},
        "num_gpu_blocks": after["num_gpu_blocks"],
        "stages_failed": s["num_stages_failed"],
        "stages_lost": s["num_stages_lost"],
        "failure_reasons": s["failure_reasons"],
        "lengths_not_forced": s["num_output_tokens_not_forced"],
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    if arm != "direct":
        out["gateway"] = trace_stats(trace_dir, args.declared_max_tokens, arm == "oracle")
        out["predictor"] = {
            k: status.get("predictor", {}).get(k)
            for k in ("model_share", "answered_by_model", "answered_by_prior", "fallback_reasons")
        }
        out["gateway_cpu"] = status.get("cpu")  # the nice it got (cpu_nice < 0 needs root)
    return out


def prepare(args, work: Path) -> tuple[Path, Path]:
    """The task-disjoint split, the model trained on its train side (reused unless --retrain), the picked workflows."""
    train, replay = split(work, 0.3, args.seed)
    model = work / "model"
    if args.retrain or not model.exists():
        maestro_main(["train", "--traces", str(train), "--out", str(model)])
    return model, pick_workflows(replay, work / "live_workflows.jsonl", args.workflows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/live_compare.json")
    parser.add_argument(
        "--work",
        default="benchmarks/results/sim_replay",
        help="the split and the model (shared with sim_replay.py; trained there unless present)",
    )
    parser.add_argument("--retrain", action="store_true")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workflows", type=int, default=8)
    parser.add_argument("--max-stages", type=int, default=8, help="a workflow's first N stages")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens-cap", type=int, default=256)
    parser.add_argument("--declared-max-tokens", type=int, default=512)
    parser.add_argument("--max-prompt-chars", type=int, default=2400)
    parser.add_argument("--tool-wait-scale", type=float, default=0.25)
    parser.add_argument("--kv-bytes", type=int, default=4608 * 1024, help="the engine's KV cache (tiny: 1 KiB a token)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--slo-factor", type=float, default=3.0)
    parser.add_argument("--predictor-timeout-s", type=float, default=0.5)
    parser.add_argument(
        "--gateway",
        default='{"server": {"cpu_nice": -10}}',
        help="extra gateway config sections, as JSON (cpu_nice < 0 needs root; the run records what it got)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", default=None, metavar="JSON", help="print the table of a result file and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown_table(json.loads(Path(args.markdown).read_text())))
        return
    arms = [a for a in args.arms.split(",") if a]
    if set(arms) - set(ARMS) or args.max_tokens_cap > PRIOR_MEDIAN_TOKENS:
        raise SystemExit(f"--arms: a subset of {ARMS}; --max-tokens-cap <= {PRIOR_MEDIAN_TOKENS} (the oracle arm)")
    work, scratch = Path(args.work), Path(tempfile.mkdtemp(prefix="maestro-live-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    model, picked = prepare(args, work)
    tiny = build_tiny_model(scratch / "tiny-model")
    eos = json.loads((tiny / "config.json").read_text())["eos_token_id"]
    engine = Engine(
        EngineConfig(
            str(tiny),
            kv_cache_bytes=args.kv_bytes,
            max_model_len=args.max_model_len,
            log_path=str(scratch / "vllm.log"),
        )
    ).start()
    server = (
        LocalServer(
            ServerConfig(
                env={"MAESTRO_MODEL": str(model.resolve()), "MAESTRO_TRACE_DIR": "off"},
                log_path=str(scratch / "bentoml.log"),
            )
        )
        if "service" in arms
        else None
    )
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "args": vars(args),
        "scratch": str(scratch),
        "workflows_file": str(picked),
        "model": str(model),
        "runs": [],
    }
    out = Path(args.out)
    try:
        if server:
            server.__enter__()
        engine.wait_ready(timeout_s=900)  # a shared box starts vLLM slowly
        result["calibration"] = fit = calibrate(engine.url, eos)
        order = [arms if r % 2 == 0 else arms[::-1] for r in range(args.rounds)]
        plan = [(r, a) for r, round_arms in enumerate(order) for a in round_arms]
        for index, (_, arm) in enumerate(tqdm(plan, desc="live arms", unit="run")):
            result["runs"].append(
                run_arm(arm, index, engine, picked, model.resolve(), server and server.url, fit, eos, scratch, args)
            )
            result["table"] = table(result["runs"])
            out.write_text(json.dumps(result, indent=1))
    finally:
        engine.stop()
        if server:
            server.stop()
    plot(result["table"], out.with_suffix(".png"))
    print(markdown_table(result))


if __name__ == "__main__":
    main()
