"""The referee's simulator knows no future: change what a workflow does later, and nothing decided before is changed.

Each case replays real held-out workflows, picks one workflow and a moment T (the time one of its stages becomes
ready), changes that workflow from there on — its later stages three times longer, or its last stages dropped — and
replays again: every decision (start, drop, keep or evict at a tool call) of every workflow before T must be the same.
The same check with the per-workflow SLO computed from true lengths (the simulator's legacy `scaled` mode) must find
a difference: that is the leak the referee removes, and the proof that this test can fail.
"""

from __future__ import annotations

import pytest

from benchmarks.referee.arms import parse_arm
from benchmarks.referee.grid import Replay
from benchmarks.referee.sides import DEFAULT_TRACES, read_all, side_split
from maestro.contract import StageTrace
from pipelines.features import FeaturizerConfig
from pipelines.model import ModelConfig
from pipelines.predictor import Predictor
from pipelines.synth import generate
from serving.sim.ready import ReadyPredictions
from serving.sim.slo import SLOConfig, apply_slo
from serving.sim.workload import SimWorkflow

NODES, RATE, WORKFLOWS = 1, 1.0, 160  # past the knee on one node: queues form, so the order decides who starts


@pytest.fixture(scope="module")
def replay() -> Replay:
    split = side_split(read_all(DEFAULT_TRACES), "dev")
    return Replay(split.train, split.test, None, nodes=NODES, workflows=WORKFLOWS)


def candidates(replay: Replay, limit: int = 4) -> list[tuple[int, int]]:
    """(workflow index, stage index) pairs: a workflow of several stages, cut at a middle stage."""
    workflows = replay.workload(RATE, 0)
    out = []
    middle = len(workflows) // 2  # arrived once queues have formed
    for i, workflow in enumerate(workflows[middle:], start=middle):
        if len(workflow.stages) >= 4 and all(s.parents == [s.index - 1] for s in workflow.stages[1:]):
            out.append((i, len(workflow.stages) // 2))
        if len(out) == limit:
            break
    return out


def lengthen(workflow: SimWorkflow, cut: int) -> None:
    for stage in workflow.stages[cut:]:
        stage.output_tokens = min(stage.max_tokens, stage.output_tokens * 3)


def truncate(workflow: SimWorkflow, cut: int) -> None:
    """Drop the stages from `cut` on (a chain: each stage's one parent is the one before)."""
    del workflow.stages[cut + 1 :]
    workflow.stages[cut].children = []
    workflow.num_stages_left = len(workflow.stages)


def decisions_before(replay: Replay, arm_name: str, change, target: tuple[int, int], legacy_slo: bool):
    """(decisions of the original run before T, of the changed run before T)."""
    arm, (index, cut) = parse_arm(arm_name), target
    runs = []
    for changed in (False, True):
        workflows = replay.workload(RATE, 0)
        if changed:
            change(workflows[index], cut)
        if legacy_slo:  # the deadline from every stage's true length, the future included
            apply_slo(workflows, replay.cost, SLOConfig(mode="scaled"))
        outcome = replay.run(arm, workflows, 0, log_decisions=True)
        runs.append((outcome.extra["decisions"], workflows[index].stages[cut].ready_s))
    # T: when the first changed stage became ready (never, where its workflow was abandoned before it in both runs)
    moment = min([ready for _, ready in runs if ready >= 0], default=float("inf"))
    return [[d for d in log if d[0] < moment] for log, _ in runs]


# maestro[oracle] is told the truth, its workflows' remaining work included: it is checked without that part (its
# true stage lengths are the ready stage's own). Maestro's triage turns workflows away here (asserted): the check
# covers its decisions too.
@pytest.mark.parametrize(
    "arm", ["edf", "maestro[oracle/no-remaining]", "maestro[none]", "edf+admission", "maestro[none/slack]"]
)
@pytest.mark.parametrize("change", [lengthen, truncate])
def test_no_decision_reads_the_future(replay, arm, change):
    if arm == "edf+admission":
        arm = "maestro[oracle/no-order,no-remaining]"  # the same system without a trained model (EDF order)
    for target in candidates(replay):
        before, after = decisions_before(replay, arm, change, target, legacy_slo=False)
        assert before, "the cut must come after some decisions, or the test checks nothing"
        assert before == after, f"{arm}, {change.__name__} at {target}: a decision before the change differs"
        if arm == "maestro[none]":
            assert any(d[1] == "reject" for d in before)


def test_the_check_catches_deadlines_from_true_lengths(replay):
    """With the legacy per-workflow SLO, lengthening a workflow's later stages moves its deadline from its arrival
    on: EDF's earlier decisions change for at least one of the workflows tried."""
    leaks = [
        before != after
        for target in candidates(replay)
        for before, after in [decisions_before(replay, "edf", lengthen, target, legacy_slo=True)]
    ]
    assert any(leaks)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A small predictor without embeddings (trains in seconds)."""
    stages = [StageTrace.model_validate(r) for r in generate(300, seed=11)]
    fast = ModelConfig(folds=3, classifier=dict(n_estimators=30), regressor=dict(n_estimators=40))
    return Predictor.train(stages, FeaturizerConfig(use_embedding=False), fast).save(
        tmp_path_factory.mktemp("model") / "predictor"
    )


def test_the_oracle_margin_reads_the_training_side_only(replay, model_dir):
    """The oracle's (and the noise arms') reserve margin is the model's on training workflows: replayed workflows
    that ran three times longer leave it as it was."""
    longer = [s.model_copy(update={"output_tokens": 3 * s.output_tokens}) for s in replay.test]
    margins = [
        Replay(replay.train, test, model_dir, nodes=NODES, workflows=WORKFLOWS).model_margin()
        for test in (replay.test, longer)
    ]
    assert margins[0] == margins[1] > 1.0


def test_a_model_prediction_reads_finished_ancestors_only(replay, model_dir):
    """The trained model's answer at readiness is the same whatever the stage's later stages (and its own) did."""
    chain = next(w for w in replay.workload(RATE, 0) if len(w.stages) >= 4)
    first = ReadyPredictions("model", model_dir)
    first.prewarm(chain.stages)
    lengthen(chain, 1)
    chain.stages[1].is_tool_call = not chain.stages[1].is_tool_call
    second = ReadyPredictions("model", model_dir)
    second.prewarm(chain.stages)
    changed = {s.stage_id for s in chain.stages[1:]}
    unchanged = [key for key in first.cache if not key[2] & changed]  # no changed stage among its ancestors
    assert unchanged and all(first.cache[key] == second.cache[key] for key in unchanged)
    assert first.cache != second.cache, "the later stages' outcomes must reach their descendants' predictions"
