"""The batch-cost gate (what one more stage costs the running ones) and the workflows' remaining-work history."""

from dataclasses import replace

import pytest

from serving.core.admission.batch_cost import (
    UNMEASURED_ADDED_STEP_S,
    BatchCostConfig,
    BatchCostGate,
    Candidate,
    NodeState,
    RunningBatch,
    RunningStage,
    gate_inputs,
    remaining_tokens,
)
from serving.core.scheduler.remaining import RemainingWork

STEP_S = 0.02


def batch(remaining, deadlines, pace=STEP_S * 3, now=0.0):
    return RunningBatch.of(remaining, deadlines, pace, STEP_S, now)


def test_remaining_tokens_follow_the_prediction_then_the_reserve():
    assert remaining_tokens(100, 400, produced=30) == 70
    assert remaining_tokens(100, 400, produced=150) == 250  # past the point estimate: the calibrated bound's rest
    assert remaining_tokens(100, 400, produced=500, step_tokens=16) == 16


def test_a_running_stage_is_judged_on_its_predicted_rest_however_wide_its_reserve():
    # 100 tokens predicted, at 60 ms a token 6 s of decode; 7 s to its deadline: 1 s of slack. A 2 s stall endangers
    # it whatever its reserve: a wide reserve (400) must not rate it shorter (a bound mirrored around the point would
    # read 100² / 400 = 25 tokens, 5.5 s of slack, and let the stall in).
    gate, candidate = BatchCostGate(), Candidate(deadline_s=600.0, stall_s=2.0, tokens_pred=50, tokens_reserve=50)
    for reserve in (100, 400):
        running = (RunningStage(7.0, 0.0, produced=0, tokens_pred=100, tokens_reserve=reserve),)
        node = NodeState(0.0, running, STEP_S * 3, STEP_S)
        assert node.batch.remaining_tokens == pytest.approx([100])
        assert not gate.admits_candidate(node, candidate)


def test_a_stage_that_would_miss_by_the_admission_holds_it_back():
    gate = BatchCostGate()
    tight = batch([100], [100 * STEP_S * 3 + 0.5])  # 0.5 s of slack at the measured pace
    assert not gate.admits(tight, stall_s=1.0, added_step_s=0.0, candidate_tokens=50, candidate_slack_s=60)
    assert gate.admits(tight, stall_s=0.2, added_step_s=0.0, candidate_tokens=50, candidate_slack_s=60)
    # the per-step slowdown counts over the steps the two share: 100 × 4 ms = 0.4 s, with 0.2 s of stall: over 0.5 s
    assert not gate.admits(tight, stall_s=0.2, added_step_s=0.004, candidate_tokens=500, candidate_slack_s=60)
    assert gate.admits(tight, stall_s=0.2, added_step_s=0.004, candidate_tokens=20, candidate_slack_s=60)
    assert gate.num_refused == 2


def test_lost_stages_do_not_hold_the_batch_back_and_an_urgent_candidate_goes_in():
    gate = BatchCostGate()
    lost = batch([100], [1.0])  # cannot make it even at the bare step time (100 × 20 ms = 2 s)
    assert gate.admits(lost, stall_s=5.0, added_step_s=0.01, candidate_tokens=50, candidate_slack_s=60)
    tight = batch([100, 10], [6.5, 100.0])  # the first is endangered; the next to end does so in 10 × 60 ms
    assert not gate.admits(tight, stall_s=1.0, added_step_s=0.0, candidate_tokens=50, candidate_slack_s=5.0)
    assert gate.admits(tight, stall_s=1.0, added_step_s=0.0, candidate_tokens=50, candidate_slack_s=0.3)


