"""The engine plans tell a stage nothing of its own outcome: what a request is sent with (its Maestro hints, its vLLM
priority) is the same whatever its own true length and `is_tool_call`, and those of its later stages.

tests/benchmarks/referee/test_referee_engine.py checks the stages before a cut; this checks the cut stage itself, for
every default engine arm. A chain workflow is changed from its cut on (every stage's true output three times longer or
a third as long, `is_tool_call` flipped), the plans built again: the cut stage's hints and priority must be the same,
in every copy of the workflow. maestro[oracle] is told its own true length and its workflow's true remaining work (by
definition of that arm): its tokens and remaining work are left out of its comparison. With the later stages dropped
instead, the cut stage becomes its workflow's last and its `final` hint turns true: the one hint that may follow the
future, because the plugin reads it only as the request leaves the engine, when its client knows it
(tests/benchmarks/engine/test_engine_leaks.py checks that on a real engine).
"""

from __future__ import annotations

import pytest

from benchmarks.engine.arms import DEFAULT_ARMS, engine_arm
from benchmarks.engine.config import EngineConfig
from benchmarks.engine.replay import EngineWorkload
from maestro.contract import StageTrace

from .engine_cuts import chains, trained_sides, truncate

RATE, SEED, WORKFLOWS = 20.0, 0, 40
# the default arms, and the gated gateway arm (the batch-cost gate in front of the engine reads the same plan entries)
ARMS = [engine_arm(name) for name in (*DEFAULT_ARMS, "gateway+gate+vllm-priority-deadline")]
ORACLE_TRUTHS = ("tokens_pred", "tokens_reserve", "workflow_remaining_s")


@pytest.fixture(scope="module")
def sides():
    return trained_sides()


def relabel_from(test: list[StageTrace], workflow_id: str, cut: int) -> list[StageTrace]:
    out, position = [], 0
    for stage in test:
        if stage.workflow_id == workflow_id:
            if position >= cut:
                tokens = stage.output_tokens * 3 if stage.output_tokens < 1000 else stage.output_tokens // 3
                stage = stage.model_copy(update={"output_tokens": tokens, "is_tool_call": not stage.is_tool_call})
            position += 1
        out.append(stage)
    return out


def told(plan: dict, workflow_id: str, cut: int, allowed: tuple[str, ...]) -> list:
    """What each copy of the workflow's cut stage is sent with: its hints (less `allowed`), its priority and what its
    gateway is told (`gateway+` arms)."""
    out = []
    for wf in plan["workflows"]:
        if wf["id"].split("#")[0] == workflow_id:
            spec = wf["stages"][cut]
            hints = {k: v for k, v in (spec.get("hints") or {}).items() if k not in allowed}
            out.append((wf["id"], hints, spec.get("priority"), spec.get("gateway")))
    return out


@pytest.mark.parametrize("change", [relabel_from, truncate])
def test_a_stage_is_told_nothing_of_its_own_outcome(sides, change):
    split, model_dir = sides
    targets = chains(split.test)
    assert targets, "the replayed side must hold chain workflows to cut"
    original = EngineWorkload(split.train, split.test, model_dir, EngineConfig()).plans(ARMS, RATE, SEED, WORKFLOWS, "")
    for workflow_id, cut in targets:
        test = change(split.test, workflow_id, cut)
        changed = EngineWorkload(split.train, test, model_dir, EngineConfig()).plans(ARMS, RATE, SEED, WORKFLOWS, "")
        for arm in original:
            allowed = ORACLE_TRUTHS if arm == "maestro[oracle]" else ()
            allowed += ("final",) if change is truncate else ()
            before, after = (
                told(original[arm], workflow_id, cut, allowed),
                told(changed[arm], workflow_id, cut, allowed),
            )
            assert before, f"{workflow_id} is not replayed in the plan"
            assert before == after, (
                f"{arm}, {change.__name__} of {workflow_id} at {cut}: the cut stage is told otherwise"
            )
        if change is relabel_from:  # the comparison sees a truth where one is told: the oracle's own length
            oracle = [
                told(plans[arm], workflow_id, cut, ()) for plans in (original, changed) for arm in ["maestro[oracle]"]
            ]
            assert oracle[0] != oracle[1]
        if change is truncate:  # the cut stage is now the last: told `final`, in every Maestro arm
            finals = [h.get("final") for _, h, *_ in told(changed["maestro[none]"], workflow_id, cut, ())]
            assert finals and all(finals)
