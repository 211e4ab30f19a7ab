"""The workflow-level predictor (pipelines.workflow_remaining) on the real traces: remaining calls and tokens of a
workflow when each of its stages becomes ready, against the per-(app, position) median of the training side and
the app's median length minus the position.

The dev traces and the tau2 agent traces are read together (six apps) and cut by the locked split
(pipelines.featurize.locked_split, a hash of the task id, the stage benchmarks' 0.3). Variants are compared by a
3-fold task-grouped CV of the training side (`--variants`); the chosen one is trained on the whole training side
and scored once on the locked test side (`--held-out NAME`). Both history conditions: "with_history" (the
ancestors' outcomes known), "without_history" (every label stripped). Figures pooled over stages and per app:
Kendall τ, MAE (and as a multiple of the position median's), the share of stages above the upper bound. Cost: one
stage predicted alone with its finished ancestors in a StageHistory, its prompt never seen, on one thread: p50 /
p99 ms over the scored stages of the last model trained.

    python -m benchmarks.predictor.workflow [--variants NAME ...] [--held-out NAME ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold
from tqdm import tqdm

from maestro.contract import StageTrace, read_traces, task_id
from pipelines.features import StageHistory
from pipelines.featurize import locked_split
from pipelines.params import load_params
from pipelines.workflow_metrics import CONDITIONS, baselines, model_frame, score, truth_frame
from pipelines.workflow_remaining import WorkflowConfig, WorkflowRemainingModel

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
FILES = [DATA / "dev-traces" / "dev_traces.jsonl", *sorted((DATA / "agent-traces").glob("*.jsonl"))]
TEST_FRACTION = 0.3  # the stage benchmarks' locked split (benchmarks/predictor/recipe.py)
INNER_FOLDS = 3
TIMED_STAGES = 300
CHOSEN = "tail 1024, calibrated per position band at 0.75 alpha"
# name → changes to WorkflowConfig; pipelines/EXPERIMENTS.md logs what each measured. The first recipe tried, which
# the earlier variants change: the tail's last 256 characters, conformal levels at alpha, no position bands.
FIRST = dict(tail_chars=256, calibration_share=1.0, calibration_bands=())
VARIANTS = {
    "first": FIRST,
    "no tail scores": dict(FIRST, lexical=False),
    "leaves 31": dict(FIRST, booster=dict(num_leaves=31, min_child_samples=10)),
    "600 rounds x 0.025": dict(FIRST, booster=dict(n_estimators=600, learning_rate=0.025)),
    "position medians": dict(FIRST, position_medians=True),
    "tail 1024": dict(FIRST, tail_chars=1024),
    "calibrated at 0.75 alpha": dict(FIRST, calibration_share=0.75),
    "calibrated per position band": dict(FIRST, calibration_bands=(3, 10, 25)),
    # chosen by the inner CV: WorkflowConfig's defaults
    "tail 1024, calibrated per position band at 0.75 alpha": {},
    # issue 35, the task as the prompt's head shows it (pipelines.workflow_head), over the defaults
    "head 2048": dict(head_chars=2048),
    "head 2048, no counts": dict(head_chars=2048, head_counts=False),
    "head 1024": dict(head_chars=1024),
    "head 2048, centred per (app, position)": dict(head_chars=2048, head_centred=True),
}


def variant_config(name: str) -> WorkflowConfig:
    alpha = load_params("train", REPO / "params.yaml")["alpha"]
    base = WorkflowConfig(alpha=alpha)
    change = dict(VARIANTS[name])
    booster = {**base.booster, **change.pop("booster", {})}
    return replace(base, booster=booster, **change)


def read_stages() -> list[StageTrace]:
    return [stage for path in FILES for stage in read_traces(path).stages]


def evaluate(
    config: WorkflowConfig, fit_on: list[StageTrace], score_on: list[StageTrace]
) -> tuple[WorkflowRemainingModel, dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """Fit on one side, answer the other in both conditions; the baselines from the fitted side."""
    model = WorkflowRemainingModel(config).fit(fit_on)
    truth = truth_frame(score_on)
    frames = {c: model_frame(model, score_on, truth, c) for c in CONDITIONS}
    return model, frames, baselines(truth_frame(fit_on), truth)


def pooled(parts: list[tuple[dict, dict]]) -> dict:
    """score() of frames concatenated over folds, per condition."""
    out = {}
    for condition in CONDITIONS:
        frame = pd.concat([p[0][condition] for p in parts], ignore_index=True)
        base = {k: pd.concat([p[1][k] for p in parts], ignore_index=True) for k in parts[0][1]}
        out[condition] = score(frame, base)
    return out


def predict_cost_ms(model: WorkflowRemainingModel, stages: list[StageTrace]) -> dict:
    """Each stage predicted alone, its workflow's earlier finished stages in a StageHistory: p50 / p99 ms."""
    by_workflow: dict[str, list[StageTrace]] = {}
    for stage in stages:
        by_workflow.setdefault(stage.workflow_id, []).append(stage)
    times = []
    for stage in stages[:TIMED_STAGES]:
        history = StageHistory()
        history.add([s for s in by_workflow[stage.workflow_id] if s.call_index < stage.call_index])
        alone = stage.model_copy(update={"output_tokens": None, "is_tool_call": None})
        started = time.perf_counter()
        model.predict([alone], history)
        times.append((time.perf_counter() - started) * 1000)
    return {"p50": round(float(np.percentile(times, 50)), 3), "p99": round(float(np.percentile(times, 99)), 3)}


