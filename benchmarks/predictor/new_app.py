"""An app training never saw: its reserve from the first stage, and as the service observes its stages.

Each app in turn is left out of training (the other apps' train side of the locked split). Static: the
app's test side scored with and without history, beside a model trained with the app (all apps' train
side) on the same stages: share above the reserve, waste (reserve − actual over actual tokens), how many
answers were flagged `new_app`, Kendall τ. Online replay: every stage of the app (it was never trained on)
in workflow order through the service's own `OnlineCorrection` (predictor_service.online), the served
reserve judged and then observed one stage at a time; share above the reserve and waste in windows of
50 stages, and over the 100 stages that follow the first 100 observed. The model's answers do not depend
on the correction, so they are predicted in one batch per condition; the correction runs in order.
Used by `benchmarks/predictor/recipe.py --leave-one-app-out`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from maestro.contract import StageTrace
from pipelines.embedding import make_embedder
from pipelines.features import Featurizer
from pipelines.history import without_labels
from pipelines.metrics import quality
from pipelines.new_app import NEW_APP
from pipelines.predictor import Predictor, label_frame, training_frame
from predictor_service.engine import oof_bias, promised_miss_rate
from predictor_service.online import OnlineCorrection, coverage_group

WINDOW = 50  # stages per window of the replay curve
OBSERVED_FIRST = 100  # "after 100 observed stages": the next 100 are scored
CONDITIONS = ("with_history", "without_history")


def train_shared(stages: list[StageTrace], recipe: tuple, embedder) -> Predictor:
    """Predictor.train's fit with one embedder (and its cache) shared across the leave-one-out trainings."""
    features, model = recipe
    featurizer = Featurizer(features, embedder).fit(stages)
    return Predictor.fit(featurizer, *training_frame(featurizer, stages, model.seed), model)


def answers_frame(predictor: Predictor, stages: list[StageTrace], condition: str) -> pd.DataFrame:
    """The model's uncorrected answers and the labels, with history (the file as it is) or without (stripped)."""
    given = stages if condition == "with_history" else [without_labels(s) for s in stages]
    answers = predictor.predict(given)
    return label_frame(stages).assign(
        **{
            k: [getattr(a, k) for a in answers]
            for k in ("p_tool", "tokens_pred", "tokens_reserve", "fallback_level", "history")
        }
    )


def static_figures(frame: pd.DataFrame, with_app: pd.DataFrame) -> dict:
    new, known = quality(frame), quality(with_app)
    return {
        "n": new["n"],
        "above": round(new["under_rate"], 4),
        "waste": round(new["over_reservation"], 3),
        "with_app_above": round(known["under_rate"], 4),
        "with_app_waste": round(known["over_reservation"], 3),
        "waste_vs_with_app": round(new["over_reservation"] / max(known["over_reservation"], 1e-9), 2),
        "kendall_tau": None if new["kendall_tau"] is None else round(new["kendall_tau"], 3),
        "with_app_kendall_tau": None if known["kendall_tau"] is None else round(known["kendall_tau"], 3),
        "flagged_new_app": round(float(frame["fallback_level"].eq(NEW_APP).mean()), 4),
    }


def replay(predictor: Predictor, frame: pd.DataFrame) -> pd.DataFrame:
    """The stages of `frame` (in order) through the service's online correction: each served, then observed."""
    baseline, role_baselines = oof_bias(predictor)
    corrections = OnlineCorrection(None, baseline, role_baselines, promised_miss_rate(predictor), clock=lambda: 0.0)
    served = []
    for row in frame.itertuples(index=False):
        group, is_new = coverage_group(row.app, row.role, row.history), row.fallback_level == NEW_APP
        served.append(corrections.apply(row.role, row.tokens_pred, row.tokens_reserve, group, is_new)[1])
        corrections.update(row.role, row.tokens_pred, row.tokens, row.tokens_reserve, group, is_new)
    return frame.assign(served_reserve=served, seen_roles_moved=len(corrections.snapshot()))


def windows(replayed: pd.DataFrame) -> list[dict]:
    """Share above the served reserve and waste in consecutive windows of WINDOW stages."""
    out = []
    for start in range(0, len(replayed), WINDOW):
        part = replayed.iloc[start : start + WINDOW]
        y, reserve = part["tokens"].to_numpy(float), part["served_reserve"].to_numpy(float)
        out.append(
            {
                "first_stage": start + 1,
                "n": len(part),
                "above": round(float(np.mean(y > reserve)), 4),
                "waste": round(float(np.maximum(0, reserve - y).sum() / max(y.sum(), 1)), 3),
            }
        )
    return out


