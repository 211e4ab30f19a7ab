"""Export a predictor (a registry URI or a directory) to a plain directory, e.g. to bake into a Bento.

    .venv/bin/python -m predictor_service.export --model models:/stage-length@champion --out build/predictor

The directory remembers the registry version it came from, so a service serving it reports that version.
"""

from __future__ import annotations

import argparse
import os

from predictor_service import loading
from predictor_service.config import DEFAULT_TRACKING_URI


def export(model: str, out: str, tracking_uri: str) -> loading.ModelSource:
    source = loading.resolve(model, tracking_uri)
    predictor = loading.load(source, tracking_uri)
    predictor.meta["registry_version"] = source.version
    predictor.save(out)
    return source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models:/stage-length@champion")
    parser.add_argument("--out", default="build/predictor")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI))
    args = parser.parse_args()
    source = export(args.model, args.out, args.tracking_uri)
    print(f"exported {source.uri} (version {source.version}) to {args.out}")


if __name__ == "__main__":
    main()
