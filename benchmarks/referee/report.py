"""The referee's outputs: the JSON other tools read, a Markdown table and a plot."""
from __future__ import annotations

import json
from pathlib import Path


def _cell(stat: dict, digits: int = 3) -> str:
    if stat["mean"] is None:
        return "unfinished"
    lo, hi = stat["lo"], stat["hi"]
    bounds = f" [{lo:.{digits}f}, {hi:.{digits}f}]" if lo is not None and hi is not None else ""
    return f"{stat['mean']:.{digits}f}{bounds}"


def table(report: dict) -> str:
    lines = [f"Side `{report['side']}`, {report['seeds']} seeds, {report['workflows']} workflows a run on "
             f"{report['nodes']} nodes, SLO per app from the training side × {report['slo']['scale']}; variants "
             f"tried on this referee: {report['variants_tried']}. Cells: mean over seeds [95 % paired bootstrap].", ""]
    for rate, row in report["results"].items():
        arms = [a for a in row if a != "ceiling"]
        lines += [f"**{rate} workflows/s** (ceiling {row['ceiling']:.3f})", "",
                  "| arm | SLO attainment | p95 workflow time (s) |", "|---|---|---|"]
        lines += [f"| {arm} | {_cell(row[arm]['slo_attainment'])} | {_cell(row[arm]['e2e_p95_s'], 0)} |" for arm in arms]
        lines += ["", "| difference | SLO attainment (pp) |", "|---|---|"]
        for name, diff in report["differences"][rate].items():
            s = diff["slo_attainment"]
            lines.append(f"| {name} | {100 * s['mean']:+.1f} [{100 * s['lo']:+.1f}, {100 * s['hi']:+.1f}] |")
        lines.append("")
    return "\n".join(lines)


def plot(report: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(report["results"])
    arms = [a for a in report["results"][rates[0]] if a != "ceiling"]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    x = [float(r) for r in rates]
    ax.plot(x, [report["results"][r]["ceiling"] for r in rates], "k--", label="ceiling")
    for arm in arms:
        stats = [report["results"][r][arm]["slo_attainment"] for r in rates]
        mean = [s["mean"] for s in stats]
        ax.errorbar(x, mean, yerr=[[m - s["lo"] for m, s in zip(mean, stats)], [s["hi"] - m for m, s in zip(mean, stats)]],
                    marker="o", capsize=3, label=arm)
    ax.set(xlabel="workflow arrivals/s", ylabel="SLO attainment (95 % CI)", xscale="log",
           title=f"referee, side '{report['side']}' ({report['seeds']} seeds)")
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
