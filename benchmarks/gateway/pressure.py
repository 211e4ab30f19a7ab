"""The KV-pressure phase of benchmarks/gateway/suite.py: one node with a tiny KV cache, the same workload straight at
vLLM and through the gateway, in halves on fresh engines (`--pressure-modes`, default direct, gateway, direct), each
gateway half compared with the mean of the direct ones: vLLM's preemptions and the workflows' completion time."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import numpy as np

from benchmarks.gateway.processes import (
    decode_step_ms,
    handover,
    preemptions,
    running_while_busy,
    sched_delta,
    schedstat,
    start_engines,
    start_gateway,
    stop,
    tree,
)
from driver.runner import DriveConfig, drive
from serving.gateway.config import merged

PRESSURE_MODES = ("direct", "gateway", "gateway2")


def per_mode(value: str, mode: str) -> str:
    """An option given once for both gateways, or as "for gateway,for gateway2"."""
    values = str(value).split(",")
    return values[min(PRESSURE_MODES.index(mode) - 1, len(values) - 1)]


def pressure_half(
    mode: str, gateway_fields: dict | None, model: Path, logs: Path, workdir: Path, args, index: int
) -> dict:
    """One half of the pressure phase on a fresh engine: straight at vLLM (`gateway_fields` None) or
    through a gateway."""
    [engine] = start_engines(model, logs, args.pressure_kv_bytes, 1, max_model_len=1536)
    gateway, half, status = None, {"mode": mode, "load_average_1m_at_start": round(os.getloadavg()[0], 2)}, None
    try:
        target = engine.url
        if gateway_fields is not None:
            own, nice = (per_mode(value, mode) for value in (args.gateway_session, args.gateway_nice))
            gateway, target = start_gateway(
                [engine],
                workdir / f"traces-pressure-{index}-{mode}",
                workdir,
                own_session=own == "own",
                **merged({"server": {"cpu_nice": int(nice)}}, gateway_fields),
            )
            half["gateway_session"], half["gateway_cpu"] = own, httpx.get(f"{target}/maestro/status").json()["cpu"]
        before = preemptions(engine.url)
        config = DriveConfig(
            target=target,
            app="data_analysis",
            num_workflows=args.pressure_workflows,
            concurrency=args.pressure_concurrency,
            token_scale=args.pressure_token_scale,
            max_tokens_cap=args.pressure_max_tokens,
            seed=args.seed + 1,
            max_prompt_chars=3000,
        )
        vllm = tree(engine.process.pid)  # the API server, then its engine core (and helpers)
        watched = {
            "vllm": vllm,
            "vllm_api_server": vllm[:1],
            "vllm_engine": vllm[1:],
            **({"gateway": tree(gateway.pid)} if gateway else {}),
        }
        sched_before = {k: schedstat(v) for k, v in watched.items()}
        report = asyncio.run(drive(config, workdir / f"drive-pressure-{index}-{mode}.json"))
        sched = {k: sched_delta(sched_before[k], schedstat(v)) for k, v in watched.items()}
        s = report["summary"]
        if gateway:
            status = httpx.get(f"{target}/maestro/status", timeout=5).json()
        half.update(
            {
                "preemptions": preemptions(engine.url) - before,
                "wall_s": s["wall_s"],
                "workflow_e2e_s": s["workflow_e2e_s"],
                "num_workflows_ok": s["num_workflows_ok"],
                "num_stages_ok": s["num_stages_ok"],
                "num_stages_lost": s["num_stages_lost"],
                "sched": sched,
                "load_average_1m_at_end": round(os.getloadavg()[0], 2),
            }
        )
    finally:
        if gateway:
            stop(gateway)
        engine.stop()
        if "wall_s" in half:
            half["running_while_busy"] = running_while_busy(logs / "vllm-stats", engine.process.pid)
            half["decode_step_ms"] = decode_step_ms(logs / "vllm-stats", engine.process.pid)
            if gateway_fields is not None:
                half["handover"] = handover(
                    workdir / f"traces-pressure-{index}-{mode}", logs / "vllm-stats", engine.process.pid
                )
    return {"half": half, "gateway_status": status}


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(float(np.mean(values)), 3) if values else None


def compare_to_directs(halves: list[dict]) -> dict:
    """Each gateway half against the mean of the direct halves (all of them: with direct → gateway → direct, the
    two around it, so a box that speeds up or slows down during the run weighs on both sides alike)."""
    directs = [h for h in halves if h["mode"] == "direct"]
    direct = {
        "num_halves": len(directs),
        "preemptions": _mean([h["preemptions"] for h in directs]),
        "wall_s": _mean([h["wall_s"] for h in directs]),
        "workflow_e2e_mean_s": _mean([h["workflow_e2e_s"]["mean"] for h in directs]),
        "decode_step_ms": _mean([h["decode_step_ms"] for h in directs]),
        "running_while_busy": _mean([h["running_while_busy"] for h in directs]),
    }
    out = {"direct_mean": direct}
    for i, h in enumerate(halves):
        if h["mode"] == "direct" or not direct["num_halves"]:
            continue
        e2e_ratio = h["workflow_e2e_s"]["mean"] / direct["workflow_e2e_mean_s"]
        preemption_ratio = direct["preemptions"] / max(h["preemptions"], 1) if direct["preemptions"] else None
        out[f"half{i}_{h['mode']}"] = {
            "workflow_e2e_vs_direct": round(e2e_ratio - 1, 4),
            "wall_vs_direct": round(h["wall_s"] / direct["wall_s"] - 1, 4),
            "preemption_ratio_direct_over_gateway": round(preemption_ratio, 2) if preemption_ratio else None,
            "both_met": bool(preemption_ratio and preemption_ratio >= 5 and e2e_ratio <= 1),
        }
    return out


def phase_pressure(model: Path, logs: Path, workdir: Path, args) -> dict:
    """The halves in `--pressure-modes` order, each `--pressure-repeats` times over. `direct`, `gateway` (and
    `gateway2`, if any) keep the first half of each mode, as the result file had them before halves could repeat;
    `halves` has every one, `vs_directs` each gateway half against the mean of the direct ones."""
    configs = {
        "direct": None,
        "gateway": json.loads(args.pressure_gateway),
        "gateway2": json.loads(args.pressure_gateway2) if args.pressure_gateway2 else None,
    }
    modes = [m.strip() for m in args.pressure_modes.split(",") if m.strip()] * args.pressure_repeats
    if not set(modes) <= set(PRESSURE_MODES) or (("gateway2" in modes) != (configs["gateway2"] is not None)):
        raise SystemExit(
            f"--pressure-modes: {PRESSURE_MODES} (gateway2 with --pressure-gateway2), got {args.pressure_modes!r}"
        )
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    out = {
        "kv_cache_bytes": args.pressure_kv_bytes,
        "load_average_1m_at_start": round(os.getloadavg()[0], 2),
        "sched_autogroup": autogroup.read_text().strip() == "1" if autogroup.exists() else None,
        "gateway_config": configs["gateway"],
        "gateway_nice": args.gateway_nice,
        "modes": modes,
        **({"gateway2_config": configs["gateway2"]} if configs["gateway2"] is not None else {}),
        "halves": [],
    }
    for index, mode in enumerate(modes):
        result = pressure_half(mode, configs[mode], model, logs, workdir, args, index)
        out["halves"].append(result["half"])
        out.setdefault(mode, result["half"])
        if result["gateway_status"] is not None:
            out.setdefault(f"{mode}_status" if mode != "gateway" else "gateway_status", result["gateway_status"])
    if "direct" in out and "gateway" in out:
        d, g = out["direct"]["preemptions"], out["gateway"]["preemptions"]
        out["preemption_ratio_direct_over_gateway"] = round(d / max(g, 1), 2) if d else None
    out["vs_directs"] = compare_to_directs(out["halves"])
    return out
