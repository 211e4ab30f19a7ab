"""A workflow's structure derived from its stages where a producer left it out: call order, depth, degrees."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # contract.py reads traces through derive_structure
    from maestro.contract import StageTrace


def derive_structure(
    stages: list[StageTrace], known: dict[str, dict[str, StageTrace]] | None = None
) -> list[StageTrace]:
    """Fill call_index, depth and in/out degree where a producer left them out (in place).

    `known`: earlier stages of the same workflows that are not in `stages` (workflow_id → stage_id →
    stage, with depth and call_index set), e.g. a live workflow's finished stages; they count as
    parents for depth and come before `stages` in call order."""
    by_workflow: dict[str, list[StageTrace]] = {}
    for stage in stages:
        by_workflow.setdefault(stage.workflow_id, []).append(stage)
    for workflow_id, members in by_workflow.items():
        _derive_workflow(members, (known or {}).get(workflow_id, {}))
    return stages


def _derive_workflow(members: list[StageTrace], known: dict[str, StageTrace]) -> None:
    ids = {**known, **{s.stage_id: s for s in members}}
    children: dict[str, int] = {}
    for index, stage in enumerate(members):
        if stage.call_index is None:
            stage.call_index = len(known) + index
        parents = [p for p in (stage.parent_ids or []) if p in ids]
        stage.in_degree = len(stage.parent_ids or [])
        for parent in parents:
            children[parent] = children.get(parent, 0) + 1
    for stage in members:
        stage.out_degree = children.get(stage.stage_id, 0)
        if stage.depth is None:
            stage.depth = _depth(stage, ids, {})


def _depth(stage: StageTrace, ids: dict[str, StageTrace], memo: dict[str, int]) -> int:
    # Iterative longest-path depth; a cycle in bad data is cut rather than recursed forever.
    if stage.stage_id in memo:
        return memo[stage.stage_id]
    memo[stage.stage_id] = 0
    parents = [ids[p] for p in (stage.parent_ids or []) if p in ids]
    depth = 0
    for parent in parents:
        parent_depth = parent.depth if parent.depth is not None else _depth(parent, ids, memo)
        depth = max(depth, parent_depth + 1)
    memo[stage.stage_id] = depth
    return depth
