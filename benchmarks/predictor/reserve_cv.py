"""Reserve variants chosen by inner grouped CV on the training side of the locked split (its test side is never
read): the bound model's quantile × the calibration groups' minimum size.

For each data set, the locked split's training side is cut into 3 task-grouped folds; Maestro's recipe
(params.yaml) is trained on two and scored on the third, with and without history. Fitting the reserve is the
model's last step, so each fold's model is fitted once and only its reserve is refitted per variant (the inputs
of `TwoStageModel.fit_reserve` are recorded at the first fit, by a subclass). Figures pooled over the folds: the share
of stages above the reserve, the reserve's waste against the per-role p90's, and the worst (fold, app) share above.

    python -m benchmarks.predictor.reserve_cv [--data dev agent] [--out benchmarks/results/reserve_cv.json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold

from benchmarks.predictor.recipe import DATA, TEST_FRACTION, predictions_frame, read_stages, recipes
from pipelines.features import Featurizer
from pipelines.featurize import locked_split
from pipelines.history import without_labels
from pipelines.metrics import role_baselines
from pipelines.model import TwoStageModel
from pipelines.predictor import Predictor, label_frame, training_frame

VARIANTS = {
    "q0.955 m40": dict(bound_quantile=None, min_group_calibration=40),
    "q0.9 m40": dict(bound_quantile=0.9, min_group_calibration=40),
    "q0.8 m40": dict(bound_quantile=0.8, min_group_calibration=40),
    "q0.955 m100": dict(bound_quantile=None, min_group_calibration=100),
    "q0.9 m100": dict(bound_quantile=0.9, min_group_calibration=100),
}


class ReserveRecorder(TwoStageModel):
    """TwoStageModel keeping the inputs of its reserve fit, so that the reserve alone can be refitted."""

    def fit_reserve(self, *inputs) -> None:
        self.reserve_inputs = inputs
        super().fit_reserve(*inputs)


def waste(frame: pd.DataFrame) -> float:
    return float(np.maximum(0, frame["tokens_reserve"] - frame["tokens"]).sum())


def cross_validate(data: str, folds: int = 3) -> dict:
    stages = read_stages(DATA[data])
    train = [stages[i] for i in locked_split(stages, TEST_FRACTION)[0]]
    groups = label_frame(train)["group"].to_numpy()
    features, model = recipes()["maestro"]
    rows = []
    for fold, (inner, held) in enumerate(GroupKFold(folds).split(train, groups=groups)):
        fit_on, score_on = [train[i] for i in inner], [train[i] for i in held]
        featurizer = Featurizer(features).fit(fit_on)
        recorder = ReserveRecorder(model)
        predictor = Predictor.fit(featurizer, *training_frame(featurizer, fit_on, model.seed), model=recorder)
        labels = label_frame(score_on)
        p90 = role_baselines(label_frame(fit_on), labels, model.rho, model.alpha)["role_p90"]
        for name, change in VARIANTS.items():
            recorder.config = replace(model, **change)
            recorder.fit_reserve(*recorder.reserve_inputs)
            for condition, part in (("with_history", score_on), ("without_history", map(without_labels, score_on))):
                frame = predictions_frame(predictor, list(part), labels)
                above = frame["tokens"] > frame["tokens_reserve"]
                rows.append(
                    {
                        "variant": name,
                        "condition": condition,
                        "fold": fold,
                        "n": len(frame),
                        "above": int(above.sum()),
                        "waste": waste(frame),
                        "p90_waste": waste(p90),
                        "worst_app_above": float(above.groupby(frame["app"]).mean().max()),
                    }
                )
    table = pd.DataFrame(rows)
    return {
        f"{v} {c}": {
            "above": round(g["above"].sum() / g["n"].sum(), 4),
            "waste_x_role_p90": round(g["waste"].sum() / g["p90_waste"].sum(), 3),
            "worst_fold_app_above": round(g["worst_app_above"].max(), 3),
        }
        for (v, c), g in table.groupby(["variant", "condition"], sort=False)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", choices=sorted(DATA), default=sorted(DATA))
    parser.add_argument("--out", default="benchmarks/results/reserve_cv.json")
    args = parser.parse_args()
    result = {data: cross_validate(data) for data in args.data}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    for data, table in result.items():
        for name, figures in table.items():
            print(f"{data:6s} {name:28s} {figures}")


if __name__ == "__main__":
    main()
