"""Evaluation plots: CSVs for `dvc plots` and PNGs for people and MLflow."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def calibration_table(frame: pd.DataFrame, bins: int = 10) -> pd.DataFrame:
    edges = np.linspace(0, 1, bins + 1)
    index = np.clip(np.digitize(frame["p_tool"], edges[1:-1]), 0, bins - 1)
    table = (
        frame.assign(bin=index)
        .groupby("bin")
        .agg(predicted=("p_tool", "mean"), observed=("is_tool", "mean"), count=("p_tool", "size"))
    )
    return table.reset_index()


def error_by_role(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    mae = lambda f: (f["tokens_pred"] - f["tokens"]).abs().groupby(f["role"], observed=True).mean()
    return pd.DataFrame(
        {
            "model_mae": mae(frames["model"]),
            "role_median_mae": mae(frames["role_median"]),
            "count": frames["model"].groupby("role", observed=True).size(),
        }
    ).reset_index()


def write_plots(frames: dict[str, pd.DataFrame], out: Path, max_points: int = 3000) -> list[Path]:
    model = frames["model"]
    calibration = calibration_table(model)
    sample = model.sample(min(max_points, len(model)), random_state=0)
    by_role = error_by_role(frames).sort_values("count", ascending=False).head(25)
    calibration.to_csv(out / "calibration.csv", index=False)
    sample[["tokens", "tokens_pred", "tokens_reserve"]].rename(columns={"tokens": "actual"}).to_csv(
        out / "pred_vs_actual.csv", index=False
    )
    by_role.to_csv(out / "error_by_role.csv", index=False)
    tradeoff = reserve_tradeoff(frames)
    tradeoff.to_csv(out / "reserve_tradeoff.csv", index=False)
    return [
        _calibration_png(calibration, out),
        _scatter_png(sample, out),
        _roles_png(by_role, out),
        _tradeoff_png(tradeoff, out),
    ]


SHIFTS = np.linspace(-0.6, 0.6, 25)  # the reserve scaled by e^shift, shift 0 the model's own


def reserve_tradeoff(frames: dict[str, pd.DataFrame], shifts: np.ndarray = SHIFTS) -> pd.DataFrame:
    """What a reserve costs against what it misses: the model's reserve scaled by e^shift (shift 0 is the
    calibrated one), and each baseline's single point. Over-reservation as in `metrics.quality`."""
    rows = []
    for name, frame in frames.items():
        tokens, reserve = frame["tokens"].to_numpy(float), frame["tokens_reserve"].to_numpy(float)
        for shift in shifts if name == "model" else [0.0]:
            scaled = reserve * np.exp(shift)
            rows.append(
                {
                    "reserve": name,
                    "log_shift": round(float(shift), 3),
                    "above_reserve": float(np.mean(tokens > scaled)),
                    "over_reservation": float(np.maximum(0, scaled - tokens).sum() / max(tokens.sum(), 1)),
                }
            )
    return pd.DataFrame(rows)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _calibration_png(table: pd.DataFrame, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "--", color="grey", label="perfect")
    ax.plot(table["predicted"], table["observed"], "o-", label="calibrated p_tool")
    ax.set(xlabel="predicted P(tool call)", ylabel="observed tool-call rate", title="Calibration")
    ax.legend()
    return _save(fig, out / "calibration.png")


def _scatter_png(sample: pd.DataFrame, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 5))
    ax.scatter(sample["tokens"] + 1, sample["tokens_pred"] + 1, s=4, alpha=0.35, label="prediction")
    ax.scatter(sample["tokens"] + 1, sample["tokens_reserve"] + 1, s=4, alpha=0.25, label="reserve")
    top = max(sample["tokens"].max(), sample["tokens_reserve"].max()) + 1
    ax.plot([1, top], [1, top], "--", color="grey")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="actual output tokens + 1",
        ylabel="predicted + 1",
        title="Predicted vs actual (test split)",
    )
    ax.legend()
    return _save(fig, out / "pred_vs_actual.png")


def _roles_png(by_role: pd.DataFrame, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, max(3, 0.3 * len(by_role))))
    y = np.arange(len(by_role))
    ax.barh(y - 0.2, by_role["role_median_mae"], height=0.4, label="per-role median")
    ax.barh(y + 0.2, by_role["model_mae"], height=0.4, label="Maestro predictor")
    ax.set_yticks(y, by_role["role"].astype(str))
    ax.set(xlabel="MAE (tokens)", title="Error by role")
    ax.legend()
    return _save(fig, out / "error_by_role.png")


def _tradeoff_png(table: pd.DataFrame, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 5))
    curve = table[table["reserve"] == "model"]
    ax.plot(curve["above_reserve"], curve["over_reservation"], "-", color="C0", label="Maestro reserve × e^shift")
    at = curve[curve["log_shift"] == 0]
    ax.plot(at["above_reserve"], at["over_reservation"], "o", color="C0", label="Maestro reserve (calibrated)")
    for i, row in enumerate(table[table["reserve"] != "model"].itertuples()):
        ax.plot(row.above_reserve, row.over_reservation, "s", color=f"C{i + 1}", label=row.reserve)
    ax.set(
        xlabel="share of stages above their reserve",
        ylabel="over-reservation (wasted / used tokens)",
        title="Reserve: misses against waste (test split)",
    )
    ax.legend(fontsize=8)
    return _save(fig, out / "reserve_tradeoff.png")
