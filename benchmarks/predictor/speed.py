"""How fast each predictor recipe is (benchmarks/predictor/recipe.py --speed): training time, single-stage latency
from a cold and a warm cache, batched throughput and its parts, beside one MiniLM encode of each prompt."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.predictor import batch as predictor_batch
from maestro.contract import StageTrace
from pipelines.embedding import Embedder, EmbedderConfig
from pipelines.predictor import Predictor


def clear_caches(predictor: Predictor) -> None:
    """Empty the embedding cache a predictor's featurizer keeps (MiniLM's; a static embedding keeps none)."""
    if hasattr(predictor.featurizer.embedder, "clear_cache"):
        predictor.featurizer.embedder.clear_cache()


def throughput(predictor: Predictor, test: list[StageTrace], passes: int = 3) -> float:
    """Stages per second of one batched predict from a cold embedding cache: the median of `passes`
    passes (one pass swings ±20 % on a shared 2-core machine)."""
    rates = []
    for _ in range(passes):
        clear_caches(predictor)
        started = time.perf_counter()
        predictor.predict(test)
        rates.append(len(test) / (time.perf_counter() - started))
    return round(float(np.median(rates)), 1)


def percentiles_ms(times_s: list[float]) -> dict:
    ms = np.asarray(times_s) * 1000
    return {"p50": round(float(np.percentile(ms, 50)), 3), "p99": round(float(np.percentile(ms, 99)), 3)}


def latency_ms(predictor: Predictor, stages: list[StageTrace]) -> dict:
    """One stage a call. Cold: every cache emptied before each call, each prompt predicted for the first
    time (a live stage's prompt is new almost every time); warm: the same stages again, caches kept."""

    def run(cold: bool) -> list[float]:
        times = []
        for stage in stages:
            if cold:
                clear_caches(predictor)
            start = time.perf_counter()
            predictor.predict([stage])
            times.append(time.perf_counter() - start)
        return times

    cold = run(cold=True)
    return {"cold": percentiles_ms(cold), "warm": percentiles_ms(run(cold=False))}


def minilm_encode_ms(stages: list[StageTrace], config: EmbedderConfig) -> dict:
    """One MiniLM encode (`config`: params.yaml's tail and sequence length) of each stage's prompt segment, one text
    a call, nothing cached: what a cold prediction with MiniLM embeddings pays for the embedding alone."""
    embedder = Embedder(config)
    embedder.embed(["warm-up"])
    times = []
    for stage in stages:
        embedder.clear_cache()
        start = time.perf_counter()
        embedder.embed([stage.prompt_text()])
        times.append(time.perf_counter() - start)
    return percentiles_ms(times)


def speed(
    train: list[StageTrace],
    test: list[StageTrace],
    recipes: dict[str, tuple],
    names: list[str],
    compiled_trees: bool = False,
) -> dict:
    """Training time on `train`, cold and warm single-stage latency and batched throughput on `test` of each recipe
    in `names` (and its batch part by part), and one MiniLM encode of each test prompt, in one run; the headline is
    Maestro's cold latency ("maestro-static") as a multiple of the MiniLM encode. `recipes`: name → (featurizer
    config, model config), as benchmarks/predictor/recipe.py builds them. `compiled_trees`: the static recipe's
    boosters compiled as well, against LightGBM's (benchmarks/predictor/batch.py)."""
    import torch

    torch.set_num_threads(1)  # one thread, like the LightGBM boosters (params.yaml num_threads: 1)
    out = {
        "test_stages": len(test),
        "load_1min_before": round(os.getloadavg()[0], 2),
        "minilm_encode_ms": minilm_encode_ms(test, replace(recipes["maestro"][0].embedder, kind="minilm")),
    }
    for name in names:
        features, model = recipes[name]
        compile_here = compiled_trees and name == "maestro-static"
        started = time.perf_counter()
        trained = Predictor.train(train, features, replace(model, compile_trees=compile_here))
        train_s = time.perf_counter() - started
        with tempfile.TemporaryDirectory() as directory:  # measured as saved and loaded: what a service answers with
            started = time.perf_counter()
            predictor = Predictor.load(trained.save(Path(directory)))
            save_and_load_s = time.perf_counter() - started
        stage_only = Predictor(predictor.featurizer, predictor.model, predictor.priors, new_app=predictor.new_app)
        out[name] = {
            "train_s": round(train_s, 1),
            "workflow_train_s": trained.meta["workflow"]["train_seconds"],  # inside train_s (not saved)
            "save_and_load_s": round(save_and_load_s, 1),  # the row walker's build and, if asked, the compiled trees
            "row_walker": type(predictor.model._rows["regressors"][0]).__name__ == "RowWalker",
            "latency_ms": latency_ms(predictor, test),  # the stage and its workflow's remaining work
            "latency_stage_model_only_ms": latency_ms(stage_only, test),
            "throughput_stages_per_s": throughput(predictor, test),
            "batch_parts_us": predictor_batch.parts_us(predictor, test),
        }
        if compile_here:
            out[name]["compiled_trees"] = predictor_batch.compiled_arm(trained, test)
    out["load_1min_after"] = round(os.getloadavg()[0], 2)
    encode, cold = out["minilm_encode_ms"], out["maestro-static"]["latency_ms"]["cold"]
    out["headline"] = {
        "maestro_static_cold_ms": cold,
        "minilm_encode_ms": encode,
        "cold_over_minilm_encode": {q: round(cold[q] / encode[q], 4) for q in ("p50", "p99")},
        **({"maestro_minilm_cold_ms": out["maestro-minilm"]["latency_ms"]["cold"]} if "maestro-minilm" in out else {}),
    }
    return out