def test_with_hold_while_endangered_a_candidate_is_held_only_if_it_can_wait_until_the_stages_it_endangers_end():
    # The endangered stage ends in 6 s, an unendangered one in 0.6 s: a candidate with 5 s of slack could wait for the
    # short one but not for the one it endangers, so holding it back would only trade that stage's miss for its own.
    gate = BatchCostGate(BatchCostConfig(hold_while="endangered"))
    tight = batch([100, 10], [6.5, 100.0])
    assert gate.admits(tight, stall_s=1.0, added_step_s=0.0, candidate_tokens=50, candidate_slack_s=5.0)
    assert tight.end_s(tight.is_savable & (tight.slack_s < 1.0)) == pytest.approx(6.0)
    assert tight.end_s(tight.slack_s < -100) == 0.0
    assert not gate.admits(tight, stall_s=1.0, added_step_s=0.0, candidate_tokens=50, candidate_slack_s=7.0)
    with pytest.raises(ValueError, match="hold_while"):
        BatchCostConfig(hold_while="forever")


def test_by_default_a_candidate_outwaits_the_stages_it_endangers_only_where_interactive_work_runs():
    # Two running stages at 3 steps a token: the first (100 tokens to go, 0.5 s of slack) is endangered by a 1 s
    # stall; the second ends in 10 × 60 ms. A candidate with 5 s of slack could outwait the second, not the first.
    endangered = RunningStage(6.5, 0.0, produced=1, tokens_pred=101, tokens_reserve=101)
    short = RunningStage(100.0, 0.0, produced=1, tokens_pred=11, tokens_reserve=11)
    all_batch = NodeState(0.0, (endangered, short), STEP_S * 3, STEP_S)
    with_turn = NodeState(0.0, (endangered, replace(short, is_interactive=True)), STEP_S * 3, STEP_S)
    urgent = Candidate(9.0, stall_s=1.0, added_step_s=0.0, tokens_pred=50, tokens_reserve=50)
    patient = Candidate(20.0, stall_s=1.0, added_step_s=0.0, tokens_pred=50, tokens_reserve=50)
    assert gate_inputs(with_turn, urgent).candidate_slack_s == pytest.approx(5.0)
    gate = BatchCostGate()
    assert gate.config.hold_while == "by_class"
    assert gate.admits_candidate(with_turn, urgent)  # held, it would wait behind the stage it endangers and miss
    assert not gate.admits_candidate(all_batch, urgent)  # every stall is held batch work: the pace recovers
    assert not gate.admits_candidate(with_turn, patient)  # it can outwait the stage it endangers
    assert not BatchCostGate(BatchCostConfig(hold_while="next")).admits_candidate(with_turn, urgent)
    assert BatchCostGate(BatchCostConfig(hold_while="endangered")).admits_candidate(all_batch, urgent)


def test_the_gate_acts_only_on_a_congested_node():
    gate = BatchCostGate(BatchCostConfig(min_stretch=2.0))
    calm = batch([100], [2.5], pace=STEP_S * 1.5)
    congested = batch([100], [6.5], pace=STEP_S * 3)
    assert gate.admits(calm, stall_s=5.0, added_step_s=0.0, candidate_tokens=50, candidate_slack_s=60)
    assert not gate.admits(congested, stall_s=5.0, added_step_s=0.0, candidate_tokens=50, candidate_slack_s=60)
    with pytest.raises(ValueError, match="min_stretch"):
        BatchCostConfig(min_stretch=0.5)


def test_remaining_work_is_learnt_from_ended_workflows_of_the_app():
    history = RemainingWork(min_count=2)
    for workflow, services in (("a", [1.0, 2.0, 3.0]), ("b", [1.0, 1.0])):
        for service in services:
            history.observe(workflow, "chat", service)
        history.end(workflow)
    history.observe("dropped", "chat", 100.0)
    history.end("dropped", completed=False)  # a dropped workflow teaches nothing
    assert history.estimate("chat", 0) == pytest.approx((5.0 + 1.0) / 2)
    assert history.estimate("chat", 1) == pytest.approx((3.0 + 0.0) / 2)
    assert history.estimate("chat", 2) == 0.0  # one workflow reached it: too few, and no other app either
    assert history.estimate("unseen-app", 0) == pytest.approx(3.0)  # all apps' table


