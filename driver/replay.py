"""Recorded workflows as the driver's plan: stages of a contract trace file (`maestro.contract`) replayed live.

Each stage keeps its recorded prompt (OpenAI messages as recorded; a plain-text prompt becomes one user message),
its DAG (`parent_ids`) and its recorded output length, which the driver forces (capped by `max_tokens_cap`).
After a stage that called a tool, its children wait the recorded gap (the parent's timestamp to the child's,
which also holds the child's own generation: an upper bound on the tool's time) × `tool_wait_scale`, at most
`max_tool_wait_s`; a file without timestamps (dev-traces) has no waits. Lines the contract refuses and
workflows whose DAG cannot be replayed (a parent that is not in the file) are reported with file:line and left out.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from maestro.contract import TOOL_ROLES, LineError, StageTrace, read_traces, task_id, tool_calls


@dataclass
class ReplayConfig:
    """How recorded stages become driver stages."""

    max_tokens_cap: int = 4096
    tool_wait_scale: float = 0.0  # × the recorded gap after a tool call (0 = no waits)
    max_tool_wait_s: float = 30.0
    interactive_apps: tuple[str, ...] = ("tau2_*",)  # glob on `app` when a stage records no `interactive`
    task_ids: frozenset[str] | None = None  # replay only these tasks (None = all)
    max_workflows: int = 0  # 0 = all, else the first N workflows in file order
    max_stages_per_workflow: int = 0  # 0 = all, else a workflow's first N stages (their parents come first)

    def __post_init__(self):
        if self.max_tokens_cap < 1 or self.tool_wait_scale < 0 or self.max_tool_wait_s < 0:
            raise ValueError("replay: max_tokens_cap must be >= 1, tool_wait_scale and max_tool_wait_s >= 0")


@dataclass
class ReplayPlan:
    workflows: list[list[dict]] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)


def task_ids_of(path: str | Path) -> frozenset[str]:
    """The tasks of a contract file (e.g. the test side written by `benchmarks/sim_replay.split`)."""
    return frozenset(task_id(s) for s in read_traces(path, derive=False).stages)


def load_replay(path: str | Path, config: ReplayConfig) -> ReplayPlan:
    """The file's workflows as driver stages, in file order; bad lines and unreplayable workflows in `errors`."""
    traces = read_traces(path, derive=False)
    plan = ReplayPlan(errors=list(traces.errors))
    groups: dict[str, list[StageTrace]] = {}
    for stage in traces.stages:
        if stage.is_labelled and (config.task_ids is None or task_id(stage) in config.task_ids):
            groups.setdefault(stage.workflow_id, []).append(stage)
    for workflow_id, stages in groups.items():
        if config.max_workflows and len(plan.workflows) >= config.max_workflows:
            break
        stages = _ordered(stages)
        if stages is None:
            plan.errors.append(
                LineError(
                    str(path),
                    None,
                    f"workflow {workflow_id}: a parent id is not a stage of "
                    "the workflow (or the DAG has a cycle); left out",
                )
            )
            continue
        if config.max_stages_per_workflow:
            stages = stages[: config.max_stages_per_workflow]
        plan.workflows.append(_driver_stages(stages, config))
    return plan


def _ordered(stages: list[StageTrace]) -> list[StageTrace] | None:
    """Stages with every parent before its children (recorded call order where given); None if the DAG is broken."""
    stages = sorted(stages, key=lambda s: (s.call_index is None, s.call_index or 0))
    ids = {s.stage_id for s in stages}
    if any(p not in ids for s in stages for p in s.parent_ids or ()):
        return None
    placed, out = set(), []
    while len(out) < len(stages):
        ready = [s for s in stages if s.stage_id not in placed and set(s.parent_ids or ()) <= placed]
        if not ready:
            return None
        out.append(ready[0])
        placed.add(ready[0].stage_id)
    return out


def _driver_stages(stages: list[StageTrace], config: ReplayConfig) -> list[dict]:
    by_id = {s.stage_id: s for s in stages}
    out = []
    for stage in stages:
        parents = [by_id[p] for p in stage.parent_ids or ()]
        out.append(
            {
                "workflow_id": stage.workflow_id,
                "stage_id": stage.stage_id,
                "role": stage.role,
                "app": stage.app or "trace",
                "parent_ids": [p.stage_id for p in parents],
                "interactive": _interactive(stage, config),
                "is_tool_call": bool(stage.is_tool_call),
                "prompt": chat_messages(stage.prompt),
                "recorded_output_tokens": stage.output_tokens,
                "max_tokens": max(1, min(config.max_tokens_cap, stage.output_tokens)),
                "wait_s": max((_tool_wait_s(p, stage, config) for p in parents), default=0.0),
            }
        )
    return out


def _interactive(stage: StageTrace, config: ReplayConfig) -> bool:
    if stage.interactive is not None:
        return stage.interactive
    return any(fnmatch.fnmatch(stage.app or "", pattern) for pattern in config.interactive_apps)


def _tool_wait_s(parent: StageTrace, child: StageTrace, config: ReplayConfig) -> float:
    """The recorded tool time after `parent`: its `tool_exec_s` if traced, else the timestamp gap to `child`."""
    if not parent.is_tool_call or not config.tool_wait_scale:
        return 0.0
    seconds = parent.tool_exec_s
    if seconds is None:
        stamps = [(s.model_extra or {}).get("timestamp") for s in (parent, child)]
        if not all(isinstance(t, str) for t in stamps):
            return 0.0
        try:
            seconds = (datetime.fromisoformat(stamps[1]) - datetime.fromisoformat(stamps[0])).total_seconds()
        except ValueError:
            return 0.0
    return round(min(config.max_tool_wait_s, max(0.0, seconds) * config.tool_wait_scale), 4)


def chat_messages(prompt: str | list[dict]) -> list[dict]:
    """A recorded prompt as messages a chat endpoint takes: text is one user message; recorded tool calls get the
    ids and `type` OpenAI requires (traces often drop them) and each tool result the id of the call it answers."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    messages, open_calls, num_calls = [], [], 0
    for message in prompt:
        role = message.get("role") or "user"
        content = message.get("content")
        if not isinstance(content, str):
            content = json.dumps(content) if content is not None else ""
        out = {"role": role, "content": content}
        calls = tool_calls(message)
        if role == "assistant" and calls:
            ids = [f"call_{num_calls + i}" for i in range(len(calls))]
            num_calls += len(calls)
            out["tool_calls"] = [
                {
                    "id": i,
                    "type": "function",
                    "function": {"name": str(c.get("name", "")), "arguments": _arguments(c.get("arguments"))},
                }
                for i, c in zip(ids, calls)
            ]
            open_calls = ids
        elif role in TOOL_ROLES:
            out = {
                "role": "tool",
                "content": content,
                "tool_call_id": open_calls.pop(0) if open_calls else f"call_{num_calls}",
            }
            if message.get("name"):
                out["name"] = message["name"]
        messages.append(out)
    return messages


def _arguments(arguments) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments or {})
