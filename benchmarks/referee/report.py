"""The referee's outputs: the JSON other tools read, a Markdown table and a plot."""

from __future__ import annotations

import json
from pathlib import Path

COLUMNS = (("slo_attainment", "SLO attainment", 3), ("e2e_p95_s", "p95 workflow time (s)", 0))
DIFFERENCE_COLUMNS = (("slo_attainment", "SLO attainment (pp)", 1, 100.0),)
# counters shown beside each arm's figures (`counters.<rate>.<arm>`, the mean run): key, title, digits
COUNTER_COLUMNS = (
    ("num_preemptions", "preemptions", 0),
    ("oom_rate", "OOM rate", 3),
    ("num_rejected", "turned away", 0),
    ("num_abandoned", "abandoned", 0),
    ("interactive_queue_p95_s", "interactive queueing p95 (s)", 2),
    ("turn_attainment", "turns on time", 3),  # where the scenario has interactive turns (mixed-class)
    ("interactive_turn_p95_s", "finished turns' p95 (s)", 2),
)

OPTIONAL = {"turn_attainment", "interactive_turn_p95_s"}  # columns shown only where some arm counted them


def cell(stat: dict, digits: int = 3, scale: float = 1.0, signed: bool = False) -> str:
    """`mean [lo, hi]` of one {mean, lo, hi} figure (× `scale`); "unfinished" where the mean is null (an unfinished
    p95 workflow), the mean alone where the interval is."""
    if stat["mean"] is None:
        return "unfinished"
    sign = "+" if signed else ""
    text = f"{scale * stat['mean']:{sign}.{digits}f}"
    if stat["lo"] is not None and stat["hi"] is not None:
        text += f" [{scale * stat['lo']:{sign}.{digits}f}, {scale * stat['hi']:{sign}.{digits}f}]"
    return text


def counter_cell(value: float | None, digits: int) -> str:
    """A counter's mean run; "–" where the run did not count it (a report written before the counter existed)."""
    return "–" if value is None else f"{value:.{digits}f}"


def rate_tables(
    report: dict, heading, columns=COLUMNS, difference_columns=DIFFERENCE_COLUMNS, counter_columns=()
) -> list[str]:
    """Per rate: `heading(rate, row)`, a table of every arm's figures (and its `counter_columns`), and one of the
    differences (signed)."""
    lines = []
    for rate, row in report["results"].items():
        arms = [a for a in row if a != "ceiling"]
        counted = report["counters"][rate]
        shown = [c for c in counter_columns if c[0] not in OPTIONAL or any(c[0] in counted[a] for a in arms)]
        titles = [t for _, t, _ in columns] + [t for _, t, _ in shown]
        lines += [heading(rate, row), "", "| arm | " + " | ".join(titles) + " |", "|---" * (len(titles) + 1) + "|"]
        lines += [
            f"| {arm} | "
            + " | ".join(
                [cell(row[arm][k], d) for k, _, d in columns]
                + [counter_cell(counted[arm].get(k), d) for k, _, d in shown]
            )
            + " |"
            for arm in arms
        ]
        lines += [
            "",
            "| difference | " + " | ".join(t for _, t, _, _ in difference_columns) + " |",
            "|---" * (len(difference_columns) + 1) + "|",
        ]
        lines += [
            f"| {name} | "
            + " | ".join(cell(diff[k], d, scale, signed=True) for k, _, d, scale in difference_columns)
            + " |"
            for name, diff in report["differences"][rate].items()
        ]
        lines.append("")
    return lines


def per_rate(rate: str, row: dict) -> str:
    return f"**{rate} workflows/s** (ceiling {row['ceiling']:.3f})"


def table(report: dict) -> str:
    lines = [
        f"Side `{report['side']}`, scenario `{report['scenario']}`"
        + (f" (regime `{report['regime']}`)" if report.get("regime") else "")
        + f", cost `{report['cost']}`, {report['seeds']} seeds, {report['workflows']} workflows a run on "
        f"{report['nodes']} nodes, SLO per app from the training side × {report['slo']['scale']}; rates "
        f"{'found by `' + report['rates_found_by'] + '`' if report['rates_found_by'] else 'given'}; variants "
        f"tried on this referee: {report['variants_tried']}. Cells: mean over seeds [95 % paired bootstrap]; "
        "counters: the mean run.",
        "",
    ]
    if not report["folds"]:
        return "\n".join(lines + rate_tables(report, per_rate, counter_columns=COUNTER_COLUMNS))
    by_fold = report["pooled"]["rates_by_fold"]
    lines += [
        f"Pooled over the folds ({', '.join(f['split'] for f in report['folds'])}) by {report['pooled']['by']}.",
        "",
    ]
    lines += rate_tables(
        report,
        lambda key, row: (
            f"**{key}** (pooled; rates/s by fold: "
            + ", ".join(f"{split} {rate}" for split, rate in by_fold[key].items())
            + f"; ceiling {row['ceiling']:.3f})"
        ),
        counter_columns=COUNTER_COLUMNS,
    )
    for fold in report["folds"]:
        lines += [f"### Fold `{fold['split']}` (replayed; trained on the rest)", ""]
        lines += rate_tables(fold, per_rate, counter_columns=COUNTER_COLUMNS)
    return "\n".join(lines)


def plot(report: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(report["results"])
    arms = [a for a in report["results"][rates[0]] if a != "ceiling"]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    is_numeric = (
        not report["folds"] or report["rates_found_by"] is None
    )  # pooled auto rates are names (light, knee, ...)
    x = [float(r) for r in rates] if is_numeric else list(range(len(rates)))
    ax.plot(x, [report["results"][r]["ceiling"] for r in rates], "k--", label="ceiling")
    for arm in arms:
        stats = [report["results"][r][arm]["slo_attainment"] for r in rates]
        mean = [s["mean"] for s in stats]
        ax.errorbar(
            x,
            mean,
            yerr=[[m - s["lo"] for m, s in zip(mean, stats)], [s["hi"] - m for m, s in zip(mean, stats)]],
            marker="o",
            capsize=3,
            label=arm,
        )
    ax.set(
        xlabel="workflow arrivals/s" if is_numeric else "load (each fold's own rates, pooled by index)",
        ylabel="SLO attainment (95 % CI)",
        xscale="log" if is_numeric else "linear",
        title=f"referee, {report['scenario']}, side '{report['side']}' ({report['seeds']} seeds)",
    )
    if not is_numeric:
        ax.set_xticks(x, rates)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out.with_suffix(".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(report: dict, out: Path) -> list[Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    text = table(report)
    out.with_suffix(".md").write_text(text + "\n")
    print(text)
    return [out, out.with_suffix(".md"), plot(report, out)]
