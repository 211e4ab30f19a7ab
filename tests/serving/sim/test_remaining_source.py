"""The simulator's ready stage gets its remaining work by the gateway's rule (`remaining_after_s`), and the `prior`
source labels a cell its training side saw as the app's own answer."""

from types import SimpleNamespace

import pytest

from maestro.prediction import WorkflowFallbackLevel
from serving.core.request import workflow_remaining_s
from serving.core.scheduler.remaining import RemainingWork
from serving.sim.costmodel import CostModel, CostModelConfig
from serving.sim.gpu_pace import ModelPace
from serving.sim.ready import NOTHING_LEFT, WorkflowPrior, known_remaining
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
