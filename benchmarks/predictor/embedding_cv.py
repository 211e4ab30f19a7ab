"""The prompt embedding chosen by inner grouped CV on the training side of the locked split (its test side is
never read): MiniLM (the teacher), no embedding, or static embeddings distilled from MiniLM, with or without the
supervised lexical scores (pipelines.lexical), each beside what one prompt's embedding and scores cost.

For each data set, the locked split's training side is cut into 3 task-grouped folds; Maestro's recipe
(params.yaml) with each variant's embedding is trained on two and scored on the third, with and without
history. Figures pooled over the folds, overall and per app: AUC, Kendall τ, the share above the reserve, the
reserve's waste against the per-role p90's. Cost: one prompt's embedding (segment → PCA vector) on a cold
cache, and its lexical scores, p50 / p99 over the held-out prompts of the first fold, measured in the same run.

    python -m benchmarks.predictor.embedding_cv [--data dev agent] [--variants NAME ...]
        [--out benchmarks/results/predictor_embedding_cv.json]
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

from benchmarks.predictor.recipe import DATA, TEST_FRACTION, predictions_frame, read_stages, recipes, score
from pipelines.embedding import Embedder, EmbedderConfig
from pipelines.features import Featurizer
from pipelines.featurize import locked_split
from pipelines.history import without_labels
from pipelines.lexical import LexicalConfig
from pipelines.metrics import role_baselines
from pipelines.predictor import Predictor, label_frame, training_frame

# name → changes to params.yaml's featurizer config (use_embedding) and its embedder config
VARIANTS = {
    "minilm": dict(embedder=dict(kind="minilm")),
    "none": dict(use_embedding=False),
    "static corpus-sif 256": dict(embedder=dict(kind="static", weighting="corpus", sif_coefficient=1e-3)),
    "static zipf-sif 256": dict(embedder=dict(kind="static", weighting="zipf", sif_coefficient=1e-4)),
    "static plain 256": dict(embedder=dict(kind="static", weighting="none")),
    "static corpus-sif 1024": dict(
        embedder=dict(kind="static", weighting="corpus", sif_coefficient=1e-3, tail_chars=1024)
    ),
    "static corpus-sif teacher-fit 256": dict(
        embedder=dict(kind="static", weighting="corpus", sif_coefficient=1e-3, fit_to_teacher=True)
    ),
    "static plain teacher-fit 256": dict(embedder=dict(kind="static", weighting="none", fit_to_teacher=True)),
    "static zipf-sif teacher-fit ridge1 windows24": dict(
        embedder=dict(kind="static", weighting="zipf", fit_to_teacher=True, ridge=1.0, teacher_windows=24)
    ),
    "static zipf-sif teacher-fit ridge1 tails": dict(
        embedder=dict(kind="static", weighting="zipf", fit_to_teacher=True, ridge=1.0)
    ),
    "static zipf-sif 256 normalized": dict(embedder=dict(kind="static", weighting="zipf", normalize=True)),
    "static zipf-sif 256 classifier without it": dict(
        embedder=dict(kind="static", weighting="zipf"), model=dict(classifier_embedding=False)
    ),
    # the regressors' size (the boosters' cost), with the static embedding
    "static zipf-sif 256 regressors 200x0.125": dict(
        embedder=dict(kind="static", weighting="zipf"),
        model=dict(regressor=dict(n_estimators=200, learning_rate=0.125)),
    ),
    "minilm regressors 200x0.125": dict(
        embedder=dict(kind="minilm"), model=dict(regressor=dict(n_estimators=200, learning_rate=0.125))
    ),
    "static zipf-sif 256 regressors 100x0.25": dict(
        embedder=dict(kind="static", weighting="zipf"), model=dict(regressor=dict(n_estimators=100, learning_rate=0.25))
    ),
    # the supervised lexical scores (pipelines.lexical) beside an embedding
    "static zipf-sif 256 classifier without it + lexical": dict(
        embedder=dict(kind="static", weighting="zipf"), model=dict(classifier_embedding=False), lexical=LexicalConfig()
    ),
    "static zipf-sif 256 classifier without it + lexical 1024": dict(
        embedder=dict(kind="static", weighting="zipf"),
        model=dict(classifier_embedding=False),
        lexical=LexicalConfig(tail_chars=1024),
    ),
    "static zipf-sif 256 classifier without it + lexical 1024 per app": dict(
        embedder=dict(kind="static", weighting="zipf"),
        model=dict(classifier_embedding=False),
        lexical=LexicalConfig(tail_chars=1024, per_app=True),
    ),
    "static zipf-sif 256 pca8 classifier without it + lexical": dict(
        pca_dims=8,
        embedder=dict(kind="static", weighting="zipf"),
        model=dict(classifier_embedding=False),
        lexical=LexicalConfig(),
    ),
    # 76: 71 with the length model fitted to the mean of the labels and a ridge on MiniLM's vectors (out of fold)
    "static zipf-sif 256 classifier without it + lexical teacher": dict(
        embedder=dict(kind="static", weighting="zipf"),
        model=dict(classifier_embedding=False),
        lexical=LexicalConfig(teacher="minilm"),
    ),
    "minilm + lexical": dict(embedder=dict(kind="minilm"), lexical=LexicalConfig()),
    "none + lexical": dict(use_embedding=False, lexical=LexicalConfig()),
    "static corpus-sif 256 pca16": dict(
        pca_dims=16, embedder=dict(kind="static", weighting="corpus", sif_coefficient=1e-3)
    ),
    "static corpus-sif 256 pca8": dict(
        pca_dims=8, embedder=dict(kind="static", weighting="corpus", sif_coefficient=1e-3)
    ),
}


def variant_config(name: str):
    features, model = recipes()["maestro-minilm"]  # the variants change the MiniLM recipe, whatever the default
    change = dict(VARIANTS[name])
    embedder = replace(features.embedder, **change.pop("embedder", {}))
    model_change = {
        k: {**getattr(model, k), **v} if isinstance(v, dict) else v for k, v in change.pop("model", {}).items()
    }
    return replace(features, embedder=embedder, **change), replace(model, **model_change)


def embedding_cost_ms(featurizer: Featurizer, stages: list) -> dict:
    """One prompt's PCA vector at a time, each from a cold cache: p50 / p99 in milliseconds."""
    if not featurizer.config.use_embedding:
        return {"p50": 0.0, "p99": 0.0}
    times = []
    for stage in stages:
        if hasattr(featurizer.embedder, "clear_cache"):
            featurizer.embedder.clear_cache()
        started = time.perf_counter()
        featurizer.embed([stage.prompt_text()])
        times.append((time.perf_counter() - started) * 1000)
    return {"p50": round(float(np.percentile(times, 50)), 3), "p99": round(float(np.percentile(times, 99)), 3)}


