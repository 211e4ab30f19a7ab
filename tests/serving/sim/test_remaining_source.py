"""The simulator's ready stage gets its remaining work by the gateway's rule (`remaining_after_s`), and the `prior`
source labels a cell its training side saw as the app's own answer."""

from types import SimpleNamespace

import pytest

from maestro.prediction import WorkflowFallbackLevel
from serving.core.request import workflow_remaining_s
from serving.core.scheduler.remaining import RemainingWork
from serving.sim.costmodel import CostModel, CostModelConfig
from serving.sim.gpu_pace import ModelPace
from serving.sim.ready import NOTHING_LEFT, WorkflowPrior, answers_digest, known_remaining
from serving.sim.stage_request import predicted_remaining_s
from serving.sim.workload import SimStage, SimWorkflow

COST = CostModel(CostModelConfig())
MODEL = "llama-3-8b"


def ready_stage(app: str, answer) -> SimStage:
    workflow = SimWorkflow(f"{app}-live", app, interactive=False, slo_s=60.0)
    stage = SimStage(workflow, 0, "s0", "agent", MODEL, [], 10, False, prompt_tokens=200, remaining=answer)
    workflow.stages.append(stage)
    return stage


def history_of(app: str) -> RemainingWork:
    work = RemainingWork(min_count=2)
    for i, after_s in enumerate((2.0, 4.0)):
        work.observe(f"{app}-{i}", app, 1.0)
        work.observe(f"{app}-{i}", app, after_s)
        work.end(f"{app}-{i}")
    return work


def answer_s(answer) -> float:
    return workflow_remaining_s(ModelPace.of(COST, MODEL), 200, answer.wf_remaining_calls, answer.wf_remaining_tokens)


@pytest.mark.parametrize(
    ("level", "is_history"),
    [(WorkflowFallbackLevel.APP, False), (WorkflowFallbackLevel.POSITION, True), (WorkflowFallbackLevel.PRIOR, True)],
)
def test_a_ready_stage_reads_its_apps_history_unless_the_model_knows_the_app(level, is_history):
    answer = known_remaining(3.0, 900.0, level)
    got = predicted_remaining_s(ready_stage("new", answer), COST, history_of("new"))
    assert got == pytest.approx(3.0 if is_history else answer_s(answer))
    other = predicted_remaining_s(ready_stage("new", answer), COST, history_of("other"))
    expected = {"app": answer_s(answer), "position": answer_s(answer), "prior": 3.0}[level.value]
    assert other == pytest.approx(expected)  # no history of "new": the answer, or every app's history for PRIOR


def test_an_arm_that_reads_no_workflow_estimate_keeps_it_and_a_stage_without_an_answer_reads_the_history():
    assert predicted_remaining_s(ready_stage("new", NOTHING_LEFT), COST, history_of("new")) == answer_s(NOTHING_LEFT)
    assert predicted_remaining_s(ready_stage("new", None), COST, history_of("new")) == pytest.approx(3.0)


def test_the_prior_source_labels_a_cell_training_saw_as_the_apps_and_the_rest_as_the_table():
    prior = WorkflowPrior.__new__(WorkflowPrior)  # its table alone: ("seen", 0) a cell training saw
    prior.table = SimpleNamespace(cells_={("seen", 0): (2.0, 300.0)})
    seen = prior.lookup(ready_stage("seen", None))
    assert (seen.wf_remaining_calls, seen.wf_remaining_tokens, seen.wf_fallback_level) == (2.0, 300.0, "app")
    unseen = prior.lookup(ready_stage("new", None))
    assert (unseen.wf_remaining_calls, unseen.wf_remaining_tokens, unseen.wf_fallback_level) == (0.0, 0.0, "position")


def test_the_simulator_feeds_the_history_as_the_gateway_does_service_as_attained_and_tool_wall_time_apart():
    # the gateway's side: tests/serving/gateway/test_gateway_triage.py
    from serving.core.systems import get_system
    from serving.sim.engine import ClusterConfig, Simulator

    workflow = SimWorkflow("w", "app", False, 1e6)
    first = SimStage(workflow, 0, "s0", "agent", MODEL, [], 20, True, tool_exec_s=2.5, prompt_tokens=300)
    second = SimStage(workflow, 1, "s1", "agent", MODEL, [0], 30, False, prompt_tokens=400, session_parent=0)
    first.children = [1]
    workflow.stages, workflow.num_stages_left = [first, second], 2
    work = RemainingWork(min_count=1)
    cluster = ClusterConfig(num_nodes=1, show_progress=False)
    sim = Simulator(cluster, get_system("fcfs"), [workflow], remaining_work=work)
    sim.run()
    assert workflow.done_s > 0
    second_service_s = ModelPace.of(sim.cost, MODEL).service_s(400, 30)
    assert work.estimate("app", 0) == pytest.approx(second_service_s)  # the call's service, no tool time in it
    assert workflow.attained_service_s == pytest.approx(
        ModelPace.of(sim.cost, MODEL).service_s(300, 20) + second_service_s
    )
    assert work.tool_ahead_s("app", 0) == pytest.approx(2.5)  # the tool's wall time, alone on the host
    assert work.tool_ahead_s("app", 1) == 0.0


def test_a_sources_answers_digest_alike_whatever_their_order_and_differ_with_any_answer():
    # which predictor answered, whatever directory it was loaded from (the referee's `model_answers_sha256`)
    first = known_remaining(2.0, 120.0, WorkflowFallbackLevel.APP)
    cache = {
        ("w1", "s0", frozenset()): (40, 90, first, None),
        ("w1", "s1", frozenset({"s0", "a"})): (12, 30, NOTHING_LEFT, None),
    }
    again = dict(reversed(list(cache.items())))
    again[("w1", "s1", frozenset({"a", "s0"}))] = again.pop(("w1", "s1", frozenset({"s0", "a"})))
    assert answers_digest(cache) == answers_digest(again)
    for changed in ((40, 91, first, None), (40, 90, known_remaining(3.0, 120.0, WorkflowFallbackLevel.APP), None)):
        assert answers_digest({**cache, ("w1", "s0", frozenset()): changed}) != answers_digest(cache)
