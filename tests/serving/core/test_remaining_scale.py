"""The workflow prediction rescaled by its app's ratio of work needed to work predicted over its ended workflows
(`RemainingWork.prediction_scale`), through the one rule the gateway and the simulator follow (`remaining_after_s`)."""

import pytest

from maestro.prediction import WorkflowFallbackLevel
from serving.core.scheduler.remaining import RemainingWork, remaining_after_s

APP, POSITION = WorkflowFallbackLevel.APP, WorkflowFallbackLevel.POSITION


def run(work: RemainingWork, workflow_id: str, app: str, services_s: list[float], predicted_s: float) -> list[float]:
    """A workflow whose every stage is answered by the prediction (`predicted_s` after it): the estimates it got."""
    out = []
    for position, service_s in enumerate(services_s):
        out.append(remaining_after_s(APP, lambda: predicted_s, work, app, position, workflow_id))
        work.observe(workflow_id, app, service_s)
    work.end(workflow_id)
    return out


def test_a_prediction_that_says_half_the_work_is_doubled_once_enough_workflows_ended():
    work = RemainingWork(min_scale_count=3)
    for i in range(3):  # work after positions 0, 1, 2: 20, 10, 0 (Σ 30); predicted 5 each (Σ 15)
        assert run(work, f"w{i}", "app", [10.0, 10.0, 10.0], predicted_s=5.0) == [5.0, 5.0, 5.0]  # not yet
    assert work.prediction_scale("app") == pytest.approx(2.0)
    assert remaining_after_s(APP, lambda: 7.0, work, "app", 0) == pytest.approx(14.0)


def test_the_scale_is_the_apps_own_and_a_dropped_or_unpredicted_workflow_adds_nothing():
    work = RemainingWork(min_scale_count=2)
    for i in range(2):
        run(work, f"over{i}", "over", [1.0, 1.0], predicted_s=4.0)  # needed 1 + 0 against 8
    for i in range(5):
        work.observe(f"plain{i}", "under", 50.0)  # no prediction recorded: no ratio
        work.end(f"plain{i}")
    work.observe_prediction("dropped", "under", 0, 1.0)
    work.observe("dropped", "under", 1.0)
    work.observe("dropped", "under", 99.0)
    work.end("dropped", completed=False)
    assert work.prediction_scale("over") == pytest.approx(1 / 8)
    assert work.prediction_scale("under") == 1.0
    assert work.prediction_scale("never") == 1.0


def test_a_history_answer_is_not_rescaled_nor_recorded():
    work = RemainingWork(min_count=1, min_scale_count=1)
    run(work, "w0", "app", [1.0, 3.0], predicted_s=1.0)  # needed 3 + 0 against 2: scale 1.5
    assert remaining_after_s(POSITION, lambda: 1.0, work, "app", 0, "w1") == pytest.approx(3.0)  # its own history
    assert remaining_after_s(POSITION, lambda: 1.0, work, "app", 5, "w1") == pytest.approx(1.5)  # the prediction
    assert remaining_after_s(APP, lambda: 0.0, work, "app", 0) == 0.0


def test_bad_settings_and_a_negative_prediction_are_refused():
    with pytest.raises(ValueError, match="min_scale_count"):
        RemainingWork(min_scale_count=0)
    with pytest.raises(ValueError, match="predicted_s"):
        RemainingWork().observe_prediction("w", "app", 0, -1.0)
