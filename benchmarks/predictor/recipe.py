"""Predictor benchmark: Maestro's recipe against the straightforward one, on the dev traces and the
tau2 agent traces, with and without history, measured in the same run.

Straightforward recipe (the seed paper, as first implemented): MiniLM on the whole prompt
(max_seq_length 256) → PCA 32 + the basic structural features → calibrated LightGBM classifier →
asymmetric LightGBM regressor, reserve = prediction × (1+ρ), trained on the stages as they are.
Maestro's recipe: params.yaml (history copies, reserve calibrated per history condition).

Each data set is split once by the locked split (pipelines.featurize.locked_split: a hash of the
task id; no choice of the recipe was made on its test side). Both recipes are trained on the train
side and scored on the test side twice: "with_history" (the file as it is: the ancestors' outcomes
known, as live after /observe) and "without_history" (every label stripped: a stage sent alone),
overall and per app, beside the per-role baselines (median, p90, and the per-role conformal level
that promises the model's miss rate). `--leave-one-app-out` also trains Maestro's recipe without
each app in turn (benchmarks/predictor/new_app.py): that app's test side scored from its first stage beside a model
trained with it, and all its stages replayed through the service's online correction (the curve:
benchmarks/results/new_app_replay_<data>.png). `--speed` measures training time, single-stage latency (cold: a
prompt never seen, every cache emptied before the call; warm: the same prompts again; with the workflow-level model's
answer, and of the stage model alone) and batched throughput on the dev traces, for Maestro's recipe with the static
embedding ("maestro-static", the default) and with MiniLM ("maestro-minilm"), and the straightforward one, beside one
MiniLM encode of each test prompt's segment, all in the same run. Held out, the two embeddings are scored side by side
(params.yaml otherwise; `--leave-one-app-out` trains params.yaml as it is). Writes JSON.

    python benchmarks/predictor/recipe.py [--data dev agent] [--leave-one-app-out] [--speed]
    python benchmarks/predictor/recipe.py --data agent --leave-one-app-out --held-out-recipes  # an app never seen
    python benchmarks/predictor/recipe.py --data dev --unseen FILE_OR_DIR  # trained on the dev traces, scored on FILE
    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/predictor/recipe.py --data --speed \
        [--speed-recipes maestro-minilm] [--compiled-trees]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from maestro.contract import StageTrace, read_traces
from pipelines.embedding import EmbedderConfig
from pipelines.featurize import featurizer_config, locked_split
from pipelines.history import without_labels
from pipelines.lexical import LexicalConfig
from pipelines.metrics import quality, role_baselines, target_ratios
from pipelines.params import load_params
from pipelines.predictor import Predictor, label_frame
from pipelines.train import model_config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run as a file: benchmarks/predictor/new_app.py by its package name
from benchmarks.predictor import new_app  # noqa: E402
from benchmarks.predictor.speed import speed  # noqa: E402

DATA = {
    "dev": REPO.parent / "shared" / "data" / "dev-traces",
    "agent": REPO.parent / "shared" / "data" / "agent-traces",
}
DEV_TRACES = DATA["dev"] / "dev_traces.jsonl"
TEST_FRACTION = 0.3
# Recipe variants scored while choosing the recipe (pipelines/EXPERIMENTS.md lists them): about 45 on
# grouped splits of the dev traces, then one for the history conditions (history copies, reserve calibrated
# per condition), fixed before its first run; its reserve levels come from out-of-fold (inner grouped CV)
# scores of the training side only; then 5 reserve variants (the bound model's quantile × the calibration
# groups' minimum size), chosen by 3-fold inner grouped CV on the training sides of both data sets; then 8
# prompt embeddings, chosen the same way (benchmarks/predictor/embedding_cv.py); then, for an app never seen,
# the own-turn features and the new-app reserve level; then 8 more for the static embedding and the regressors'
# size, chosen by the same inner CV (pipelines/EXPERIMENTS.md, 2026-12-02); then 7 for the supervised lexical
# scores beside it (70-76, the same inner CV; none met the bar, so none reached the locked split).
VARIANTS_TRIED = 76
FIGURES = ("auc", "kendall_tau", "mae_vs_role_median", "under_rate", "over_reservation_vs_role_p90")


def recipes() -> dict:
    params = REPO / "params.yaml"
    ours = (featurizer_config(load_params("featurize", params)), model_config(load_params("train", params)))
    plain_features = replace(
        ours[0],
        feature_set="basic",
        history_copies=False,
        lexical=None,
        embedder=EmbedderConfig(tail_chars=0, max_seq_length=256),
    )
    seed_recipe = replace(ours[1], reserve_method="rho", calibration="isotonic")
    # each embedding as inner CV chose it: MiniLM's columns read by the tool-call classifier, no lexical scores; the
    # static embedding's not read by it, the lexical scores beside it (pipelines/EXPERIMENTS.md, 2026-12-02)
    embedding = {
        kind: (
            replace(
                ours[0],
                embedder=replace(ours[0].embedder, kind=kind),
                lexical=(ours[0].lexical or LexicalConfig()) if kind == "static" else None,
            ),
            replace(ours[1], classifier_embedding=kind == "minilm"),
        )
        for kind in ("static", "minilm")
    }
    return {
        "maestro": ours,
        "maestro-static": embedding["static"],
        "maestro-minilm": embedding["minilm"],
        "straightforward": (plain_features, seed_recipe),
    }


def read_stages(path: Path) -> list[StageTrace]:
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    return [stage for file in files for stage in read_traces(file).stages]


def predictions_frame(predictor: Predictor, test: list[StageTrace], labels: pd.DataFrame) -> pd.DataFrame:
    answers = predictor.predict(test)
    return labels.assign(
        **{
            k: [getattr(a, k) for a in answers]
            for k in ("p_tool", "tokens_pred", "tokens_reserve", "fallback_level", "history")
        }
    )


def figures(frame: pd.DataFrame, baselines: dict[str, pd.DataFrame]) -> dict:
    """The targets' figures of one prediction frame, and the per-role p90's share above its reserve."""
    model = quality(frame)
    scores = {name: quality(b.loc[frame.index]) for name, b in baselines.items()}
    values = {**model, **target_ratios(model, scores)}
    return {
        **{k: None if values[k] is None else round(values[k], 4) for k in FIGURES},
        "n": model["n"],
        "role_p90_under_rate": round(scores["role_p90"]["under_rate"], 4),
    }


def score(frame: pd.DataFrame, baselines: dict[str, pd.DataFrame]) -> dict:
    """figures() overall and per app."""
    return {
        **figures(frame, baselines),
        "by_app": {str(app): figures(part, baselines) for app, part in frame.groupby("app")},
    }


def held_out(train: list[StageTrace], test: list[StageTrace], names: tuple[str, ...]) -> dict:
    """Each recipe in `names` trained on `train`, scored on `test` with and without history."""
    labels = label_frame(test)
    config = recipes()["maestro"][1]
    baselines = role_baselines(label_frame(train), labels, config.rho, config.alpha)
    stripped = [without_labels(s) for s in test]
    out = {"baselines": {name: quality(b) for name, b in baselines.items()}}
    for name in names:
        features, model = recipes()[name]
        started = time.perf_counter()
        predictor = Predictor.train(train, features, model)
        out[name] = {"train_s": round(time.perf_counter() - started, 1)}
        for condition, stages in (("with_history", test), ("without_history", stripped)):
            frame = predictions_frame(predictor, stages, labels)
            out[name][condition] = {
                **score(frame, baselines),
                "history": frame["history"].value_counts().to_dict(),
                "fallback_level": frame["fallback_level"].value_counts().to_dict(),
            }
    return out


def table(result: dict) -> str:
    """One line per data set, recipe and condition (and per app): the targets' figures."""
    head = (
        f"{'':44s} {'n':>5s} {'AUC':>6s} {'tau':>6s} {'MAE×med':>8s} {'above':>6s} {'waste×p90':>9s} {'p90 above':>9s}"
    )
    lines = [head]
    show = lambda v: "—" if v is None else f"{v:.3f}"
    row = lambda name, f: (
        f"{name:44s} {f['n']:5d} {show(f['auc']):>6s} {show(f['kendall_tau']):>6s} "
        f"{show(f['mae_vs_role_median']):>8s} {show(f['under_rate']):>6s} "
        f"{show(f['over_reservation_vs_role_p90']):>9s} {show(f['role_p90_under_rate']):>9s}"
    )
    for data, part in result["held_out"].items():
        for recipe in ("maestro-static", "maestro-minilm", "straightforward"):
            for condition in ("with_history", "without_history"):
                if recipe not in part:
                    continue
                scores = part[recipe][condition]
                lines.append(row(f"{data} {recipe} {condition}", scores))
                if recipe.startswith("maestro"):
                    lines += [row(f"  {app}", f) for app, f in scores["by_app"].items()]
    for data, apps in result.get("leave_one_app_out", {}).items():
        lines += [f"{data}: an app training never saw", new_app.table(apps)]
    return "\n".join(lines)


