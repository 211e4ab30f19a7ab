"""DVC stage `sample`: write the SYNTHETIC sample stage traces (pipelines/synth.py documents the generative model)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipelines.params import load_params
from pipelines.synth import generate


def main() -> None:
    parser = argparse.ArgumentParser(description="Write SYNTHETIC sample stage traces (see pipelines/synth.py).")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default="data/traces/sample.jsonl")
    args = parser.parse_args()
    params = load_params("sample", args.params)
    stages = generate(params["num_stages"], params["seed"], params.get("apps"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as handle:
        for stage in stages:
            handle.write(json.dumps(stage) + "\n")
    print(f"wrote {len(stages)} synthetic stages to {out}")


if __name__ == "__main__":
    main()
