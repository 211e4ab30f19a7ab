"""A replayed stage's output cap is what its request declared, never its recorded length.

The cap is the trace row's own `max_tokens` where it has one, else the default cap (`pipelines.synth.MAX_TOKENS`); a
recorded output longer than its cap is replayed truncated to the cap. In the default traces no row declares a cap and
one stage (of 5,657; dev side's replayed half) recorded more than the default: it is the one truncated.
"""

from __future__ import annotations

import pytest

from benchmarks.referee.sides import DEFAULT_TRACES, read_all
from maestro.contract import StageTrace
from pipelines.synth import MAX_TOKENS
from serving.sim.workload import trace_workflows


def one_stage(output_tokens: int, **declared) -> StageTrace:
    return StageTrace.model_validate(
        dict(workflow_id="w", stage_id="s", role="agent", prompt="hi", output_tokens=output_tokens, **declared)
    )


def replayed(stage: StageTrace):
    return trace_workflows([stage], "llama-3-8b")[0].stages[0]


@pytest.mark.parametrize("output_tokens", [10, MAX_TOKENS, MAX_TOKENS + 65])
def test_without_a_declared_cap_the_default_one(output_tokens):
    stage = replayed(one_stage(output_tokens))
    assert stage.max_tokens == MAX_TOKENS
    assert stage.output_tokens == min(output_tokens, MAX_TOKENS)


def test_a_declared_cap_is_kept_whatever_the_length():
    assert (
        replayed(one_stage(5000, max_tokens=8192)).max_tokens,
        replayed(one_stage(10, max_tokens=8192)).max_tokens,
    ) == (
        8192,
        8192,
    )
    truncated = replayed(one_stage(300, max_tokens=256))
    assert (truncated.max_tokens, truncated.output_tokens) == (256, 256)


@pytest.mark.parametrize("bad", [0, -3, "many", True])
def test_a_bad_declared_cap_names_the_field(bad):
    with pytest.raises(ValueError, match="max_tokens must be a positive number of tokens"):
        replayed(one_stage(10, max_tokens=bad))


def test_the_default_traces_truncate_one_stage():
    if not DEFAULT_TRACES[0].exists():
        pytest.skip(f"{DEFAULT_TRACES[0]} is missing (../shared/data)")
    rows = read_all(DEFAULT_TRACES)
    stages = [s for w in trace_workflows(rows, "llama-3-8b") for s in w.stages]
    assert {s.max_tokens for s in stages} == {MAX_TOKENS}  # no row declares a cap
    recorded = {(r.workflow_id, r.stage_id): max(1, r.output_tokens) for r in rows if r.output_tokens is not None}
    truncated = [s for s in stages if recorded[(s.workflow.source_id, s.stage_id)] != s.output_tokens]
    assert [(s.workflow.app, recorded[(s.workflow.source_id, s.stage_id)], s.output_tokens) for s in truncated] == [
        ("chatdev_warehouse", 4161, MAX_TOKENS)
    ]
