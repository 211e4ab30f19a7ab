"""DVC stage `featurize`: the locked train/test split of the collected traces and their features.

Writes {train,test}_X.parquet and {train,test}_labels.parquet, featurizer.joblib (the fitted Featurizer's state)
and split.json (stages, rows and tasks per side); keeps MiniLM's embedding cache (embeddings.npz) and the static
embedding's distilled table (static/) between runs. What the split and the features are: pipelines/featurize.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import joblib

from maestro.contract import read_traces
from pipelines.featurize import featurize
from pipelines.params import load_params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", default="data/traces/collected.jsonl")
    parser.add_argument("--out", default="data/features")
    args = parser.parse_args()
    params = load_params("featurize")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = read_traces(args.traces).stages
    (out / "static").mkdir(exist_ok=True)
    featurizer, frames = featurize(
        stages, params, cache=out / "embeddings.npz", static_cache=out / "static" / "distilled.npz"
    )
    for name, (X, labels) in frames.items():
        X.to_parquet(out / f"{name}_X.parquet")
        labels.to_parquet(out / f"{name}_labels.parquet")
    joblib.dump(featurizer.state(), out / "featurizer.joblib")
    summary = {
        name: {
            "stages": int(labels["copy"].eq("full").sum()),
            "rows": len(labels),
            "tasks": int(labels["group"].nunique()),
        }
        for name, (_, labels) in frames.items()
    }
    (out / "split.json").write_text(json.dumps(summary, indent=1))
    print(f"features written to {out}: {summary}")


if __name__ == "__main__":
    main()