def after_observed(replayed: pd.DataFrame) -> dict:
    part = replayed.iloc[OBSERVED_FIRST : 2 * OBSERVED_FIRST]
    y, reserve = part["tokens"].to_numpy(float), part["served_reserve"].to_numpy(float)
    return {
        "n": len(part),
        "above": round(float(np.mean(y > reserve)), 4),
        "waste": round(float(np.maximum(0, reserve - y).sum() / max(y.sum(), 1)), 3),
    }


def in_workflow_order(stages: list[StageTrace]) -> list[StageTrace]:
    """Workflows one after another in the order they first appear, each one's stages in call order."""
    first = {}
    for i, s in enumerate(stages):
        first.setdefault(s.workflow_id, i)
    position = {id(s): i for i, s in enumerate(stages)}
    return sorted(
        stages,
        key=lambda s: (
            first[s.workflow_id],
            s.call_index if s.call_index is not None else position[id(s)],
            position[id(s)],
        ),
    )


def leave_one_app_out(stages: list[StageTrace], train: list[StageTrace], test: list[StageTrace], recipe: tuple) -> dict:
    """Every app with stages on both sides of the split, left out in turn: static and replay figures."""
    apps = sorted({s.app for s in test} & {s.app for s in train} - {None})
    embedder = make_embedder(recipe[0].embedder)
    with_app = train_shared(train, recipe, embedder)
    out = {}
    for app in apps:
        without = train_shared([s for s in train if s.app != app], recipe, embedder)
        app_test = [s for s in test if s.app == app]
        app_all = in_workflow_order([s for s in stages if s.app == app])
        result = {"new_app_levels": without.meta.get("new_app")}
        for condition in CONDITIONS:
            result[condition] = static_figures(
                answers_frame(without, app_test, condition), answers_frame(with_app, app_test, condition)
            )
            replayed = replay(without, answers_frame(without, app_all, condition))
            result[condition]["replay"] = {
                "windows": windows(replayed),
                "after_100": after_observed(replayed),
                "seen_roles_moved": int(replayed["seen_roles_moved"].iloc[0]),
            }
        out[app] = result
    return out


def table(result: dict) -> str:
    """One line per app and condition: the static figures, then the online ones after 100 observed stages."""
    lines = [
        f"{'app':28s} {'history':8s} {'n':>4s} {'above':>6s} {'waste':>6s} {'w/app':>6s} {'ratio':>6s} "
        f"{'flag':>5s} {'tau':>6s} {'next100 above':>13s} {'waste':>6s}"
    ]
    for app, part in result.items():
        for condition in CONDITIONS:
            f, nxt = part[condition], part[condition]["replay"]["after_100"]
            lines.append(
                f"{app:28s} {condition.split('_')[0]:8s} {f['n']:4d} {f['above']:6.3f} {f['waste']:6.2f} "
                f"{f['with_app_waste']:6.2f} {f['waste_vs_with_app']:6.2f} {f['flagged_new_app']:5.2f} "
                f"{f['kendall_tau'] or float('nan'):6.3f} {nxt['above']:13.3f} {nxt['waste']:6.2f}"
            )
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    """The replay curve: share above the served reserve and waste per window, one line per app and condition,
    the model trained with the app as a dotted line of its colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (above, waste) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (app, part) in enumerate(result.items()):
        colour = f"C{i}"
        for condition, style in zip(CONDITIONS, ("-", "--")):
            rows = part[condition]["replay"]["windows"]
            x = [r["first_stage"] + r["n"] - 1 for r in rows]
            label = f"{app.removeprefix('tau2_')} ({condition.split('_')[0]} history)"
            above.plot(x, [100 * r["above"] for r in rows], style, color=colour, label=label)
            waste.plot(x, [r["waste"] for r in rows], style, color=colour)
        waste.axhline(part["with_history"]["with_app_waste"], color=colour, linestyle=":", linewidth=1)
    above.axhline(6, color="grey", linewidth=0.8)
    above.set(
        xlabel="stages of the new app observed (window end)",
        ylabel=f"% above the reserve (windows of {WINDOW})",
        ylim=(0, None),
    )
    waste.set(
        xlabel="stages of the new app observed (window end)", ylabel="waste (reserve − actual) / actual", yscale="log"
    )
    above.legend(fontsize=7)
    fig.suptitle("An app training never saw, corrected online (dotted: a model trained with the app)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
