"""What benchmarks/gateway/live_compare.py reports: the gateway's side of a run from its traces, and the per-arm table
(JSON, markdown, plot) over rounds."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from pipelines.collect import collect
from serving.core.admission.sizing import is_calibrated, reserve_output_tokens

SLO_FACTORS = (2, 3, 5, 10)  # attainment is also reported at these multiples of the unloaded time


def trace_stats(trace_dir: Path, declared_max_tokens: int, is_oracle: bool) -> dict:
    """The gateway's side of a run, from its trace lines: refusals, interactive queueing, KV reserved."""
    stages, _ = collect(trace_dir)
    rows = [s.model_dump(exclude_none=True) for s in stages]  # contract fields and the gateway's extras
    done = [r for r in rows if r.get("outcome") == "completed" and "kv_tokens_reserved" in r]
    queue = [r["queue_s"] for r in rows if r.get("interactive") and "queue_s" in r]
    reserved = sum(r["kv_tokens_reserved"] for r in done)
    max_len = sum(r.get("prompt_tokens", 0) + declared_max_tokens for r in done)
    output = [output_reserve(r, r["output_tokens"] if is_oracle else declared_max_tokens) for r in done]
    return {
        "num_traced": len(rows),
        "num_refused": sum(r.get("outcome") == "refused" for r in rows),
        "num_failed": sum(r.get("outcome") == "failed" for r in rows),
        "interactive_queue_s": mean_p95(queue),
        "kv_reserved_vs_maxlen": round(reserved / max_len, 4) if max_len else None,
        "kv_tokens_reserved_median": float(np.median([r["kv_tokens_reserved"] for r in done])) if done else None,
        "output_reserve_vs_true": round(sum(output) / sum(r["output_tokens"] for r in done), 3) if done else None,
        "output_reserve_median": float(np.median(output)) if done else None,
        "num_output_past_reserve": sum(o < r["output_tokens"] for o, r in zip(output, done)),
    }


def output_reserve(row: dict, max_tokens: int) -> int:
    """The output tokens the gateway reserved for a traced stage (its sizing rule on the traced prediction)."""
    calibrated = is_calibrated(SimpleNamespace(fallback_level=row["fallback_level"]))
    return reserve_output_tokens(row["tokens_pred"], row["tokens_reserve"], max_tokens, is_calibrated=calibrated)


def mean_p95(values: list[float]) -> dict:
    if not values:
        return {}
    return {"mean": round(float(np.mean(values)), 4), "p95": round(float(np.percentile(values, 95)), 4)}


TABLE = (
    "slo_attainment",
    "workflow_mean_s",
    "workflow_p95_s",
    "interactive_queue_mean_s",
    "vllm_queue_mean_s",
    "kv_reserved_vs_maxlen",
    "output_reserve_vs_true",
    "vllm_blocks_used_mean",
    "preemptions",
    "refused_or_lost",
    "model_share",
)


def row_of(run: dict) -> dict:
    g = run.get("gateway", {})
    return {
        "slo_attainment": run["slo_attainment"],
        "workflow_mean_s": run["workflow_s"].get("mean"),
        "workflow_p95_s": run["workflow_s"].get("p95"),
        "interactive_queue_mean_s": g.get("interactive_queue_s", {}).get("mean"),
        "vllm_queue_mean_s": run["vllm_queue_s_mean"],
        "kv_reserved_vs_maxlen": g.get("kv_reserved_vs_maxlen"),
        "output_reserve_vs_true": g.get("output_reserve_vs_true"),
        "vllm_blocks_used_mean": run["vllm_blocks_used"].get("mean"),
        "preemptions": run["preemptions"],
        "refused_or_lost": run["stages_failed"] + run["stages_lost"],
        "model_share": run.get("predictor", {}).get("model_share"),
    }


def table(runs: list[dict]) -> dict:
    """Per arm and column: the mean over rounds and the [min, max] spread."""
    out = {}
    for arm in dict.fromkeys(r["arm"] for r in runs):
        rows = [row_of(r) for r in runs if r["arm"] == arm]
        out[arm] = {}
        for column in TABLE:
            values = [r[column] for r in rows if r[column] is not None]
            out[arm][column] = (
                {"mean": round(float(np.mean(values)), 4), "min": min(values), "max": max(values)} if values else None
            )
    return out


MARKDOWN = (
    ("workflow_mean_s", "mean workflow s", "{:.1f}"),
    ("workflow_p95_s", "p95 workflow s", "{:.1f}"),
    ("interactive_queue_mean_s", "interactive queueing at the gateway s", "{:.2f}"),
    ("vllm_queue_mean_s", "queueing in vLLM s", "{:.2f}"),
    ("kv_reserved_vs_maxlen", "KV reserved / max-len", "{:.2f}"),
    ("output_reserve_vs_true", "output reserve / true", "{:.1f}"),
    ("vllm_blocks_used_mean", "vLLM blocks used (mean)", "{:.1f}"),
    ("preemptions", "preemptions", "{:.1f}"),
    ("refused_or_lost", "refused + lost", "{:.0f}"),
    ("model_share", "model answers", "{:.2f}"),
)


def markdown_table(result: dict) -> str:
    """The README's table: per arm, the mean over rounds and (min–max) where the rounds differ."""

    def cell(c: dict | None, fmt: str) -> str:
        if c is None:
            return "—"
        spread = "" if c["min"] == c["max"] else f" ({fmt.format(c['min'])}–{fmt.format(c['max'])})"
        return fmt.format(c["mean"]) + spread

    factors = "/".join(str(k) for k in SLO_FACTORS)
    lines = [
        f"| arm | SLO attained at {factors}× unloaded | " + " | ".join(m[1] for m in MARKDOWN) + " |",
        "|---" * (len(MARKDOWN) + 2) + "|",
    ]
    for arm, row in result["table"].items():
        runs = [r["slo_attainment_by_factor"] for r in result["runs"] if r["arm"] == arm]
        slo = " / ".join(f"{np.mean([r[str(k)] if str(k) in r else r[k] for r in runs]):.2f}" for k in SLO_FACTORS)
        lines.append(f"| {arm} | {slo} | " + " | ".join(cell(row[c], f) for c, _, f in MARKDOWN) + " |")
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = ("slo_attainment", "workflow_mean_s", "kv_reserved_vs_maxlen", "preemptions")
    arms = list(summary)
    fig, axes = plt.subplots(1, len(columns), figsize=(4 * len(columns), 3.4))
    for ax, column in zip(axes, columns):
        cells = [summary[a][column] or {"mean": 0, "min": 0, "max": 0} for a in arms]
        means = [c["mean"] for c in cells]
        spread = [[c["mean"] - c["min"] for c in cells], [c["max"] - c["mean"] for c in cells]]
        ax.bar(arms, means, yerr=spread, capsize=3, color="#4c72b0")
        ax.set_title(column.replace("_", " "))
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