def inner_cv(train: list[StageTrace], names: list[str]) -> dict:
    groups = np.array([task_id(s) for s in train])
    splits = list(GroupKFold(INNER_FOLDS).split(train, groups=groups))
    out = {}
    with tqdm(total=len(names) * len(splits), desc="inner CV", unit="fit") as bar:
        for name in names:
            parts, started = [], time.perf_counter()
            for inner, held in splits:
                model, frames, base = evaluate(
                    variant_config(name), [train[i] for i in inner], [train[i] for i in held]
                )
                parts.append((frames, base))
                bar.update()
            out[name] = {
                "seconds": round(time.perf_counter() - started, 1),
                "predict_ms": predict_cost_ms(model, [train[i] for i in held]),
                **pooled(parts),
            }
    return out


def markdown(results: dict) -> str:
    """One row per arm and condition: pooled τ, MAE against the position median, and the worst app's share above."""
    lines = [
        "| arm | history | τ calls | τ tokens | MAE calls × | MAE tokens × | above (calls), worst app |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm, result in results.items():
        for condition in CONDITIONS:
            scored = result[condition]
            for who in ("model", "position_median", "length_minus_position"):
                if who != "model" and arm != next(iter(results)):
                    continue  # the baselines once: the same on every arm's folds
                q = scored["pooled"][who]
                worst = max(
                    ((a, s[who].get("over_calls")) for a, s in scored["by_app"].items()),
                    key=lambda x: -1 if x[1] is None else x[1],
                )
                above = f"{worst[1]:.3f} ({worst[0]})" if worst[1] is not None else "–"
                lines.append(
                    f"| {arm if who == 'model' else who} | {condition} | {q['tau_calls']} | "
                    f"{q['tau_tokens']} | {q.get('mae_calls_vs_position_median')} | "
                    f"{q.get('mae_tokens_vs_position_median')} | {above} |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="*", choices=list(VARIANTS), default=[CHOSEN])
    parser.add_argument(
        "--held-out", nargs="*", choices=list(VARIANTS), default=[], help="score these once on the locked test side"
    )
    parser.add_argument("--out", default="benchmarks/results/workflow_predictor.json")
    args = parser.parse_args()
    stages = read_stages()
    train_idx, test_idx = locked_split(stages, TEST_FRACTION)
    train, test = [stages[i] for i in train_idx], [stages[i] for i in test_idx]
    result = {
        "stages": {"train": len(train), "test": len(test)},
        "variants": VARIANTS,
        "inner_cv": inner_cv(train, args.variants) if args.variants else {},
    }
    result["held_out"] = {}
    for name in args.held_out:  # several: the same run's figures side by side (the chosen one against the default)
        model, frames, base = evaluate(variant_config(name), train, test)
        result["held_out"][name] = {"predict_ms": predict_cost_ms(model, test), **pooled([(frames, base)])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    for part in ("inner_cv", "held_out"):
        if result.get(part):
            print(f"\n{part}\n{markdown(result[part])}")
            print({arm: r["predict_ms"] for arm, r in result[part].items()})


if __name__ == "__main__":
    main()
