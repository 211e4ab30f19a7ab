"""Online correction benchmark: does the predictor service's per-role correction help or hurt?

For each grouped split of the real dev traces: train the predictor on the training workflows,
predict the held-out ones, then replay the held-out stages workflow after workflow (stage order
within each) through `predictor_service.online.OnlineCorrection`, as the service does: each
stage is answered with the current factors, then observed with its actual length. Scenarios:
no drift, and after the first third of the replay every actual length × 1.6 or × 0.6 (as if a
new LLM version answered longer or shorter). Scored on the last two thirds: share above the
reserve, over-reservation (Σ max(0, reserve − actual) / Σ actual), MAE, Kendall τ. Variants:
off, `undamped` (one global margin, no dead zone, reserve scaled by the tokens factor: the
earlier service's rule) and the default.

    python -m benchmarks.service.online_correction [--traces FILE] [--splits 5] \
        [--out benchmarks/results/online_correction.json]
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from benchmarks.predictor.recipe import recipes, split_arguments
from maestro.contract import read_traces
from pipelines.featurize import grouped_split
from pipelines.predictor import Predictor
from predictor_service.engine import oof_bias, promised_miss_rate
from predictor_service.online import CorrectionConfig, OnlineCorrection

SCENARIOS = {"no drift": 1.0, "longer x1.6": 1.6, "shorter x0.6": 0.6}


def variants(predictor: Predictor) -> dict:
    baseline, role_baselines = oof_bias(predictor)
    alpha, clock = promised_miss_rate(predictor), (lambda: 0.0)  # a replay: no time passes, nothing decays
    return {
        "off": None,
        "undamped": OnlineCorrection(CorrectionConfig(significance=0, reserve_step=0), baseline, None, alpha, clock),
        "default": OnlineCorrection(CorrectionConfig(), baseline, role_baselines, alpha, clock),
    }


def replay(stages, answers, scale: float, correction: OnlineCorrection | None) -> dict:
    order = sorted(range(len(stages)), key=lambda i: (stages[i].workflow_id, stages[i].call_index or 0))
    drift_from = len(order) // 3
    actual = np.array([stages[i].output_tokens * (scale if k >= drift_from else 1.0) for k, i in enumerate(order)])
    pred, reserve = np.empty(len(order)), np.empty(len(order))
    for k, i in enumerate(order):
        role, answer = stages[i].role, answers[i]
        if correction is None:
            pred[k], reserve[k] = answer.tokens_pred, answer.tokens_reserve
            continue
        pred[k], reserve[k], _, _ = correction.apply(role, answer.tokens_pred, answer.tokens_reserve)
        correction.update(role, answer.tokens_pred, actual[k], answer.tokens_reserve)
    y, pred, reserve = actual[drift_from:], pred[drift_from:], reserve[drift_from:]
    return {
        "above_reserve": float(np.mean(y > reserve)),
        "over_reservation": float(np.maximum(0, reserve - y).sum() / y.sum()),
        "mae": float(np.mean(np.abs(pred - y))),
        "kendall_tau": float(kendalltau(pred, y)[0]),
    }


def main() -> None:
    args = split_arguments(__doc__, "online_correction.json")
    stages = read_traces(args.traces).stages
    feat, config = recipes()["maestro"]
    runs = []
    for seed in range(args.splits):
        train_idx, test_idx = grouped_split(stages, 0.25, seed)
        predictor = Predictor.train([stages[i] for i in train_idx], feat, config)
        test = [stages[i] for i in test_idx]
        answers = predictor.predict(test)
        runs.append(
            {
                scenario: {
                    name: replay(test, answers, scale, correction) for name, correction in variants(predictor).items()
                }
                for scenario, scale in SCENARIOS.items()
            }
        )
        print(f"split {seed}: {json.dumps(runs[-1]['no drift']['default'])}", flush=True)
    mean = {
        scenario: {
            name: {
                metric: round(float(np.mean([r[scenario][name][metric] for r in runs])), 4)
                for metric in runs[0][scenario][name]
            }
            for name in runs[0][scenario]
        }
        for scenario in SCENARIOS
    }
    ratios = {
        scenario: {
            name: {metric: round(value / table["off"][metric], 3) for metric, value in row.items()}
            for name, row in table.items()
            if name != "off"
        }
        for scenario, table in mean.items()
    }
    result = {"traces": args.traces, "splits": args.splits, "mean": mean, "vs_off": ratios, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"mean": mean, "vs_off": ratios}, indent=1))


if __name__ == "__main__":
    main()
