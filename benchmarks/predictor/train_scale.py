"""Training at scale: wall time and peak memory, one machine (`Predictor.train` on one list of stages) vs a
Dask LocalCluster (`pipelines.dask_train`), on SYNTHETIC traces (pipelines/synth.py) of growing size.

    python benchmarks/predictor/train_scale.py --sizes 20000 200000 --workers 2 \
        --out benchmarks/results/train_scale.json
    python benchmarks/predictor/train_scale.py --sizes 1000000 --arms dask --embedding-stages 0   # the cluster alone

Each measurement runs in a fresh process (a fresh cluster for Dask), so that peak RSS (`ru_maxrss`) is
that run's own: the training process for one machine; the client and every worker process for Dask.
The traces are generated once, 10k stages a Parquet file (the largest size; smaller sizes read its first
files). The scale runs train without prompt embeddings (`use_embedding: false`): MiniLM on every prompt is
measured separately (`--embedding-stages`), the same two ways, since a CPU embeds ~100 prompts a second.
Both trainers fit the same lighter model (`MODEL` below: 3 folds, one regressor, 100-150 trees) so that a
run fits in minutes; `params.yaml`'s recipe fits 42 boosters instead of 12, on both paths alike.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES_PER_FILE = 10_000
SMALL = dict(subsample=0.8, subsample_freq=1, colsample_bytree=0.8, learning_rate=0.1, num_leaves=31)
MODEL = dict(
    folds=3,
    regressor_bags=1,
    classifier=dict(n_estimators=100, min_child_samples=10, **SMALL),
    quantile=dict(n_estimators=100, min_child_samples=20, **SMALL),
    regressor=dict(n_estimators=150, min_child_samples=10, extra_trees=True, **SMALL),
)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def generate_traces(num_stages: int, out_dir: Path, seed: int = 11) -> int:
    """Synthetic stages written 10k to a file, workflow ids made unique per file; returns files written."""
    from pipelines.dask_features import write_trace_parquet
    from pipelines.synth import generate

    existing = len(list(out_dir.glob("*.parquet")))
    needed = -(-num_stages // STAGES_PER_FILE)
    for part in range(existing, needed):
        stages = generate(STAGES_PER_FILE, seed + part)[:STAGES_PER_FILE]
        for stage in stages:
            stage["workflow_id"] = f"f{part:04d}/{stage['workflow_id']}"
        write_trace_parquet(stages, out_dir, STAGES_PER_FILE, first_part=part)
    return needed


def subset(all_dir: Path, num_stages: int, root: Path) -> Path:
    """The first files of the generated set, linked into their own directory."""
    out = root / f"stages-{num_stages}"
    out.mkdir(exist_ok=True)
    for path in sorted(all_dir.glob("*.parquet"))[: -(-num_stages // STAGES_PER_FILE)]:
        if not (out / path.name).exists():
            (out / path.name).symlink_to(path)
    return out


def configs(use_embedding: bool):
    from pipelines.features import FeaturizerConfig
    from pipelines.model import ModelConfig

    return FeaturizerConfig(use_embedding=use_embedding, pca_dims=16), ModelConfig(**MODEL)


def run_single(traces: Path, use_embedding: bool) -> dict:
    import pandas as pd

    from maestro.contract import parse_record
    from pipelines.predictor import Predictor

    started = time.perf_counter()
    records = pd.read_parquet(traces, columns=["record"])["record"]
    stages = [parse_record(json.loads(r)) for r in records]
    del records
    predictor = Predictor.train(stages, *configs(use_embedding))
    return {
        "wall_s": round(time.perf_counter() - started, 1),
        "peak_rss_mb": round(_peak_mb()),
        "num_train_stages": predictor.meta["num_train_stages"],
    }


def run_dask(traces: Path, use_embedding: bool, workers: int) -> dict:
    from pipelines.dask_train import DaskTrainConfig, connect, train_on

    started = time.perf_counter()
    with connect(f"local:{workers}") as client:
        predictor = train_on(client, traces, *configs(use_embedding), DaskTrainConfig(f"local:{workers}"))
        worker_peaks = client.run(_peak_mb)
    return {
        "wall_s": round(time.perf_counter() - started, 1),
        "client_peak_rss_mb": round(_peak_mb()),
        "worker_peak_rss_mb": sorted(round(v) for v in worker_peaks.values()),
        "num_train_stages": predictor.meta["num_train_stages"],
    }


def measure(kind: str, traces: Path, use_embedding: bool, workers: int, timeout_s: float) -> dict:
    """One run in a fresh process; its JSON line, or why there is none."""
    command = [sys.executable, __file__, "--run", kind, "--traces", str(traces), "--workers", str(workers)]
    command += ["--with-embedding"] if use_embedding else []
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env={**os.environ})
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if done.returncode == 0 and lines else {"error": done.stderr[-600:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--embedding-stages", type=int, default=2_000, help="size of the embedding runs (0: none)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data", help="where the generated traces live (default: a temporary directory)")
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=["single", "dask"],
        default=["single", "dask"],
        help="which trainers to measure (e.g. only dask where one machine would take hours)",
    )
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--out", default="benchmarks/results/train_scale.json")
    parser.add_argument("--run", choices=["single", "dask"], help=argparse.SUPPRESS)
    parser.add_argument("--traces", help=argparse.SUPPRESS)
    parser.add_argument("--with-embedding", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:  # a child: one measurement
        result = (
            run_single(Path(args.traces), args.with_embedding)
            if args.run == "single"
            else run_dask(Path(args.traces), args.with_embedding, args.workers)
        )
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory(prefix="train-scale-") as scratch:
        root = Path(args.data or scratch)
        all_dir = root / "all"
        all_dir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        generate_traces(max(args.sizes), all_dir)
        generation_s = round(time.perf_counter() - started, 1)
        runs = [(n, False) for n in sorted(args.sizes)]
        runs += [(args.embedding_stages, True)] if args.embedding_stages else []
        rows = []
        for num_stages, use_embedding in runs:
            whole_files = num_stages % STAGES_PER_FILE == 0
            traces = (subset if whole_files else _head)(all_dir, num_stages, root)
            row = {"stages": num_stages, "embeddings": use_embedding}
            for kind in args.arms:
                row[kind] = measure(kind, traces, use_embedding, args.workers, args.timeout_s)
                print(json.dumps(row), flush=True)
            rows.append(row)
    report = {
        "what": "synthetic stages; wall time and peak RSS per process; one machine vs Dask LocalCluster",
        "workers": args.workers,
        "threads_per_worker": 1,
        "model": MODEL,
        "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "generation_s": generation_s,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


def _head(all_dir: Path, num_stages: int, root: Path) -> Path:
    """A directory holding the first `num_stages` stages, in files of a quarter of that each."""
    import pandas as pd

    from pipelines.dask_features import write_trace_parquet

    out = root / f"stages-{num_stages}"
    if not out.exists():
        first = pd.read_parquet(sorted(all_dir.glob("*.parquet"))[0]).head(num_stages)
        write_trace_parquet([json.loads(r) for r in first["record"]], out, max(1, num_stages // 4))
    return out


if __name__ == "__main__":
    main()
