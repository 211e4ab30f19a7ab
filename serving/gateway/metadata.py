"""Workflow metadata of one call, from `X-Maestro-*` headers or the body's `metadata` (headers win).

With API keys on, a call also has its caller's key id: workflows and idempotency keys are the caller's own,
so two callers using the same workflow/stage ids never meet.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

HEADERS = {
    "workflow": "x-maestro-workflow",
    "stage": "x-maestro-stage",
    "role": "x-maestro-role",
    "parents": "x-maestro-parents",
    "app": "x-maestro-app",
    "interactive": "x-maestro-interactive",
    "final": "x-maestro-final",
    "tool_call": "x-maestro-tool-call",
    "slo": "x-maestro-slo-s",
}
# The same facts as body `metadata` keys, keyed as HEADERS (the first key given wins); the gateway reads no other key
METADATA_KEYS = {
    "workflow": ("workflow", "workflow_id"),
    "stage": ("stage", "stage_id"),
    "role": ("role",),
    "parents": ("parents", "parent_ids"),
    "app": ("app",),
    "interactive": ("interactive",),
    "final": ("final",),
    "tool_call": ("tool_call",),
    "slo": ("slo_s",),
}
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")  # X-Maestro-Interactive/-Final values
BOOLEAN_KEYS = ("interactive", "final", "tool_call")
TRACE_HEADERS = ("traceparent", "tracestate")  # W3C trace context: the caller's trace, passed on to vLLM (spans.py)


@dataclass(frozen=True)
class StageMeta:
    """Who this call is: without metadata, a fresh one-stage workflow."""

    workflow_id: str
    stage_id: str
    role: str = "unknown"
    parent_ids: tuple[str, ...] = ()
    app: str | None = None
    interactive: bool = True
    final: bool = False  # the workflow's last call: its session ends with it (gateway/sessions.py)
    # the caller will run a tool on this call's answer (as when the answer holds tool_calls): a tool phase follows
    tool_call: bool = False
    slo_s: float | None = None  # the workflow's latency objective, seconds from its first call (Maestro's deadline)
    caller_id: str = ""  # the API key's id (maestro.keys.key_id); empty without API keys
    trace_context: tuple[tuple[str, str], ...] = ()  # the caller's TRACE_HEADERS (name, value), as they came

    @property
    def workflow_key(self) -> str:
        """The workflow as the gateway keeps it: the caller's own."""
        return workflow_key(self.caller_id, self.workflow_id)

    @property
    def key(self) -> tuple[str, str, str]:
        """The stage's idempotency key: (caller, workflow, stage) as given, so no two distinct stages share it
        (joining them into one string let "a::b" + "c" meet "a" + "b::c")."""
        return self.caller_id, self.workflow_id, self.stage_id

    @property
    def label(self) -> str:
        """The stage as people and vLLM's request ids read it: `workflow::stage` (the caller's workflow)."""
        return f"{self.workflow_key}::{self.stage_id}"


def workflow_key(caller_id: str, workflow_id: str) -> str:
    """StageMeta.workflow_key; from an idempotency key (StageMeta.key): `workflow_key(*key[:2])`."""
    return f"{caller_id}/{workflow_id}" if caller_id else workflow_id


def _truthy(value) -> bool:
    return str(value).strip().lower() in TRUE_WORDS


def _parents(value) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return tuple(p.strip() for p in str(value).split(",") if p.strip())


def _first(*values):
    """The first value given (not None, not empty): a metadata `false` or `0` counts."""
    return next((v for v in values if v is not None and v != ""), None)


def parse_metadata(headers, body: dict, caller_id: str = "") -> StageMeta:
    """Headers first, then `metadata` in the body; missing ids make a one-stage workflow.
    The values are taken as they are: `validation.read_call` checked them."""
    meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    get = lambda fact: _first(headers.get(HEADERS[fact]), *(meta.get(key) for key in METADATA_KEYS[fact]))
    workflow_id = _first(get("workflow"), f"gw-{uuid.uuid4().hex[:16]}")
    interactive, final, tool_call = get("interactive"), get("final"), get("tool_call")
    slo, parents = get("slo"), get("parents")
    return StageMeta(
        workflow_id=str(workflow_id),
        stage_id=str(_first(get("stage"), "0")),
        role=str(get("role") or "unknown"),
        parent_ids=_parents(parents),
        app=get("app"),
        interactive=True if interactive is None else _truthy(interactive),
        final=final is not None and _truthy(final),
        tool_call=tool_call is not None and _truthy(tool_call),
        slo_s=None if slo is None else float(slo),
        caller_id=caller_id,
        trace_context=tuple((name, headers[name]) for name in TRACE_HEADERS if headers.get(name)),
    )
