"""DVC stage `collect`: gather `collect.source`'s stage traces into one validated contract file.

Writes the labelled stages to collected.jsonl and what could not be read (malformed lines, unreadable files) to
collect_report.json and stdout; pipelines/collect.py reads the source.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from maestro.contract import line_report, write_jsonl
from pipelines.collect import collect_stages, unreadable_files
from pipelines.params import load_params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="data/traces/collected.jsonl")
    parser.add_argument("--report", default="data/traces/collect_report.json")
    args = parser.parse_args()
    collected = collect_stages(load_params("collect")["source"])
    stages, errors = collected.stages, collected.errors
    labelled = [s for s in stages if s.is_labelled and s.is_tool_call is not None]
    write_jsonl(labelled, args.out)
    unreadable = unreadable_files(errors)
    ordered = unreadable + [e for e in errors if e.line is not None]  # whole files first: they lose the most
    report = {
        "stages": len(stages),
        "labelled": len(labelled),
        "malformed": len(errors) - len(unreadable),
        "unreadable_files": len(unreadable),
        "superseded": collected.num_superseded,
        "errors": [str(e) for e in ordered[:1000]],
    }
    Path(args.report).write_text(json.dumps(report, indent=1))
    print(
        line_report(
            f"collected {len(labelled)} labelled stages ({len(stages) - len(labelled)} unlabelled "
            f"skipped, {report['malformed']} malformed lines, {len(unreadable)} unreadable files, "
            f"{collected.num_superseded} unfinished lines superseded by a completed retry)",
            ordered,
        )
    )


if __name__ == "__main__":
    main()