def test_a_node_described_without_token_counts_or_backlog_takes_the_documented_defaults():
    # pace 3 steps a token; the first stage started 1.5 s ago (first token after 0.5 s: 1 s at 60 ms = 16.7 tokens);
    # the second 0.2 s ago, its prefill 0.3 s from done: that backlog stalls both.
    node = NodeState(
        now=10.0,
        running=(
            RunningStage(20.0, 8.5, tokens_pred=100, tokens_reserve=100),
            RunningStage(30.0, 9.8, tokens_pred=40, tokens_reserve=40),
        ),
        pace_s_per_token=STEP_S * 3,
        step_s=STEP_S,
        prefill_s=0.5,
    )
    inputs = gate_inputs(node, Candidate(deadline_s=100.0, tokens_pred=50, tokens_reserve=50))
    assert inputs.batch.remaining_tokens == pytest.approx([100 - 1.0 / 0.06, 40])
    assert inputs.batch.slack_s == pytest.approx([20 - 0.3 - 10 - (100 - 1.0 / 0.06) * 0.06, 30 - 0.3 - 10 - 40 * 0.06])
    assert (inputs.stall_s, inputs.added_step_s) == (0.5, UNMEASURED_ADDED_STEP_S)  # the node's prefill; no step cost
    assert inputs.candidate_slack_s == pytest.approx(100 - 10 - 0.5 - 50 * 0.06)
    counted = NodeState(
        10.0,
        (RunningStage(20.0, 8.5, produced=30, tokens_pred=100, tokens_reserve=100),),
        STEP_S * 3,
        STEP_S,
        0.5,
        backlog_s=1.0,
    )
    resumed = Candidate(
        100.0, produced=20, stall_s=0.1, added_step_s=0.002, tokens_pred=50, tokens_reserve=50
    )  # a preempted stage's
    assert gate_inputs(counted, resumed).candidate_tokens == 30
    assert counted.batch.remaining_tokens == pytest.approx([70]) and counted.batch.slack_s == pytest.approx(
        [20 - 1.0 - 10 - 70 * 0.06]
    )


def test_an_unmeasured_or_idle_node_lets_every_candidate_in():
    gate, candidate = BatchCostGate(), Candidate(deadline_s=1.0, tokens_pred=50, tokens_reserve=50, stall_s=100.0)
    busy = (RunningStage(5.0, 0.0, produced=10, tokens_pred=100, tokens_reserve=100),)
    assert gate_inputs(NodeState(0.0, busy, 0.0, 0.0), candidate) is None  # pace not measured yet
    assert gate.admits_candidate(NodeState(0.0, busy, 0.0, 0.0), candidate)
    assert gate.admits_candidate(NodeState(0.0, (), STEP_S * 3, STEP_S), candidate)
    assert not gate.admits_candidate(
        NodeState(0.0, busy, STEP_S * 3, STEP_S), Candidate(600.0, stall_s=100.0, tokens_pred=50, tokens_reserve=50)
    )
    assert gate.num_refused == 1


def test_the_gate_holds_batch_work_only_an_interactive_candidate_always_goes_in():
    # a congested node (pace 3× the step) whose running stage would be pushed past its deadline by a 100 s stall
    gate = BatchCostGate()
    busy = NodeState(
        0.0, (RunningStage(5.0, 0.0, produced=10, tokens_pred=100, tokens_reserve=100),), STEP_S * 3, STEP_S
    )
    held = Candidate(600.0, stall_s=100.0, tokens_pred=50, tokens_reserve=50)
    assert not gate.admits_candidate(busy, held)
    turn = Candidate(600.0, stall_s=100.0, is_interactive=True, tokens_pred=50, tokens_reserve=50)
    assert gate.admits_candidate(busy, turn)  # the same stage, a turn someone waits on: never held
    assert gate.num_refused == 1