def lexical_cost_ms(featurizer: Featurizer, stages: list) -> dict:
    """One prompt's lexical scores at a time (nothing is cached: every call is cold): p50 / p99 in milliseconds."""
    if featurizer.config.lexical is None:
        return {"p50": 0.0, "p99": 0.0}
    times = []
    for stage in stages:
        text = stage.prompt_text()
        started = time.perf_counter()
        featurizer.lexical_scores([stage], [text])
        times.append((time.perf_counter() - started) * 1000)
    return {"p50": round(float(np.percentile(times, 50)), 3), "p99": round(float(np.percentile(times, 99)), 3)}


def cross_validate(data: str, names: list[str], folds: int = 3, fold_seed: int | None = None) -> dict:
    """`fold_seed`: None, the fixed task-grouped folds every earlier run used; a number, tasks shuffled into folds
    by it (the folds' spread: run the references again with the same seed)."""
    stages = read_stages(DATA[data])
    train = [stages[i] for i in locked_split(stages, TEST_FRACTION)[0]]
    groups = label_frame(train)["group"].to_numpy()
    grouped = GroupKFold(folds) if fold_seed is None else GroupKFold(folds, shuffle=True, random_state=fold_seed)
    splits = list(grouped.split(train, groups=groups))
    out, teachers = {}, {}
    for name in names:
        features, model = variant_config(name)
        # one MiniLM per segment config, its cache serving every fold and variant (the teacher, and the embedder
        # of the MiniLM variant)
        teacher_config = replace(
            EmbedderConfig(), tail_chars=features.embedder.tail_chars, max_seq_length=features.embedder.max_seq_length
        )
        teacher = teachers.setdefault(teacher_config, Embedder(teacher_config))
        embedder = teacher if features.embedder == teacher_config else Featurizer(features).embedder
        frames, baselines, cost, started = {"with_history": [], "without_history": []}, [], None, time.perf_counter()
        for fold, (inner, held) in enumerate(splits):
            fit_on, score_on = [train[i] for i in inner], [train[i] for i in held]
            featurizer = Featurizer(features, embedder, teacher).fit(fit_on)
            predictor = Predictor.fit(featurizer, *training_frame(featurizer, fit_on, model.seed), model)
            labels = label_frame(score_on).assign(fold=fold)
            baselines.append(role_baselines(label_frame(fit_on), labels, model.rho, model.alpha))
            for condition, part in (("with_history", score_on), ("without_history", map(without_labels, score_on))):
                frames[condition].append(predictions_frame(predictor, list(part), labels))
            if cost is None:
                cost = (embedding_cost_ms(featurizer, score_on[:300]), lexical_cost_ms(featurizer, score_on[:300]))
        pooled = {b: pd.concat([fold[b] for fold in baselines], ignore_index=True) for b in baselines[0]}
        out[name] = {
            "embedding_ms": cost[0],
            "lexical_ms": cost[1],
            "seconds": round(time.perf_counter() - started, 1),
            **{c: score(pd.concat(f, ignore_index=True), pooled) for c, f in frames.items()},
        }
        print(
            data,
            name,
            json.dumps({k: out[name][k] for k in ("embedding_ms", "lexical_ms", "seconds")}),
            {
                c: {k: out[name][c][k] for k in ("auc", "kendall_tau", "under_rate", "over_reservation_vs_role_p90")}
                for c in frames
            },
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", choices=sorted(DATA), default=sorted(DATA))
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--fold-seed", type=int, default=None, help="shuffle tasks into folds by this seed")
    parser.add_argument("--out", default="benchmarks/results/predictor_embedding_cv.json")
    args = parser.parse_args()
    result = {
        "variants": {name: VARIANTS[name] for name in args.variants},
        "folds": 3,
        "fold_seed": args.fold_seed,
        **{data: cross_validate(data, args.variants, fold_seed=args.fold_seed) for data in args.data},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
