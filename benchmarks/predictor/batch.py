"""Where a batched prediction's time goes, and the compiled boosters (pipelines.compiled_trees) against
LightGBM's on the same predictor, arm by arm in one run: `python benchmarks/predictor/recipe.py --data --speed
--compiled-trees` calls these for the static recipe.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from maestro.contract import StageTrace
from pipelines.batch_features import structural_columns
from pipelines.predictor import Predictor
from pipelines.stage_features import stage_rows


def _median_us(call, num_stages: int, before=lambda: None, passes: int = 3) -> float:
    times = []
    for _ in range(passes):
        before()
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return round(float(np.median(times)) / num_stages * 1e6, 1)


def parts_us(predictor: Predictor, test: list[StageTrace]) -> dict:
    """µs a stage of one batch of `test`, part by part (medians of 3): the structural and text features one
    stage at a time (stage_rows, the path before the batch one) and as the live path makes them
    (structural_columns), the whole featurizer (Featurizer.matrix, the embedding in it), the boosters and
    calibration (TwoStageModel.predict_matrix), and predict as a whole."""
    texts = [s.prompt_text() for s in test]
    columns, names = predictor.read_columns, predictor.model.feature_names
    matrix, roles = predictor.featurizer.matrix(test, columns)
    embedder, n = predictor.featurizer.embedder, len(test)
    cold = getattr(embedder, "clear_cache", lambda: None)  # MiniLM's cache: every prompt new, as live
    return {
        "structural_one_by_one": _median_us(lambda: stage_rows(test, None, texts), n),
        "structural_batch": _median_us(lambda: structural_columns(test, None, texts), n),
        "embedding": _median_us(lambda: predictor.featurizer.embed(texts), n, cold),
        "featurizer": _median_us(lambda: predictor.featurizer.matrix(test, columns), n, cold),
        "model": _median_us(lambda: predictor.model.predict_matrix(matrix[:, : len(names)], roles), n),
        "predict": _median_us(lambda: predictor.predict(test), n, cold),
    }


def _interleaved(arms: dict[str, Predictor], test: list[StageTrace], passes: int = 3) -> dict:
    """Batched stages/s (median of `passes`) and one-stage p50 / p99 ms of each arm, the arms taking turns
    pass by pass and stage by stage, so that the box's load falls on both alike."""
    rates = {name: [] for name in arms}
    for _ in range(passes):
        for name, predictor in arms.items():
            getattr(predictor.featurizer.embedder, "clear_cache", lambda: None)()
            started = time.perf_counter()
            predictor.predict(test)
            rates[name].append(len(test) / (time.perf_counter() - started))
    times = {name: [] for name in arms}
    for stage in test:
        for name, predictor in arms.items():
            started = time.perf_counter()
            predictor.predict([stage])
            times[name].append(time.perf_counter() - started)
    return {
        name: {
            "throughput_stages_per_s": round(float(np.median(rates[name])), 1),
            "one_stage_ms": {q: round(float(np.percentile(times[name], q)) * 1000, 3) for q in (50, 99)},
        }
        for name in arms
    }


def compiled_arm(predictor: Predictor, test: list[StageTrace]) -> dict:
    """`predictor` (trained with compile_trees: its save compiles) saved, loaded with its compiled boosters, and
    measured against itself with LightGBM's: the compile time, whether every answer is the same (batch and one
    stage at a time), both arms' speed (_interleaved) and the compiled arm's parts (parts_us)."""
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        predictor.save(Path(directory))
        save_s = time.perf_counter() - started
        compiled = Predictor.load(directory)
    same = compiled.predict(test) == predictor.predict(test) and all(
        compiled.predict([s]) == predictor.predict([s]) for s in test
    )
    return {
        "save_and_compile_s": round(save_s, 1),
        "compile_s": compiled.meta["compiled_trees"]["compile_s"],
        "identical_answers": same,
        **_interleaved({"lightgbm": predictor, "compiled": compiled}, test),
        "compiled_parts_us": parts_us(compiled, test),
    }