def split_arguments(description: str, result_name: str) -> argparse.Namespace:
    """--traces (the dev traces), --splits (grouped splits, 5) and --out (benchmarks/results/<result_name>),
    for the benchmarks that train on grouped splits of a trace file."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=str(DEV_TRACES))
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / result_name))
    return parser.parse_args()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data",
        nargs="*",
        choices=sorted(DATA),
        default=sorted(DATA),
        help="data sets scored held out (none: --speed alone)",
    )
    parser.add_argument("--leave-one-app-out", action="store_true")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument(
        "--speed-recipes",
        nargs="+",
        choices=list(recipes()),
        default=["maestro-static", "maestro-minilm", "straightforward"],
        help="the recipes --speed measures (maestro-static always; straightforward takes minutes)",
    )
    parser.add_argument(
        "--compiled-trees",
        action="store_true",
        help="--speed also compiles the static recipe's boosters (the fast extra, gcc) against LightGBM's",
    )
    parser.add_argument(
        "--held-out-recipes",
        nargs="*",
        choices=list(recipes()),
        default=["maestro-static", "maestro-minilm", "straightforward"],
        help="the recipes trained on each data set's train side and scored on its test side",
    )
    parser.add_argument(
        "--unseen",
        help="traces out of the project's reach (a JSONL file or a folder): each recipe "
        "trained on all of each --data set instead of its locked split's train side, scored on these",
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "predictor.json"))
    args = parser.parse_args()
    result = {"variants_tried": VARIANTS_TRIED, "test_fraction": TEST_FRACTION, "held_out": {}}
    for data in args.data:
        stages = read_stages(DATA[data])
        if args.unseen:
            unseen = read_stages(Path(args.unseen))
            result["held_out"][f"{data}-trained, unseen"] = {
                "train_stages": len(stages),
                "test_stages": len(unseen),
                **held_out(stages, unseen, tuple(args.held_out_recipes)),
            }
            continue
        train_idx, test_idx = locked_split(stages, TEST_FRACTION)
        train, test = [stages[i] for i in train_idx], [stages[i] for i in test_idx]
        result["held_out"][data] = {
            "train_stages": len(train),
            "test_stages": len(test),
            **held_out(train, test, tuple(args.held_out_recipes)),
        }
        if args.leave_one_app_out:
            apps = result.setdefault("leave_one_app_out", {})[data] = new_app.leave_one_app_out(
                stages, train, test, recipes()["maestro"]
            )
            new_app.plot(apps, Path(args.out).parent / f"new_app_replay_{data}.png")
    if args.speed:
        names = ["maestro-static", *(r for r in args.speed_recipes if r != "maestro-static")]
        stages = read_stages(DEV_TRACES)
        train_idx, test_idx = locked_split(stages, TEST_FRACTION)
        result["speed"] = speed(
            [stages[i] for i in train_idx], [stages[i] for i in test_idx], recipes(), names, args.compiled_trees
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(table(result))
    if args.speed:
        print(json.dumps(result["speed"], indent=1))


if __name__ == "__main__":
    main()
