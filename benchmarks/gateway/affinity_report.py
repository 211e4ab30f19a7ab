"""What benchmarks/gateway/affinity.py reads from one arm's run: the gateway's traces (where each stage ran, against
where its session's previous stage ran), vLLM's prefix-cache counters before and after, the engines' CPU time and
steps, and the table of arms."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from serving.gateway.vllm_sync import parse_metrics

PREFIX_METRICS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total")
TABLE_COLUMNS = (
    "arm",
    "run",
    "num_stages",
    "away_from_home",
    "prefix_hit_share",
    "tokens_reprefilled",
    "ttft_p50_s",
    "ttft_p95_s",
    "e2e_p50_s",
    "e2e_p95_s",
    "wall_s",
    "engine_cpu_s",
    "engine_steps",
)


def prefix_counters(metrics_text: str) -> dict[str, float]:
    """An engine's /metrics text → its prefix-cache queries and hits (tokens) and preemptions so far (0 if absent)."""
    samples = parse_metrics(metrics_text, PREFIX_METRICS)
    return {name.removeprefix("vllm:"): samples.get(name, ({}, 0.0))[1] for name in PREFIX_METRICS}


def counters_delta(before: list[dict], after: list[dict]) -> dict[str, float]:
    """Summed over the engines: what each counter grew by during the run."""
    if len(before) != len(after):
        raise ValueError(f"counters_delta: {len(before)} engines before, {len(after)} after; pass one dict per engine")
    return {k: sum(a[k] - b[k] for b, a in zip(before, after)) for k in (before[0] if before else {})}


def read_traces(trace_dir: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(Path(trace_dir).glob("*.jsonl")) for line in p.read_text().splitlines()]


def placements(traces: list[dict]) -> dict:
    """Each completed stage against its session's previous stage (by arrival): how many went to another node than the
    one its previous stage ran on (`away_from_home`), of those with a previous stage (`num_with_home`)."""
    by_session: dict[str, list[dict]] = defaultdict(list)
    for t in traces:
        if t.get("outcome") == "completed":
            by_session[t["workflow_id"]].append(t)
    away = with_home = 0
    for stages in by_session.values():
        stages.sort(key=lambda t: t["arrival_s"])
        for previous, stage in zip(stages, stages[1:]):
            with_home += 1
            away += stage["node"] != previous["node"]
    nodes: dict[str, int] = defaultdict(int)
    for t in traces:
        if t.get("outcome") == "completed":
            nodes[t["node"]] += 1
    return {"away_from_home": away, "num_with_home": with_home, "stages_by_node": dict(sorted(nodes.items()))}


def by_node(traces: list[dict]) -> dict:
    """Per node: the mean of its stages' gateway queue time and its own time (`upstream_s`): a slow node and the
    stages that waited for it."""
    nodes: dict[str, list[dict]] = defaultdict(list)
    for t in traces:
        if t.get("outcome") == "completed":
            nodes[t["node"]].append(t)
    return {
        name: {
            "queue_s_mean": round(float(np.mean([t["queue_s"] for t in stages])), 4),
            "upstream_s_mean": round(float(np.mean([t.get("upstream_s", 0.0) for t in stages])), 4),
        }
        for name, stages in sorted(nodes.items())
    }


def quantiles(values: list[float]) -> dict:
    if not values:
        return {}
    return {
        "p50": round(float(np.percentile(values, 50)), 4),
        "p95": round(float(np.percentile(values, 95)), 4),
        "mean": round(float(np.mean(values)), 4),
    }


def engine_steps(stats_dir: Path, since_unix_s: float, until_unix_s: float) -> int:
    """vLLM's scheduler steps with work (running or waiting requests) in the window, from the maestro-vllm-stats
    records under `stats_dir` (0 when the plugin wrote none)."""
    return sum(
        1
        for p in Path(stats_dir).glob("**/vllm-*.jsonl")
        for line in p.read_text().splitlines()
        if (r := json.loads(line)).get("kind") == "step"
        and since_unix_s <= r["t"] <= until_unix_s
        and r["running"] + r["waiting"] > 0
    )


def summarize(arm: str, run: int, traces: list[dict], counters: dict, wall_s: float, engine_cpu_s: float, steps: int):
    """One arm's run: placement, prefix cache, the gateway's TTFT and end-to-end times (from each call's arrival), and
    the clocks. `tokens_reprefilled` = prompt tokens vLLM computed (prefix-cache queries less hits)."""
    done = [t for t in traces if t.get("outcome") == "completed"]
    queries, hits = counters.get("prefix_cache_queries_total", 0.0), counters.get("prefix_cache_hits_total", 0.0)
    return {
        "arm": arm,
        "run": run,
        "num_stages": len(done),
        "num_failed": len(traces) - len(done),
        **placements(traces),
        "prefix_cache_queries_tokens": int(queries),
        "prefix_cache_hits_tokens": int(hits),
        "prefix_hit_share": round(hits / queries, 4) if queries else None,
        "tokens_reprefilled": int(queries - hits),
        "preemptions": int(counters.get("num_preemptions_total", 0.0)),
        "ttft_s": quantiles([t["ttft_s"] for t in done if "ttft_s" in t]),
        "e2e_s": quantiles([t["e2e_s"] for t in done]),
        "queue_s": quantiles([t["queue_s"] for t in done]),
        "by_node": by_node(traces),
        "wall_s": round(wall_s, 3),
        "engine_cpu_s": round(engine_cpu_s, 2),
        "engine_steps": steps,
    }


def table_row(summary: dict) -> dict:
    flat = {
        **summary,
        "ttft_p50_s": summary["ttft_s"].get("p50"),
        "ttft_p95_s": summary["ttft_s"].get("p95"),
        "e2e_p50_s": summary["e2e_s"].get("p50"),
        "e2e_p95_s": summary["e2e_s"].get("p95"),
    }
    return {k: flat[k] for k in TABLE_COLUMNS}


def arm_means(summaries: list[dict]) -> list[dict]:
    """Per arm, in first-run order: the mean of each table column over its runs (`run`: how many)."""
    rows: dict[str, list[dict]] = defaultdict(list)
    for s in summaries:
        rows[s["arm"]].append(table_row(s))
    out = []
    for arm, runs in rows.items():
        mean = {"arm": arm, "run": f"mean of {len(runs)}"}
        for column in TABLE_COLUMNS[2:]:
            values = [r[column] for r in runs if r[column] is not None]
            mean[column] = round(float(np.mean(values)), 4) if values else None
        out.append(mean)
    return out


def markdown_table(summaries: list[dict]) -> str:
    """Each run's row, then each arm's means."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for row in [table_row(s) for s in summaries] + arm_means(summaries):
        lines.append("| " + " | ".join("" if v is None else str(v) for v in row.values()) + " |")
    return "\n".join(lines)
