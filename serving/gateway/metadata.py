"""Workflow metadata of one call, from `X-Maestro-*` headers or the body's `metadata` (headers win)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

HEADERS = {"workflow": "x-maestro-workflow", "stage": "x-maestro-stage", "role": "x-maestro-role",
           "parents": "x-maestro-parents", "app": "x-maestro-app", "interactive": "x-maestro-interactive"}


@dataclass(frozen=True)
class StageMeta:
    """Who this call is: without metadata, a fresh one-stage workflow."""

    workflow_id: str
    stage_id: str
    role: str = "unknown"
    parent_ids: tuple[str, ...] = ()
    app: str | None = None
    interactive: bool = True

    @property
    def key(self) -> str:
        return f"{self.workflow_id}::{self.stage_id}"


def _truthy(value) -> bool:
    return str(value).strip().lower() in {"1", "true", "yes", "on"}


def _parents(value) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return tuple(p.strip() for p in str(value).split(",") if p.strip())


def parse_metadata(headers, body: dict) -> StageMeta:
    """Headers first, then `metadata` in the body; missing ids make a one-stage workflow."""
    meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    get = lambda key: headers.get(HEADERS[key]) or meta.get(key) or meta.get(f"{key}_id")  # noqa: E731
    workflow_id = get("workflow") or f"gw-{uuid.uuid4().hex[:16]}"
    interactive = get("interactive")
    return StageMeta(workflow_id=str(workflow_id), stage_id=str(get("stage") or "0"), role=str(get("role") or "unknown"),
                     parent_ids=_parents(headers.get(HEADERS["parents"]) or meta.get("parents") or meta.get("parent_ids")),
                     app=get("app"), interactive=True if interactive is None else _truthy(interactive))
