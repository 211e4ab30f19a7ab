"""An arm that feeds one use of the prediction from another source differs from its base in that use alone."""

from __future__ import annotations

import pytest

from benchmarks.referee.arms import USES, parse_arm, predict_ready, read_use
from serving.sim.ready import ReadyPredictions
from serving.sim.workload import SimStage, SimWorkflow


def chain() -> list[SimStage]:
    workflow = SimWorkflow("w", "app", interactive=False, slo_s=60.0)
    for i, output_tokens in enumerate((3000, 40)):
        parents = [i - 1] if i else []
        stage = SimStage(workflow, i, f"s{i}", "agent", "llama-3-8b", parents, output_tokens, False, prompt_tokens=500)
        workflow.stages.append(stage)
    return workflow.stages


def predicted(arm_name: str, sources: dict) -> dict[str, object]:
    stage = chain()[0]
    predict_ready(parse_arm(arm_name), sources)(stage)
    return {use: read_use(stage, use) for use in USES}


@pytest.fixture
def sources():
    return {"oracle": ReadyPredictions("oracle"), "none": ReadyPredictions("none")}


@pytest.mark.parametrize("use", USES)
def test_an_arm_fed_one_use_from_another_source_differs_from_its_base_in_that_use_only(sources, use):
    base, other = predicted("maestro[oracle]", sources), predicted("maestro[none]", sources)
    assert base[use] != other[use]  # the two sources disagree on every use, so the test can see a swap
    fed = predicted(f"maestro[oracle/none-{use}]", sources)
    assert fed == {**base, use: other[use]}
    reverse = predicted(f"maestro[none/oracle-{use}]", sources)
    assert reverse == {**other, use: base[use]}


def test_the_old_names_are_the_none_feeds_and_a_use_fed_twice_is_refused():
    assert parse_arm("maestro[model/no-reserve]").fed == parse_arm("maestro[model/none-reserve]").fed
    assert parse_arm("maestro[prior/no-remaining]").fed == (("remaining", "none"),)
    assert parse_arm("maestro[oracle/oracle-service]").fed == ()  # fed from its own source: nothing to swap
    assert parse_arm("maestro[none/model-reserve]").needs_model
    assert parse_arm("maestro[model/oracle-reserve,oracle-service]").sources == ("model", "oracle")
    with pytest.raises(ValueError, match="'reserve' is fed from two sources"):
        parse_arm("maestro[model/none-reserve,oracle-reserve]")
    with pytest.raises(ValueError, match="SOURCE-USE"):
        parse_arm("maestro[model/oracle-reserv]")
