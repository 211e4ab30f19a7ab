"""The driver's JSON report: per-workflow and per-stage rows, latency percentiles, failures by reason."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

import numpy as np


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    a = np.asarray(values, dtype=float)
    return {
        "n": len(a),
        "mean": round(float(a.mean()), 5),
        "p50": round(float(np.percentile(a, 50)), 5),
        "p90": round(float(np.percentile(a, 90)), 5),
        "p99": round(float(np.percentile(a, 99)), 5),
        "max": round(float(a.max()), 5),
    }


def build_report(
    config, workflows: list[list[dict]], workflow_rows: list[dict], stage_rows: list[dict], wall_s: float
) -> dict:
    planned = {(s["workflow_id"], s["stage_id"]) for w in workflows for s in w}
    seen = Counter((r["workflow_id"], r["stage_id"]) for r in stage_rows)
    ok = [r for r in stage_rows if r["status"] == "ok"]
    failed = [r for r in stage_rows if r["status"] != "ok"]
    tokens_mismatch = [r for r in ok if r.get("output_tokens") != r["max_tokens"]]
    summary = {
        "num_workflows": len(workflows),
        "num_workflows_ok": sum(w["status"] == "ok" for w in workflow_rows),
        "num_stages": len(planned),
        "num_stages_ok": len(ok),
        "num_stages_failed": len(failed),
        "num_stages_lost": len(planned - set(seen)),
        "num_stages_duplicated": sum(c > 1 for c in seen.values()),
        "num_output_tokens_not_forced": len(tokens_mismatch),
        "failure_reasons": dict(Counter(_reason(r["error"]) for r in failed)),
        "wall_s": round(wall_s, 3),
        "workflow_e2e_s": percentiles([w["e2e_s"] for w in workflow_rows if w["status"] == "ok"]),
        "stage_latency_s": percentiles([r["latency_s"] for r in ok]),
        "stage_ttft_s": percentiles([r["ttft_s"] for r in ok if r.get("ttft_s") is not None]),
        "tool_exec_s": percentiles([r["tool_exec_s"] for r in ok if "tool_exec_s" in r]),
        "output_tokens_total": int(sum(r.get("output_tokens") or 0 for r in ok)),
        "nodes": dict(Counter(r.get("node", "direct") for r in ok)),
        "targets": dict(Counter(r["target"] for r in ok)),
        "num_stages_failed_over": sum("failed_over" in r for r in stage_rows),
    }
    return {"config": asdict(config), "summary": summary, "workflows": workflow_rows, "stages": stage_rows}


def _reason(error: str) -> str:
    return error.split(":")[0][:80]
