"""Load test: the gateway (over a real vLLM-CPU engine, predictions from a real `bentoml serve`) and the predictor
service itself, each driven open-loop at ~2× the capacity measured in the same run.

    .venv/bin/python benchmarks/gateway/loadtest.py --duration-s 120 --out benchmarks/results/loadtest.json

Needs .venv-vllm (scripts/setup-vllm.sh). Per target: a short closed-loop ramp (concurrency 1, 4, 16, 48) gives its
capacity (answers/s, the best step); then arrivals at `--overload` × capacity for `--duration-s`. Checks: every
process is alive at the end; peak RSS of each process tree, sampled every second (and the first vs the last third
of the overload, to show it bounded); every 429/503 carries Retry-After; sent = answered + refused + failed, and
for the gateway every stage sent has exactly one trace line (lost = 0, duplicated = 0), its outcomes by reason.
Where time went: `overload_client_lag_s` (the generator sending late: its own CPU share) and, for the gateway,
`intake_s` (sent → the stage's `arrival_s` in its trace: HTTP until the gateway read the call).
Service calls carry `--service-stages` stages each, as the gateway sends a tick's stages in one call.

Overload and faults with the deployed system (gateway phase only):

    .venv/bin/python benchmarks/gateway/loadtest.py --targets gateway --system maestro --slo-s 20 --engines 2 \
        --kill-engine-at-s 20 --predictor local --duration-s 60

`--system maestro --slo-s S`: workflows of 4 calls with that SLO, turned away (503 `workflow_rejected`) when triage
sheds them; `--kill-engine-at-s T`: the last engine SIGKILLed T s into the overload and started again on its port
(`engine_fault` in the report: when, and when it answered again). `--predictor local`: the trained predictor in the
gateway's process instead of a `bentoml serve`. `errors_5xx` counts each 5xx by its error type; `undocumented_5xx`
those the gateway's README does not list (502/503/504 `upstream_error`, 503 `workflow_rejected`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
from benchmarks.gateway.engine_fault import EngineFault  # noqa: E402
from benchmarks.gateway.load_accounting import (  # noqa: E402
    RssSampler,
    account,
    error_type,
    errors_5xx,
    gateway_accounting,
    listen_overflows,
    trace_lines,
)
from benchmarks.gateway.processes import start_gateway, stop  # noqa: E402
from driver.testbed.engines import Engine, EngineConfig  # noqa: E402
from driver.testbed.tiny_model import build_tiny_model  # noqa: E402
from maestro.contract import StageTrace  # noqa: E402
from pipelines.features import FeaturizerConfig  # noqa: E402
from pipelines.model import ModelConfig  # noqa: E402
from pipelines.predictor import Predictor  # noqa: E402
from pipelines.synth import generate  # noqa: E402
from predictor_service.client import to_wire  # noqa: E402
from predictor_service.local_server import LocalServer, ServerConfig  # noqa: E402

RAMP_CONCURRENCY = (1, 4, 16, 48)


class Target:
    """What the load goes to: a URL and route, and the body of request number i (unique stage ids)."""

    def __init__(self, name: str, url: str, route: str, body, headers=None):
        self.name, self.url, self.route, self.body, self.headers = name, url, route, body, headers or (lambda i: {})


def chat_body(i: int, max_tokens: int) -> dict:
    return {
        "messages": [{"role": "user", "content": f"Plan trip {i} to Oslo."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


def stage_headers(i: int, slo_s: float = 0.0) -> dict:
    headers = {"X-Maestro-Workflow": f"lt-{i // 4}", "X-Maestro-Stage": f"s{i}", "X-Maestro-Role": "planner"}
    return {**headers, "X-Maestro-SLO-S": str(slo_s)} if slo_s else headers


class Load:
    """Requests sent to one target and how each ended: status (None: no answer), Retry-After, latency."""

    def __init__(self, target: Target, session: aiohttp.ClientSession):
        self.target, self.session = target, session
        self.rows: list[dict] = []
        self.next_id = 0

    async def one(self, phase: str, scheduled_s: float | None = None) -> dict:
        i, self.next_id = self.next_id, self.next_id + 1
        row = {"i": i, "phase": phase, "status": None, "retry_after": None, "sent_unix_s": time.time()}
        started = time.monotonic()
        if scheduled_s is not None:  # how late the generator itself sent it (its own CPU share)
            row["client_lag_s"] = started - scheduled_s
        try:
            async with self.session.post(
                f"{self.target.url}{self.target.route}", json=self.target.body(i), headers=self.target.headers(i)
            ) as response:
                content = await response.read()
                row.update(status=response.status, retry_after=response.headers.get("Retry-After"))
                if response.status >= 500:
                    row["error_type"] = error_type(content)
        except (TimeoutError, aiohttp.ClientError) as error:
            row["error"] = type(error).__name__
            row["error_detail"] = str(error)[:200]
        row["latency_s"] = time.monotonic() - started
        self.rows.append(row)
        return row

    async def closed(self, concurrency: int, duration_s: float) -> float:
        """Answers (200) per second with `concurrency` clients each sending as soon as answered."""
        deadline, before = time.monotonic() + duration_s, len(self.rows)

        async def client():
            while time.monotonic() < deadline:
                await self.one(f"ramp-c{concurrency}")

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return sum(r["status"] == 200 for r in self.rows[before:]) / duration_s

    async def open(self, rate_per_s: float, duration_s: float) -> None:
        """Arrivals at a fixed rate, whatever the answers; waits for every request to end."""
        tasks, started = [], time.monotonic()
        for n in range(int(rate_per_s * duration_s)):
            await asyncio.sleep(max(0.0, started + n / rate_per_s - time.monotonic()))
            tasks.append(asyncio.create_task(self.one("overload", started + n / rate_per_s)))
        await asyncio.gather(*tasks)


async def run_target(
    target: Target, ramp_s: float, duration_s: float, overload: float, timeout_s: float, on_overload=None
) -> tuple:
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        # a fresh connection per request: a pooled one the server closed while
        # idle would fail a request that never reached it
        connector=aiohttp.TCPConnector(limit=0, force_close=True),
    ) as session:
        load = Load(target, session)
        ramp = {c: round(await load.closed(c, ramp_s), 2) for c in RAMP_CONCURRENCY}
        capacity = max(ramp.values())
        overload_started = time.monotonic()
        if on_overload is not None:
            on_overload()
        await load.open(overload * capacity, duration_s)
    return load.rows, ramp, capacity, overload_started


def train_predictor(out: Path) -> Path:
    """A small two-stage predictor (no embedding, few trees), as the service tests use."""
    stages = [StageTrace.model_validate(r) for r in generate(300, seed=11)]
    model = ModelConfig(
        folds=3, classifier=dict(n_estimators=40, learning_rate=0.1), regressor=dict(n_estimators=80, learning_rate=0.1)
    )
    return Predictor.train(stages, FeaturizerConfig(use_embedding=False), model).save(out / "predictor")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=120.0, help="overload phase per target")
    parser.add_argument("--ramp-s", type=float, default=8.0, help="per concurrency step of the capacity ramp")
    parser.add_argument("--overload", type=float, default=2.0, help="offered load, × measured capacity")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-queued", type=int, default=32, help="the gateway's queue bound (429 beyond)")
    parser.add_argument("--request-timeout-s", type=float, default=30.0, help="the gateway's stage deadline")
    parser.add_argument(
        "--max-inflight-per-node",
        type=int,
        default=128,
        help="the gateway's cap on stages sent to the engine at once (2x its --max-num-seqs 64)",
    )
    parser.add_argument("--targets", default="gateway,service", help="which phases to run, comma-separated")
    parser.add_argument(
        "--service-stages",
        type=int,
        default=32,
        help="stages per /predict call (as the gateway batches a tick's stages): one-stage calls "
        "at 2x the service's capacity are more than one load generator on 2 cores can send",
    )
    parser.add_argument("--system", default="", help="the gateway's system.name (default: the config's)")
    parser.add_argument("--slo-s", type=float, default=0.0, help="each workflow's SLO, sent on its calls (0: none)")
    parser.add_argument("--engines", type=int, default=1, help="vLLM engines behind the gateway")
    parser.add_argument(
        "--kill-engine-at-s",
        type=float,
        default=0.0,
        help="kill the last engine this far into the overload and start it again (0: no fault)",
    )
    parser.add_argument("--predictor", choices=("service", "local"), default="service")
    parser.add_argument("--out", default="benchmarks/results/loadtest.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="maestro-loadtest-"))
    model_dir, predictor_dir = build_tiny_model(work / "tiny"), train_predictor(work)
    engines = [
        Engine(EngineConfig(str(model_dir), kv_cache_bytes=64 * 2**20, log_path=str(work / f"vllm{i}.log"))).start()
        for i in range(args.engines)
    ]
    service_env = {"MAESTRO_MODEL": str(predictor_dir), "MAESTRO_TRACE_DIR": str(work / "observed")}
    report = {"command": " ".join(sys.argv), "args": vars(args), "workdir": str(work)}
    fault = EngineFault(engines[-1], args.kill_engine_at_s) if args.kill_engine_at_s else None
    with contextlib.ExitStack() as stack:
        service = None
        if args.predictor == "service" or "service" in args.targets.split(","):
            service = stack.enter_context(LocalServer(ServerConfig(env=service_env, log_path=str(work / "svc.log"))))
        for engine in engines:
            engine.wait_ready()
        gateway, url = start_gateway(
            engines,
            work / "traces",
            work,
            predictor={"source": service.url} if args.predictor == "service" else {"model": str(predictor_dir)},
            system={"name": args.system} if args.system else {},
            limits={
                "max_queued": args.max_queued,
                "request_timeout_s": args.request_timeout_s,
                "max_inflight_per_node": args.max_inflight_per_node,
            },
            upstream={"metrics_period_s": 0.25},
        )
        pids = {"gateway": gateway.pid, **{f"vllm{i}": e.process.pid for i, e in enumerate(engines)}}
        sampler = RssSampler({**pids, **({"service": service.process.pid} if service else {})})
        sampler.start()
        try:
            targets = [
                Target(
                    "gateway",
                    url,
                    "/v1/chat/completions",
                    lambda i: chat_body(i, args.max_tokens),
                    lambda i: stage_headers(i, args.slo_s),
                ),
                Target(
                    "service",
                    service.url if service else "",
                    "/predict",
                    lambda i: {
                        "stages": [wire[(i * args.service_stages + k) % len(wire)] for k in range(args.service_stages)]
                    },
                ),
            ]
            wire = [to_wire(r) for r in generate(256, seed=123)]
            for target in [t for t in targets if t.name in args.targets.split(",")]:
                overflows = listen_overflows()
                arm = fault.start if fault is not None and target.name == "gateway" else None
                rows, ramp, capacity, since = asyncio.run(
                    run_target(target, args.ramp_s, args.duration_s, args.overload, args.request_timeout_s + 30, arm)
                )
                overflows = listen_overflows() - overflows
                overload_rows = [r for r in rows if r["phase"] == "overload"]
                result = {
                    "ramp_answers_per_s": ramp,
                    "capacity_per_s": capacity,
                    **account(rows, overload_rows, args.duration_s, capacity),
                    "rss": sampler.summary(since),
                    "listen_overflows": overflows,
                }
                if target.name == "gateway":
                    result.update(gateway_accounting(rows, trace_lines(work / "traces")), **errors_5xx(rows))
                    if fault is not None:
                        fault.thread.join(timeout=600)
                        result["engine_fault"], engines[-1] = fault.report(), fault.engine
                report[target.name] = result
                print(target.name, json.dumps(result), flush=True)
            report["alive"] = {
                "gateway": gateway.poll() is None,
                **({"service": service.process.poll() is None} if service else {}),
                **{f"vllm{i}": e.process.poll() is None for i, e in enumerate(engines)},
            }
        finally:
            sampler.stop_event.set()
            stop(gateway)
            for engine in [*engines, *([fault.engine] if fault is not None else [])]:
                engine.stop()
    report["date"] = time.strftime("%Y-%m-%d")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
