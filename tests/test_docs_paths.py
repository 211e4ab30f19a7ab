"""Docs that cannot drift silently: every repository path a README or docs/*.md names exists.

Fast and offline: it reads the Markdown and looks the paths up in the tree as it is at test time. What counts as a
path, per line of a README.md (anywhere in the source folders) or a docs/*.md:
- a slashed path whose first folder is a source folder (`serving/sim/slo.py`, `benchmarks/`), or a folder beside
  the document (`gateway/core.py` in serving/README.md);
- a dotted module path (`serving.vllm_plugin.scheduler.MaestroScheduler`, `python -m benchmarks.referee`): its
  longest prefix that is a module or package must exist, and the next name must appear in that module's source;
- a backticked file name `name.py`: in the folder that starts its table row (`pace.py` in the row of `sim/`), else
  beside the document or at the root; outside a folder's row, also anywhere in the source folders.
Benchmark results (benchmarks/results/) are outputs, written when a benchmark runs: not checked.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = (
    "maestro",
    "pipelines",
    "predictor_service",
    "serving",
    "driver",
    "benchmarks",
    "tests",
    "scripts",
    "deploy",
    "docs",
)
PACKAGES = ("maestro", "pipelines", "predictor_service", "serving", "driver", "benchmarks", "tests")
OUTPUTS = ("benchmarks/results/",)
SLASHED = re.compile(r"(?<![\w./:~-])((?:[A-Za-z_][\w.-]*/)+[\w.-]*)(?![\w*{<…])")
DOTTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+)(?![\w./<-])")
FILE_EXTENSIONS = ("py", "json", "jsonl", "yaml", "md", "png", "csv", "sh", "db", "toml", "html", "txt")
BARE_MODULE = re.compile(r"`([A-Za-z_]\w*\.py)`")
ROW_FOLDER = re.compile(r"^\|\s*`([\w./-]+/)`")


def documents() -> list[Path]:
    found = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    found += [p for d in SOURCE_DIRS for p in (ROOT / d).rglob("README*.md") if "__pycache__" not in p.parts]
    return sorted(set(found))


def slashed_target(document: Path, path: str) -> Path | None:
    """Where a slashed path points when it names one of ours (beside the document, else from the root)."""
    first = path.split("/")[0]
    for base in (document.parent, ROOT):
        folder = (base / first).resolve()
        if folder.is_dir() and folder.is_relative_to(ROOT) and folder.relative_to(ROOT).parts[0] in SOURCE_DIRS:
            return base / path
    return None


def dotted_exists(name: str) -> bool:
    parts = name.split(".")
    if parts[-1] in FILE_EXTENSIONS:  # a file name such as maestro.json, not a module path
        return True
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file() or base.is_dir():
            return i == len(parts) or (source.is_file() and re.search(rf"\b{parts[i]}\b", source.read_text()))
    return False


def bare_module_exists(document: Path, name: str, row_folder: str | None) -> bool:
    bases = ([document.parent / row_folder] if row_folder else []) + [document.parent, ROOT]
    if any((base / name).is_file() for base in bases):
        return True
    return not row_folder and any(next((ROOT / d).rglob(name), None) for d in SOURCE_DIRS)


def dead_paths(document: Path, text: str | None = None) -> list[str]:
    """`where path` of each path the document's text (or `text`, read as the document's) names and the tree lacks."""
    dead = []
    for number, line in enumerate((document.read_text() if text is None else text).splitlines(), 1):
        where = f"{document.relative_to(ROOT)}:{number}"
        for match in SLASHED.finditer(line):
            path = match.group(1).rstrip(".,:;")
            target = slashed_target(document, path)
            if target is not None and not (target.resolve().relative_to(ROOT).as_posix() + "/").startswith(OUTPUTS):
                dead += [f"{where} {path}"] if not target.exists() else []
        dead += [f"{where} {m.group(1)}" for m in DOTTED.finditer(line) if not dotted_exists(m.group(1))]
        row = ROW_FOLDER.match(line)
        dead += [
            f"{where} {m.group(1)}"
            for m in BARE_MODULE.finditer(line)
            if not bare_module_exists(document, m.group(1), row.group(1) if row else None)
        ]
    return dead


def test_every_path_the_docs_name_exists():
    dead = [entry for document in documents() for entry in dead_paths(document)]
    assert not dead, "these paths are named in the docs but not in the tree; fix the doc (or the path):\n" + "\n".join(
        dead
    )


def test_the_serving_readme_quotes_maestros_order_as_its_docstring_says_it():
    """serving/README.md describes Maestro's policy by quoting serving/core/scheduler/slack.py's docstring: one text."""
    docstring = ast.get_docstring(ast.parse((ROOT / "serving" / "core" / "scheduler" / "slack.py").read_text()))
    readme = "\n".join(line.removeprefix(">") for line in (ROOT / "serving" / "README.md").read_text().splitlines())
    assert " ".join(docstring.split()) in " ".join(readme.split()), (
        "serving/README.md's quote of serving/core/scheduler/slack.py's docstring differs from it: quote it again"
    )


def test_the_serving_readme_describes_each_policy_by_its_scheduler_class_docstring():
    """serving/README.md's *Scheduling policies* table: a row per `Policy`, naming the class `create_scheduler` builds
    for it, the systems that run it, and the first paragraph of the class's docstring, whitespace aside."""
    import inspect

    from serving.core.scheduler import Policy, create_scheduler
    from serving.core.systems import SYSTEMS

    text = (ROOT / "serving" / "README.md").read_text().split("## Scheduling policies")[1].split("\n## ")[0]
    cells = [
        [" ".join(cell.split()) for cell in line.split("|")[1:-1]]
        for line in text.splitlines()
        if line.startswith("| `")
    ]
    described = {policy.strip("`"): (name.split()[0], systems, order) for policy, name, systems, order in cells}
    expected = {}
    for policy in Policy:
        cls = type(create_scheduler(policy))
        systems = ", ".join(f"`{s.name}`" for s in SYSTEMS.values() if s.scheduler is policy) or "–"
        expected[policy.value] = (f"`{cls.__name__}`", systems, " ".join(inspect.getdoc(cls).split("\n\n")[0].split()))
    differ = [
        f"{p}: README {described.get(p)}, code {expected.get(p)}"
        for p in sorted({*described, *expected})
        if described.get(p) != expected.get(p)
    ]
    assert not differ, (
        "serving/README.md's *Scheduling policies* rows differ from the code; copy the code's:\n" + "\n".join(differ)
    )


def test_the_checker_finds_a_dead_path():
    lines = [
        "`serving/no_such_module.py`, `serving/core/request.py`",
        "`serving.gateway.no_such_name`, `serving.core.request`",
        "| `sim/` | `no_such.py`, `engine.py` |",
    ]
    dead = dead_paths(ROOT / "serving" / "README.md", "\n".join(lines))
    assert [entry.split()[-1] for entry in dead] == [
        "serving/no_such_module.py",
        "serving.gateway.no_such_name",
        "no_such.py",
    ]
