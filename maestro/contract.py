"""The stage-trace contract (DESIGN §3): one LLM call of an agent workflow, read and written as JSONL or Parquet.

Everything in Maestro reads and writes this. A malformed line is reported with its file, line
number and reason; it never stops the rest of the file from being read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from maestro.structure import derive_structure

Prompt = str | list[dict[str, Any]]
# A stage as a JSON object with `StageTrace`'s field names, not yet validated: how the gateway hands stages to its
# predictor, so that its event loop builds no pydantic object (the predictor validates them on its own thread,
# `parse_record`, where a refused stage fails only its own answer). Its fields are `StageTrace`'s; see that class.
StageRow = dict[str, Any]


class StageTrace(BaseModel):
    """One stage: required identity + prompt, labels once finished, optional structure and timings."""

    model_config = ConfigDict(extra="allow")

    workflow_id: str = Field(min_length=1)
    stage_id: str = Field(min_length=1)
    role: str = Field(min_length=1)
    prompt: Prompt
    output_tokens: int | None = Field(default=None, ge=0)
    is_tool_call: bool | None = None
    app: str | None = None
    model: str | None = None
    parent_ids: list[str] | None = None
    call_index: int | None = Field(default=None, ge=0)
    depth: int | None = Field(default=None, ge=0)
    n_tools: int | None = Field(default=None, ge=0)
    tool_names: list[str] | None = None
    interactive: bool | None = None
    prompt_tokens: int | None = Field(default=None, ge=0)
    output_text: str | None = None
    finish_reason: str | None = None
    arrival_s: float | None = None
    queue_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    tool_exec_s: float | None = None
    node: str | None = None
    kv_blocks_peak: int | None = None
    # Derived by derive_structure(); not part of what a producer must write.
    in_degree: int | None = None
    out_degree: int | None = None

    @field_validator("stage_id", "workflow_id", mode="before")
    @classmethod
    def _ids_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("parent_ids", mode="before")
    @classmethod
    def _parent_ids_as_text(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [str(v) if isinstance(v, int) else v for v in value]
        return value

    @property
    def is_labelled(self) -> bool:
        return self.output_tokens is not None

    def prompt_text(self) -> str:
        return prompt_text(self.prompt)


TOOL_ROLES = ("tool", "function")  # message roles that carry a tool's result


def prompt_text(prompt: Prompt) -> str:
    """Flatten a prompt (plain text or OpenAI-style messages) into the text the model saw.

    An assistant turn that called tools has no content; its calls are what the model saw
    (`[tool call] name(arguments)`), and a tool result is labelled with the tool that gave it."""
    if isinstance(prompt, str):
        return prompt
    parts = []
    for message in prompt:
        content = message.get("content") or ""
        if isinstance(content, list):  # multi-part content: keep the text parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        calls = [f"[tool call] {c.get('name', '')}({c.get('arguments', '')})" for c in tool_calls(message)]
        if calls:
            content = " ".join([str(content), *calls] if content else calls)
        role = message.get("role", "user")
        if role in TOOL_ROLES and message.get("name"):
            role = f"{role} ({message['name']})"
        parts.append(f"{role}: {content}")
    return "\n".join(parts)


def tool_calls(message: dict) -> list[dict]:
    """The calls of an assistant message: OpenAI `tool_calls` entries, or the legacy `function_call`."""
    entries = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
    calls = [e["function"] if isinstance(e.get("function"), dict) else e for e in entries if isinstance(e, dict)]
    return calls + ([message["function_call"]] if isinstance(message.get("function_call"), dict) else [])


@dataclass(frozen=True)
class LineError:
    """A line that could not be read, and why; `line` None: the whole file could not be read."""

    path: str
    line: int | None
    reason: str

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.reason}"


class UnreadableTraceFile(ValueError):
    """A trace file that cannot be read at all (not Parquet, truncated, an I/O error); carries its LineError."""

    def __init__(self, path: Path, reason: str):
        self.error = LineError(str(path), None, reason)
        super().__init__(str(self.error))


@dataclass
class TraceFile:
    """What reading a trace file gave: the valid stages, the lines that were not, and how many lines a later
    completed line of the same stage superseded (see `StageIndex`)."""

    stages: list[StageTrace] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    num_superseded: int = 0

    def report(self, limit: int = 20) -> str:
        superseded = f", {self.num_superseded} superseded by a completed line" if self.num_superseded else ""
        return line_report(
            f"{len(self.stages)} stages read, {len(self.errors)} malformed lines{superseded}", self.errors, limit
        )


class StageIndex:
    """One stage per (workflow_id, stage_id), in first-seen order.

    A stage the gateway refused or failed, which the client then sent again with the same ids, has an
    unfinished line and a completed one: the completed line is kept, in the first line's place, and the
    other lines count as superseded. Two completed lines of one stage are a duplicate: the first is kept."""

    def __init__(self):
        self.stages: list[StageTrace] = []
        self.num_superseded = 0
        self._positions: dict[tuple[str, str], int] = {}

    def add(self, stage: StageTrace) -> None:
        """Keep, replace or supersede; raises ValueError on a second completed line (the first stays)."""
        key = (stage.workflow_id, stage.stage_id)
        position = self._positions.setdefault(key, len(self.stages))
        if position == len(self.stages):
            self.stages.append(stage)
            return
        kept = self.stages[position]
        if kept.is_labelled and stage.is_labelled:
            raise ValueError(
                f"duplicate stage_id '{stage.stage_id}' in workflow '{stage.workflow_id}': "
                "a second completed line (the first is kept)"
            )
        if stage.is_labelled:
            self.stages[position] = stage
        self.num_superseded += 1


def line_report(head: str, errors: list, limit: int = 20) -> str:
    """A headline, then the first `limit` bad lines (file:line: reason) and how many more there are."""
    shown = [f"  {e}" for e in errors[:limit]]
    more = [f"  ... and {len(errors) - limit} more"] if len(errors) > limit else []
    return "\n".join([head, *shown, *more])


def _validation_reason(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "line"
    return f"field '{where}': {first['msg']} (fix or remove this line; other lines are unaffected)"


def parse_record(record: Any) -> StageTrace:
    """Validate one decoded record; raises ValueError naming the field at fault."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    try:
        return StageTrace.model_validate(record)
    except ValidationError as error:
        raise ValueError(_validation_reason(error)) from None


