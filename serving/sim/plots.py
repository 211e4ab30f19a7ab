"""PNG plots next to the simulation JSON: one panel per headline metric, one figure per regime."""

from __future__ import annotations

from pathlib import Path

PANELS = (
    ("slo_attainment", "SLO attainment", None),
    ("e2e_s", "mean e2e (s)", "mean"),
    ("interactive_queue_delay_s", "interactive queue delay (s)", "mean"),
    ("kv_reserved_frac_vs_maxlen", "KV reserved / max-len", None),
)


def plot_report(report: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for regime, by_policy in report["results"].items():
        names = list(by_policy)
        fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
        for ax, (key, title, sub) in zip(axes, PANELS):
            values = [by_policy[n][key][sub] if sub else by_policy[n][key] for n in names]
            ax.bar(names, [v or 0.0 for v in values], color="tab:blue")
            ax.set_title(title, fontsize=9)
            ax.tick_params(axis="x", rotation=45, labelsize=7)
        fig.suptitle(f"{report['scenario']} · {regime} · {report['nodes']} node(s)", fontsize=10)
        fig.tight_layout()
        path = out.with_name(f"{out.stem}_{regime}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
