"""The `maestro` command: one entry point, each subcommand owned by the layer that implements it."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys

# Each module exposes register(subparsers); a subcommand's parser sets `func` to run it.
COMMAND_MODULES = (
    "pipelines.commands",
    "serving.commands",
    "serving.gateway.commands",
    "predictor_service.commands",
    "driver.commands",
)


def shows_default(value) -> bool:
    """Whether help states an option's default: not for none, an off switch or an empty list."""
    return value is not None and value is not False and value is not argparse.SUPPRESS and value != []


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help with each option's default, where it has one its help does not already state."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        if not shows_default(action.default) or "default" in help_text:
            return help_text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """Every `maestro` parser, subcommands included: defaults in the help, also of options without one."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        if not kwargs.get("help") and shows_default(kwargs.get("default")):
            kwargs["help"] = "(default: %(default)s)"
        return super().add_argument(*args, **kwargs)


def version() -> str:
    return f"maestro {importlib.metadata.version('maestro')}"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="maestro", description=__doc__)
    parser.add_argument("--version", action="version", version=version())
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
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