def _records_jsonl(path: Path) -> Iterator[tuple[int, Any | Exception]]:
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as error:
                yield number, ValueError(f"not valid JSON ({error.msg} at column {error.colno})")


def _records_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as error:
        raise UnreadableTraceFile(
            path,
            f"not a readable Parquet file ({_one_line(error)}); re-export it or move it out of the trace directory",
        ) from None
    for number, row in enumerate(rows, start=1):
        yield number, {k: v for k, v in row.items() if v is not None}


def _one_line(error: Exception) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())


def _records(path: Path) -> Iterator[tuple[int, Any]]:
    records = _records_parquet(path) if path.suffix == ".parquet" else _records_jsonl(path)
    try:
        yield from records
    except OSError as error:
        raise UnreadableTraceFile(
            path, f"could not be read ({_one_line(error)}); check the file, or move it out of the trace directory"
        ) from None


def read_traces(path: str | Path, derive: bool = True) -> TraceFile:
    """Read a JSONL or Parquet trace file; malformed lines are collected in `errors`, not raised, and a stage's
    unfinished lines give way to its completed one (`StageIndex`).

    Raises UnreadableTraceFile when the file as a whole cannot be read (corrupt Parquet, I/O error)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trace file {path} does not exist")
    result, index = TraceFile(), StageIndex()
    for number, record in _records(path):
        try:
            if isinstance(record, Exception):
                raise record
            index.add(parse_record(record))
        except ValueError as error:
            result.errors.append(LineError(str(path), number, str(error)))
    result.stages, result.num_superseded = index.stages, index.num_superseded
    if derive:
        derive_structure(result.stages)
    return result


_FRAGMENT = re.compile(r"#.*$")
_STAMP = re.compile(r"_?\d{8,}")
_RUN_SUFFIX = re.compile(r"(?:^|[-_.])(trial|run|seed|rep|attempt)[-_]?\d+$", re.I)  # runs of one task: task_trial3


def task_id(stage: StageTrace) -> str:
    """The task a workflow ran, for grouped splits: runs of one task must not straddle train/test.

    Uses an explicit `task_id` field when present, else the workflow id without run stamps
    (8+ digit runs), run suffixes (`_trial3`, `-run2`, `seed1`), `.log` and `#fragment` suffixes, and
    repeated path parts: ChatDev's
    `chatdev/Gomoku_Org_20231228120934/Gomoku_Org_20231228120934.log` → `chatdev/Gomoku_Org`,
    a notebook's `…/agentchat_x.ipynb#cell13` → `…/agentchat_x.ipynb`.
    """
    explicit = (stage.model_extra or {}).get("task_id")
    if explicit:
        return str(explicit)
    parts = [
        _RUN_SUFFIX.sub("", _STAMP.sub("", p).removesuffix(".log"))
        for p in _FRAGMENT.sub("", stage.workflow_id).split("/")
    ]
    kept = [p for i, p in enumerate(parts) if p and (i == 0 or p != parts[i - 1])]
    return "/".join(kept) or stage.workflow_id


def write_jsonl(stages: Iterable[StageTrace | dict], path: str | Path) -> int:
    """Write stages as contract JSONL; returns how many lines were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as handle:
        for stage in stages:
            row = stage.model_dump(exclude_none=True) if isinstance(stage, StageTrace) else stage
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count
