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
    table = frame.assign(bin=index).groupby("bin").agg(predicted=("p_tool", "mean"), observed=("is_tool", "mean"),
                                                       count=("p_tool", "size"))
    return table.reset_index()


def error_by_role(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    mae = lambda f: (f["tokens_pred"] - f["tokens"]).abs().groupby(f["role"], observed=True).mean()
    return pd.DataFrame({"model_mae": mae(frames["model"]), "role_median_mae": mae(frames["role_median"]),
                         "count": frames["model"].groupby("role", observed=True).size()}).reset_index()


def write_plots(frames: dict[str, pd.DataFrame], out: Path, max_points: int = 3000) -> list[Path]:
    model = frames["model"]
    calibration = calibration_table(model)
    sample = model.sample(min(max_points, len(model)), random_state=0)
    by_role = error_by_role(frames).sort_values("count", ascending=False).head(25)
    calibration.to_csv(out / "calibration.csv", index=False)
    sample[["tokens", "tokens_pred", "tokens_reserve"]].rename(columns={"tokens": "actual"}).to_csv(
        out / "pred_vs_actual.csv", index=False)
    by_role.to_csv(out / "error_by_role.csv", index=False)
    return [_calibration_png(calibration, out), _scatter_png(sample, out), _roles_png(by_role, out)]


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _calibration_png(table: pd.DataFrame, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "--", color="grey", label="perfect")
    ax.plot(table["predicted"], table["observed"], "o-", label="isotonic-calibrated p_tool")
    ax.set(xlabel="predicted P(tool call)", ylabel="observed tool-call rate", title="Calibration")
    ax.legend()
    return _save(fig, out / "calibration.png")


def _scatter_png(sample: pd.DataFrame, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 5))
    ax.scatter(sample["tokens"] + 1, sample["tokens_pred"] + 1, s=4, alpha=0.35, label="prediction")
    ax.scatter(sample["tokens"] + 1, sample["tokens_reserve"] + 1, s=4, alpha=0.25, label="reserve")
    top = max(sample["tokens"].max(), sample["tokens_reserve"].max()) + 1
    ax.plot([1, top], [1, top], "--", color="grey")
    ax.set(xscale="log", yscale="log", xlabel="actual output tokens + 1", ylabel="predicted + 1",
           title="Predicted vs actual (test split)")
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
