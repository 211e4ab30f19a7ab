"""The `maestro` command: one entry point, each subcommand owned by the layer that implements it."""
from __future__ import annotations

import argparse
import importlib
import sys

# Each module exposes register(subparsers); a subcommand's parser sets `func` to run it.
COMMAND_MODULES = (
    "pipelines.commands",
    "serving.commands",
    "serving.gateway.commands",
    "predictor_service.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="maestro", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except FileNotFoundError as exc:  # a path given on the command line: name it, no traceback
        print(f"maestro {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
