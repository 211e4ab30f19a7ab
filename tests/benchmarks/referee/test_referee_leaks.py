"""The referee's simulator knows no future: change what a workflow does from one of its stages on, and nothing decided
before that stage became ready is changed — for every arm, its prediction sources rebuilt from the changed workload.

Each case replays real held-out workflows, picks one replayed workflow and a cut stage, and changes every copy the
replay makes of that workflow from the cut on: either every label of the cut stage and of each later stage (its true
output length, three times longer within its cap or a third at the cap; `is_tool_call` flipped; its tool time longer),
in the simulator's stages and in the trace rows a predictor reads alike; or the stages after the cut dropped. Both runs
build every source the arm reads (`Replay.run(..., fresh=True)`: model, prior, none, oracle) from the workload they
replay, so a source that read a changed truth — at readiness or while it is prewarmed — would answer differently. T
is the moment the cut stage first became ready (over the copies, in either run): every decision (route to a node,
start, drop, keep or evict at a tool call, reject) of every workflow before T must be the same. On maestro-paper's one
node and on multi-model's three (models load, evict and scale out; triage weighs the tool workers too).

Two planted leaks must make the same check fail: the per-workflow SLO from every stage's true length (the simulator's
legacy `scaled` mode), and a prediction source that reads the next stage's true length while it is prewarmed (which
the sources built once from the unchanged workload, as the grid caches them, do not see), in both scenarios.
"""

from __future__ import annotations

import pytest

from benchmarks.referee import grid
from benchmarks.referee.arms import parse_arm
from benchmarks.referee.grid import Replay
from benchmarks.referee.sides import DEFAULT_TRACES, read_all, side_split
from maestro.contract import StageTrace
from pipelines.features import FeaturizerConfig
from pipelines.model import ModelConfig
from pipelines.predictor import Predictor
from pipelines.synth import generate
from serving.sim.ready import ReadyPredictions, all_ancestors, base_id
from serving.sim.slo import SLOConfig, apply_slo
from serving.sim.workload import SimStage, SimWorkflow

NODES, RATE, WORKFLOWS = 1, 1.0, 200  # past the knee on one node: queues form, so the order decides who starts
CUTS = 3  # cut workflows tried per arm and change
MULTI_NODES, MULTI_RATE = 3, 3.0  # multi-model on three nodes, past its knee: models load, scale out and queue
MULTI_ARMS = ["edf", "vllm-edf", "maestro[model]", "maestro[none]"]
# maestro[oracle] is told its workflows' remaining work (the truth of later stages, by definition of that arm): it is
# checked without that part; its own stage's true length is read at readiness. `vllm` and `vllm-edf` where the referee
# has them. Maestro's triage turns workflows away here (asserted): the check covers its rejections too.
ARMS = [
    "fcfs",
    "edf",
    "srtf",
    "edf+admission",
    "maestro[model]",
    "maestro[prior]",
    "maestro[none]",
    "maestro[oracle/no-remaining]",
    "maestro[none/slack]",
    "vllm",
    "vllm-edf",
]


def known(name: str) -> bool:
    try:
        parse_arm(name)
    except ValueError:
        return False
    return True


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A small predictor without embeddings (trains in seconds)."""
    stages = [StageTrace.model_validate(r) for r in generate(300, seed=11)]
    fast = ModelConfig(folds=3, classifier=dict(n_estimators=30), regressor=dict(n_estimators=40))
    return Predictor.train(stages, FeaturizerConfig(use_embedding=False), fast).save(
        tmp_path_factory.mktemp("model") / "predictor"
    )


@pytest.fixture(scope="module")
def sides():
    if not DEFAULT_TRACES[0].exists():
        pytest.skip(f"{DEFAULT_TRACES[0]} is missing (../shared/data)")
    return side_split(read_all(DEFAULT_TRACES), "dev")


@pytest.fixture(scope="module")
def replay(sides, model_dir) -> Replay:
    return Replay(sides.train, sides.test, model_dir, nodes=NODES, workflows=WORKFLOWS)


def is_chain(workflow: SimWorkflow) -> bool:
    return all(s.parents == [s.index - 1] for s in workflow.stages[1:])


def candidates(workflows: list[SimWorkflow], limit: int = CUTS) -> list[tuple[str, int]]:
    """(replayed workflow id, cut) from a finished run: chains of at least 4 stages cut at a middle stage that became
    ready, the stage before it having waited in a queue (so that what is known of it can move a decision); `limit` of
    them, spread over the cut stages' readiness times."""
    found: dict[str, tuple[float, int]] = {}
    for workflow in workflows:
        cut = len(workflow.stages) // 2
        if len(workflow.stages) < 4 or not is_chain(workflow):
            continue
        stage, before = workflow.stages[cut], workflow.stages[cut - 1]
        if stage.ready_s >= 0 and before.first_start_s > before.ready_s >= 0:
            found[base_id(workflow)] = min(found.get(base_id(workflow), (stage.ready_s, cut)), (stage.ready_s, cut))
    ordered = sorted(found.items(), key=lambda item: item[1])
    picks = sorted({round(i * (len(ordered) - 1) / max(1, limit - 1)) for i in range(limit)}) if ordered else []
    return [(ordered[i][0], ordered[i][1][1]) for i in picks]


