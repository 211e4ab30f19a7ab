"""Which remaining-work estimate a ready stage gets (`remaining_after_s`), the one rule the gateway and the simulator
follow: the model's workflow answer for an app it was trained on, else the app's own ended workflows once they reached
the position, else the all-apps table (POSITION) or every app's history (PRIOR); a prediction it uses is scaled by
what the app's ended workflows realised against what was predicted for them."""

import pytest

from maestro.prediction import WorkflowFallbackLevel
from serving.core.scheduler.remaining import RemainingWork, remaining_after_s

APP, POSITION, PRIOR = WorkflowFallbackLevel.APP, WorkflowFallbackLevel.POSITION, WorkflowFallbackLevel.PRIOR
PREDICTED_S = 50.0


def history(runs: dict[str, list[list[float]]]) -> RemainingWork:
    """Ended workflows, per app, as lists of their stages' service seconds."""
    work = RemainingWork(min_count=2)
    for app, workflows in runs.items():
        for i, services in enumerate(workflows):
            for service_s in services:
                work.observe(f"{app}-{i}", app, service_s)
            work.end(f"{app}-{i}")
    return work


def rule(level: WorkflowFallbackLevel, work: RemainingWork, app: str, position: int = 0) -> float:
    return remaining_after_s(level, lambda: PREDICTED_S, work, f"{app}-live", app, position)


def test_an_app_the_model_was_trained_on_gets_the_prediction_even_with_history():
    work = history({"seen": [[1.0, 2.0], [1.0, 4.0]]})
    assert rule(APP, work, "seen") == PREDICTED_S


def test_a_table_or_prior_answer_gives_way_to_the_apps_own_history():
    work = history({"new": [[1.0, 2.0], [1.0, 4.0]], "other": [[1.0, 100.0], [1.0, 100.0]]})
    assert rule(POSITION, work, "new") == pytest.approx(3.0)  # (2 + 4) / 2: its own workflows, not "other"'s
    assert rule(PRIOR, work, "new") == pytest.approx(3.0)


def test_without_the_apps_own_history_a_table_answer_stands():
    work = history({"other": [[1.0, 100.0], [1.0, 100.0]], "new": [[1.0, 2.0]]})  # one ended workflow < min_count
    assert work.own_estimate("new", 0) is None
    assert rule(POSITION, work, "new") == PREDICTED_S
    assert rule(POSITION, work, "other", position=5) == PREDICTED_S  # no ended workflow of "other" reached 5


def test_without_the_apps_own_history_a_prior_answer_takes_every_apps_history():
    work = history({"other": [[1.0, 100.0], [1.0, 100.0]]})
    assert rule(PRIOR, work, "new") == pytest.approx(work.estimate("new", 0)) == pytest.approx(100.0)
    assert rule(PRIOR, RemainingWork(), "new") == 0.0  # no history at all


def test_the_prediction_is_computed_only_where_it_is_used():
    def never() -> float:
        raise AssertionError("the prediction was read where the history answers")

    work = history({"new": [[1.0, 2.0], [1.0, 4.0]]})
    assert remaining_after_s(POSITION, never, work, "new-live", "new", 0) == pytest.approx(3.0)


def test_tool_time_is_kept_apart_from_service_and_counted_from_the_stage_on():
    work = RemainingWork(min_count=2)
    for i, tools in enumerate([[3.0, 0.0, 1.0], [5.0, 2.0, 0.0]]):
        for tool_s in tools:
            work.observe(f"w{i}", "app", 1.0)
            work.observe_tool(f"w{i}", tool_s)
        work.end(f"w{i}")
    assert [work.estimate("app", k) for k in range(3)] == [2.0, 1.0, 0.0]  # service only: no tool time in it
    assert [work.tool_ahead_s("app", k) for k in range(3)] == [5.5, 1.5, 0.5]  # the k-th stage's own tool included
    assert work.tool_ahead_s("other", 0) == 5.5  # all apps' table where the app has none
    assert RemainingWork().tool_ahead_s("app", 0) == 0.0


def test_a_negative_tool_time_is_refused():
    with pytest.raises(ValueError, match="tool_s"):
        RemainingWork().observe_tool("w", -1.0)


def run(work: RemainingWork, workflow_id: str, app: str, services: list[float], predicted_s: float) -> None:
    """A workflow whose every stage was predicted `predicted_s` seconds of work after it (the rule used the answer)."""
    for position, service_s in enumerate(services):
        remaining_after_s(APP, lambda: predicted_s, work, workflow_id, app, position)
        work.observe(workflow_id, app, service_s)


def test_the_prediction_is_scaled_by_what_the_apps_ended_workflows_realised_against_it():
    work = RemainingWork(min_scale_workflows=2)
    run(work, "a0", "slow", [1.0, 2.0, 3.0], predicted_s=10.0)  # realised after each stage: 5, 3, 0 against 10 each
    work.end("a0")
    assert work.scale("slow") == 1.0  # one scored workflow < min_scale_workflows
    run(work, "a1", "slow", [1.0, 2.0, 3.0], predicted_s=10.0)
    work.end("a1")
    assert work.scale("slow") == pytest.approx(16 / 60)  # (5 + 3 + 0) × 2 over 10 × 6
    assert rule(APP, work, "slow") == pytest.approx(PREDICTED_S * 16 / 60)
    assert work.scale("other") == 1.0 and rule(APP, work, "other") == PREDICTED_S  # another app: its own scale


def test_only_completed_workflows_score_and_running_ones_never_do():
    work = RemainingWork(min_scale_workflows=1)
    run(work, "dropped", "app", [1.0, 9.0], predicted_s=1.0)
    work.end("dropped", completed=False)
    run(work, "running", "app", [1.0, 9.0], predicted_s=1.0)  # not ended: what follows it is not known yet
    assert work.scale("app") == 1.0
    run(work, "done", "app", [2.0, 4.0], predicted_s=8.0)
    work.end("done")
    assert work.scale("app") == pytest.approx(4 / 16)  # (4 + 0) over 8 × 2: the dropped and running ones unscored


def test_an_answer_from_the_history_is_not_scaled_nor_scored():
    work = history({"new": [[1.0, 2.0], [1.0, 4.0]]})
    work.min_scale_workflows = 1
    run(work, "x", "seen", [1.0, 1.0], predicted_s=4.0)
    work.end("x")
    assert work.scale("seen") == pytest.approx(1 / 8)
    assert rule(POSITION, work, "new") == pytest.approx(3.0)  # the app's own history answers, unscaled
    assert work.scale("new") == 1.0  # and nothing of "new" was scored