def relabel(stage: SimStage) -> None:
    """Change every label of the stage: its true length, whether it ends in a tool call, its tool time."""
    longer = min(stage.max_tokens, stage.output_tokens * 3)
    stage.output_tokens = longer if longer != stage.output_tokens else max(1, stage.output_tokens // 3)
    stage.is_tool_call = not stage.is_tool_call
    stage.tool_exec_s = 2 * stage.tool_exec_s + 1.0
    labels = {"output_tokens": stage.output_tokens, "is_tool_call": stage.is_tool_call, "output_text": "changed"}
    stage.source = {**(stage.source or {}), **labels}  # the trace row a predictor reads, labels included


def relabel_from(workflow: SimWorkflow, cut: int) -> None:
    for stage in workflow.stages[cut:]:
        relabel(stage)


def truncate(workflow: SimWorkflow, cut: int) -> None:
    """Drop the stages after `cut` (a chain: each stage's one parent is the one before)."""
    del workflow.stages[cut + 1 :]
    workflow.stages[cut].children = []
    workflow.num_stages_left = len(workflow.stages)


def run(
    replay: Replay, arm_name: str, change=None, target=None, legacy_slo: bool = False, fresh: bool = True, rate=RATE
):
    """One run of the arm at `rate`, `change` applied to every copy of the target's workflow from its cut on: its
    decisions and its workflows."""
    workflows = replay.workload(rate, 0)
    if change is not None:
        base, cut = target
        for workflow in workflows:
            if base_id(workflow) == base:
                change(workflow, cut)
    if legacy_slo:  # the deadline from every stage's true length, the future included
        apply_slo(workflows, replay.cost, SLOConfig(mode="scaled"))
    outcome = replay.run(parse_arm(arm_name), workflows, 0, log_decisions=True, fresh=fresh)
    return outcome.extra["decisions"], workflows


def readiness(workflows: list[SimWorkflow], target: tuple[str, int]) -> float:
    """When the target's cut stage first became ready over its workflow's copies (inf: never)."""
    base, cut = target
    ready = [w.stages[cut].ready_s for w in workflows if base_id(w) == base and w.stages[cut].ready_s >= 0]
    return min(ready, default=float("inf"))


def check_no_leak(replay: Replay, arm: str, change, target, original, **options) -> list:
    """Assert that `original` (the unchanged run's decisions and workflows) and the run with `change` made the same
    decisions before the cut stage became ready; returns those decisions."""
    after, changed = run(replay, arm, change, target, **options)
    moment = min(readiness(original[1], target), readiness(changed, target))
    before, after = [d for d in original[0] if d[0] < moment], [d for d in after if d[0] < moment]
    assert before, f"{arm}: the cut {target} must come after some decisions, or the check checks nothing"
    differ = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    assert before == after, (
        f"{arm}, {change.__name__} of {target[0]} at stage {target[1]}: decision {differ} of the {len(before)} made "
        f"before the cut stage became ready (t={moment:.1f} s) differs: "
        f"{before[differ] if differ < len(before) else None} became {after[differ] if differ < len(after) else None}"
    )
    return before


@pytest.mark.parametrize("arm", [a for a in ARMS if known(a)])
def test_no_decision_reads_the_future(replay, arm):
    original = run(replay, arm)
    targets = candidates(original[1])
    assert len(targets) == CUTS, f"{arm}: too few workflows to cut"
    for target in targets:
        for change in (relabel_from, truncate):
            check_no_leak(replay, arm, change, target, original)
    if arm == "maestro[none]":
        assert any(d[1] == "reject" for d in original[0])


@pytest.fixture(scope="module")
def multi_replay(sides, model_dir) -> Replay:
    return Replay(
        sides.train, sides.test, model_dir, nodes=MULTI_NODES, workflows=WORKFLOWS, scenario_name="multi-model"
    )


def nodes_per_model(decisions: list[tuple], workflows: list[SimWorkflow]) -> dict[str, set[int]]:
    """The nodes each model's stages started on."""
    model = {(w.workflow_id, s.stage_id): s.model for w in workflows for s in w.stages}
    out: dict[str, set[int]] = {}
    for _, kind, workflow_id, stage_id, node in decisions:
        if kind == "start":
            out.setdefault(model[workflow_id, stage_id], set()).add(node)
    return out


@pytest.mark.parametrize("arm", MULTI_ARMS)
def test_no_decision_reads_the_future_across_nodes_and_models(multi_replay, arm):
    """More models than a node holds, on several nodes: which node a stage is routed to (Maestro's S(N,T), its
    scale-out to a node that must load the model), which model a node loads and evicts, and triage over the
    GPUs' and the tool workers' pools are decisions made before the cut too. The run must exercise them: models
    that load on more than one node, and for Maestro workflows turned away."""
    original = run(multi_replay, arm, rate=MULTI_RATE)
    targets = candidates(original[1])
    assert len(targets) == CUTS, f"{arm}: too few workflows to cut"
    for target in targets:
        for change in (relabel_from, truncate):
            check_no_leak(multi_replay, arm, change, target, original, rate=MULTI_RATE)
    spread = nodes_per_model(*original)
    assert len(spread) > MULTI_NODES and any(len(nodes) > 1 for nodes in spread.values()), spread
    if arm.startswith("maestro["):
        assert any(d[1] == "reject" for d in original[0])


def test_the_check_catches_deadlines_from_true_lengths(replay):
    """With the legacy per-workflow SLO, changing a workflow's later stages moves its deadline from its arrival on:
    EDF's earlier decisions change for at least one of the workflows tried."""
    original = run(replay, "edf", legacy_slo=True)
    messages = []
    for target in candidates(original[1]):
        try:
            check_no_leak(replay, "edf", relabel_from, target, original, legacy_slo=True)
        except AssertionError as error:
            messages.append(str(error).splitlines()[0])
    assert messages, "deadlines from every stage's true length passed the check"
    print("\n".join(messages))


class ReadsTheNextLength(ReadyPredictions):
    """A planted leak: while prewarmed, each stage's prediction becomes its next stage's true length."""

    def prewarm(self, stages: list[SimStage], batch_size: int = 2048) -> None:
        super().prewarm(stages, batch_size)
        for stage in stages:
            if stage.children:
                key = (base_id(stage.workflow), stage.stage_id, all_ancestors(stage))
                tokens = stage.workflow.stages[stage.children[0]].output_tokens
                self.cache[key] = (tokens, tokens, *self.cache[key][2:])


@pytest.mark.parametrize(
    "arm, scenario",
    [
        ("maestro[model/no-reject]", "maestro-paper"),
        ("maestro[none]", "maestro-paper"),
        ("maestro[model]", "multi-model"),
    ],
)
def test_the_check_catches_a_source_that_reads_the_next_length(sides, model_dir, monkeypatch, arm, scenario):
    """Sources rebuilt from the changed workload catch the planted source; built once from the unchanged workload (as
    the grid caches them) they do not. The model's arm without rejections on maestro-paper's one node: with them its
    triage turns about four in five workflows away there, leaving too few chains (4) to cut for the check to be sure
    to meet the leak. Eight cuts, not `CUTS`: where the batch-cost gate holds a congested node until a running stage
    ends, fewer decisions read a prediction."""
    nodes, rate = (MULTI_NODES, MULTI_RATE) if scenario == "multi-model" else (NODES, RATE)
    monkeypatch.setattr(grid, "ReadyPredictions", ReadsTheNextLength)
    leaky = Replay(sides.train, sides.test, model_dir, nodes=nodes, workflows=WORKFLOWS, scenario_name=scenario)
    original, messages = run(leaky, arm, rate=rate), []
    for target in candidates(original[1], limit=8):
        try:
            check_no_leak(leaky, arm, relabel_from, target, original, rate=rate)
        except AssertionError as error:
            messages.append(str(error).splitlines()[0])
        check_no_leak(leaky, arm, relabel_from, target, run(leaky, arm, fresh=False, rate=rate), fresh=False, rate=rate)
    assert messages, f"{arm}: a source reading the next stage's true length passed the check"
    print("\n".join(messages))


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
    relabel_from(chain, 1)
    second = ReadyPredictions("model", model_dir)
    second.prewarm(chain.stages)
    changed = {s.stage_id for s in chain.stages[1:]}
    unchanged = [key for key in first.cache if not key[2] & changed]  # no changed stage among its ancestors
    assert unchanged and all(first.cache[key] == second.cache[key] for key in unchanged)
    assert first.cache != second.cache, "the later stages' outcomes must reach their descendants' predictions"
