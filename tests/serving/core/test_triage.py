"""Workflow triage: Moore–Hodgson on predicted remaining work, capacity measured only while work waits."""

import math

from serving.core.request import StageRequest
from serving.core.scheduler import Policy, SchedulerConfig, create_scheduler
from serving.core.scheduler.triage import TriageConfig, WorkflowTriage


def request(workflow: str, deadline_s: float, work_s: float, ready_s: float = 0.0, model: str = "m") -> StageRequest:
    """A ready stage of `workflow` whose workflow has `work_s` unloaded seconds left, this stage's 1 s included."""
    return StageRequest(
        workflow,
        f"{workflow}-s",
        model,
        deadline_s=deadline_s,
        ready_s=ready_s,
        pred_service_s=1.0,
        workflow_remaining_s=work_s - 1.0,
    )


def measured(capacity: float, model: str = "m") -> WorkflowTriage:
    """A triage whose pool has served `capacity` unloaded seconds a second over one backlogged window."""
    triage = WorkflowTriage(TriageConfig(window_s=10.0))
    triage.served(model, 0.0, 0.0, backlogged=True)
    triage.served(model, capacity * 10.0, 10.0, backlogged=True)
    return triage


def test_capacity_is_measured_only_over_windows_where_work_waited():
    triage = WorkflowTriage(TriageConfig(window_s=10.0))
    triage.served("m", 0.0, 0.0, backlogged=True)
    triage.served("m", 50.0, 5.0, backlogged=False)  # a moment with room: this window shows load, not capacity
    triage.served("m", 50.0, 10.0, backlogged=True)
    assert triage.pools["m"].capacity is None
    triage.served("m", 40.0, 15.0, backlogged=True)
    triage.served("m", 40.0, 20.0, backlogged=True)
    assert math.isclose(triage.pools["m"].capacity, 8.0)


def test_a_window_spans_the_wall_time_of_the_stages_it_credits():
    # a stage's work is credited when it ends: a window shorter than a stage it credits reads the completions of
    # stages that started before it, not the pool's pace, so it stays open until it is as long as the longest
    triage = WorkflowTriage(TriageConfig(window_s=10.0))
    triage.served("m", 0.0, 0.0, backlogged=True)
    triage.served("m", 1.0, 10.0, backlogged=True, wall_s=30.0)  # 10 s in, one stage that ran 30 s: still open
    assert triage.pools["m"].capacity is None
    triage.served("m", 59.0, 30.0, backlogged=True, wall_s=28.0)
    assert math.isclose(triage.pools["m"].capacity, 60.0 / 30.0)
    # the next window starts afresh: stages of 5 s close it after window_s
    triage.served("m", 20.0, 35.0, backlogged=True, wall_s=5.0)
    triage.served("m", 20.0, 40.0, backlogged=True, wall_s=5.0)
    assert math.isclose(triage.pools["m"].capacity, 0.5 * 40.0 / 10.0 + 0.5 * 2.0)


def test_a_feasible_set_keeps_everyone():
    triage = measured(capacity=2.0)
    # by deadline: 10 s of work by t=20 (capacity 40), 30 by t=30 (60), 50 by t=40 (80)
    assert not any(
        triage.assess(request(w, d, work), now=10.0)
        for w, d, work in [("a", 20.0, 10.0), ("b", 30.0, 20.0), ("c", 40.0, 20.0)]
    )
    assert triage.shed == set()


def test_when_the_set_cannot_all_make_it_the_longest_goes_not_the_latest():
    triage = measured(capacity=1.0)
    triage.assess(request("short-1", 30.0, 5.0), now=10.0)
    triage.assess(request("long", 35.0, 18.0), now=10.0)
    # 5 + 18 + 6 = 29 s of work by t=40 with 30 s of capacity: fits; one more short one does not
    assert not triage.assess(request("short-2", 40.0, 6.0), now=10.0)
    assert not triage.assess(request("short-3", 41.0, 4.0), now=10.0)
    assert triage.shed == {"long"}  # Moore–Hodgson: drop the longest so far, keep the most workflows on time
    assert triage.num_shed == 1  # counted when shed, while another workflow's stage was assessed
    assert triage.assess(request("long", 35.0, 17.0), now=11.0)  # final: its next stage is shed too
    assert triage.num_shed == 1


def test_no_shedding_without_a_measured_capacity_or_while_nothing_waits():
    unmeasured = WorkflowTriage()
    assert not any(unmeasured.assess(request(f"w{i}", 20.0, 15.0), now=10.0) for i in range(5))
    triage = measured(capacity=1.0)
    assert not any(triage.assess(request(f"w{i}", 20.0, 15.0), now=10.0, backlogged=False) for i in range(5))
    # a ready stage that cannot end by its deadline sheds its workflow only while work waits for the pool
    assert not triage.assess(request("tight", 10.5, 1.0), now=10.0, backlogged=False)
    assert triage.assess(request("tight", 10.5, 1.0), now=10.0)


def test_a_workflow_past_its_deadline_is_turned_away_where_the_alternative_is_abandonment():
    # SLO 10 s (arrived at 0, deadline 10); callers give it up at 3 × 10 = 30 s
    patient = WorkflowTriage(TriageConfig(patience_slo_x=3.0))
    assert patient.assess(request("hopeless", 10.0, 25.0), now=11.0, backlogged=False)  # 11 + 25 > 30
    assert not patient.assess(request("late", 10.0, 5.0), now=11.0, backlogged=False)  # ends late, before 30
    assert not patient.assess(request("on-time", 20.0, 25.0), now=11.0, backlogged=False)  # its deadline is ahead
    # callers' patience unknown: a late workflow goes only while the pool is saturated (it takes from on-time work)
    unknown = WorkflowTriage()
    assert not unknown.assess(request("hopeless", 10.0, 25.0), now=11.0, backlogged=False)
    assert unknown.assess(request("hopeless", 10.0, 25.0), now=11.0, backlogged=True)


def test_a_shed_stage_has_no_deadline_left_and_queues_behind_on_time_work():
    triage = measured(capacity=1.0)
    triage.apply(request("a", 30.0, 15.0), now=10.0)
    shed = request("b", 25.0, 30.0, ready_s=1.0)
    assert triage.apply(shed, now=10.0) and shed.is_shed and shed.deadline_s == math.inf
    scheduler = create_scheduler(SchedulerConfig(policy=Policy.TRIAGE, late_max_wait_s=100.0))
    on_time = [request("c", 500.0, 2.0, ready_s=9.0), request("d", 400.0, 2.0, ready_s=9.5)]
    for r in [shed, *on_time]:
        scheduler.add(r, now=10.0)
    assert [r.workflow_id for r in scheduler.in_order(10.0)] == ["d", "c", "b"]  # by deadline, the shed one last
    assert scheduler.pop(102.0).workflow_id == "b"  # ... until it has waited late_max_wait_s
    triage.end("b")
    assert "b" not in triage.shed


def test_on_time_stages_of_both_classes_go_by_deadline():
    # a batch stage with the earlier deadline goes before an on-time turn (before: every on-time turn went first)
    scheduler = create_scheduler(SchedulerConfig(policy=Policy.TRIAGE, batch_max_wait_s=100.0))
    turn, job = request("chat", 300.0, 1.0, ready_s=9.0), request("job", 200.0, 1.0, ready_s=9.5)
    turn.interactive = True
    for r in (turn, job):
        scheduler.add(r, now=10.0)
    assert [r.workflow_id for r in scheduler.in_order(10.0)] == ["job", "chat"]
    assert scheduler.pop(10.0).workflow_id == "job"


def test_a_late_interactive_stage_goes_behind_on_time_batch_work():
    # a stage that can no longer end by its deadline goes behind every on-time stage of either class, or the pool goes
    # to work that is lost already; among late stages, interactive first
    scheduler = create_scheduler(SchedulerConfig(policy=Policy.TRIAGE, late_max_wait_s=100.0, batch_max_wait_s=100.0))
    late_turn, turn = request("chat-late", 10.5, 1.0, ready_s=9.0), request("chat", 150.0, 1.0, ready_s=9.0)
    late_turn.interactive = turn.interactive = True
    batch = request("job", 200.0, 1.0, ready_s=9.0)
    for r in (late_turn, batch, turn):
        scheduler.add(r, now=10.0)
    assert [r.workflow_id for r in scheduler.in_order(10.0)] == ["chat", "job", "chat-late"]
    assert scheduler.pop(10.0).workflow_id == "chat"
    assert scheduler.pop(10.0).workflow_id == "job"  # before: the late interactive stage went first
    # the starvation bounds hold: a late head that waited late_max_wait_s goes before on-time work
    scheduler.add(request("job2", 500.0, 1.0, ready_s=110.0), now=110.0)
    assert scheduler.pop(110.0).workflow_id == "chat-late"


def burst(triage: WorkflowTriage, num_workflows: int, deadline_s: float, work_s: float) -> None:
    """`num_workflows` workflows arrive at t=0 into an empty fleet that takes every stage into its batches."""
    for i in range(num_workflows):
        triage.assess(request(f"b{i}", deadline_s, work_s), now=0.0, backlogged=False)


def test_a_burst_is_triaged_from_its_start_once_the_seed_says_capacity_is_short():
    triage = WorkflowTriage(TriageConfig(window_s=10.0, saturated_stretch=2.0, min_seed_stages=2))
    burst(triage, 10, deadline_s=12.0, work_s=15.0)
    assert triage.shed == set()  # nothing finished yet: no pace, no capacity, nobody shed
    for t in (1.0, 2.0):  # two stages finish, each 4× slower than alone: the pool is saturated
        triage.served("m", 1.0, t, backlogged=False, wall_s=4.0)
    pool = triage.pools["m"]
    assert pool.capacity is None  # no window has closed
    assert math.isclose(triage.capacity_s(pool), 8 / 4.0)  # 8 stages in flight at a quarter of their pace
    # 2 s/s × 10 s left: a 15 s workflow per deadline cannot all fit; the longest go first, well before t=10
    assert triage.assess(request("late-long", 12.0, 30.0), now=2.0, backlogged=False)
    assert len(triage.shed) >= 9


def test_no_shedding_with_room():
    # the same burst, but its stages run at their own pace: the pool is not saturated, nobody is shed
    triage = WorkflowTriage(TriageConfig(window_s=10.0, saturated_stretch=2.0, min_seed_stages=2))
    burst(triage, 10, deadline_s=12.0, work_s=15.0)
    for t in (1.0, 2.0):
        triage.served("m", 1.0, t, backlogged=False, wall_s=1.1)
    assert not triage.assess(request("big", 12.0, 30.0), now=2.0, backlogged=False)
    # saturated, but the deadlines leave room for all the work in flight
    roomy = WorkflowTriage(TriageConfig(window_s=10.0, saturated_stretch=2.0, min_seed_stages=2))
    burst(roomy, 10, deadline_s=500.0, work_s=15.0)
    for t in (1.0, 2.0):
        roomy.served("m", 1.0, t, backlogged=False, wall_s=4.0)
    assert not roomy.assess(request("big", 500.0, 30.0), now=2.0, backlogged=False)
    assert roomy.shed == set()


def test_without_a_saturating_stretch_only_waiting_work_saturates_and_nothing_is_seeded():
    triage = WorkflowTriage(TriageConfig(window_s=10.0, min_seed_stages=2))
    burst(triage, 10, deadline_s=12.0, work_s=15.0)
    for t in (1.0, 2.0):
        triage.served("m", 1.0, t, backlogged=False, wall_s=4.0)
    assert triage.capacity_s(triage.pools["m"]) is None
    assert not triage.assess(request("late-long", 12.0, 30.0), now=2.0, backlogged=False)


def test_the_seed_comes_from_the_history_the_triage_saw():
    triage = WorkflowTriage(TriageConfig(window_s=10.0, saturated_stretch=2.0, min_seed_stages=3))
    burst(triage, 6, deadline_s=100.0, work_s=5.0)
    pool = triage.pools["m"]
    triage.served("m", 2.0, 1.0, backlogged=False, wall_s=6.0)
    triage.served("m", 1.0, 1.5, backlogged=False, wall_s=4.0)
    assert triage.capacity_s(pool) is None  # two timed finishes: too few to read a pace from
    triage.served("m", 1.0, 2.0, backlogged=False)  # untimed: counts as served, not towards the pace
    assert triage.capacity_s(pool) is None
    triage.served("m", 1.0, 2.5, backlogged=False, wall_s=5.0)
    # the stages finished so far: 15 wall s for 4 unloaded s; the 2 still in flight run at that pace
    assert math.isclose(triage.capacity_s(pool), 2 / (15.0 / 4.0))
    # the first saturated window sets the capacity: its rate, or the seed where that is higher (the rate is low while
    # long stages still run)
    triage.served("m", 0.1, 11.0, backlogged=False, wall_s=1.0)
    assert math.isclose(pool.capacity, max(5.1 / 10.0, 1 / (16.0 / 4.1)))


def test_the_tool_time_ahead_of_a_workflow_moves_the_end_its_pool_work_must_meet():
    # 20 s of pool work by t=40 with capacity 1 from t=10 fits (30 s), but 15 s of its tools are still ahead of it:
    # its pool work must end by 25, and with another's 10 s before it, it cannot
    triage = measured(capacity=1.0)
    assert not triage.assess(request("short", 20.0, 10.0), now=10.0)
    toolish = request("toolish", 40.0, 20.0)
    toolish.remaining_tool_s = 15.0
    triage.assess(toolish, now=10.0)
    assert triage.shed == {"toolish"}


def test_tool_time_takes_no_pool_capacity():
    # the same two workflows with the tool time counted as work would be 10 + 35 = 45 s by t=40: it is not work
    triage = measured(capacity=1.0)
    assert not triage.assess(request("short", 20.0, 10.0), now=10.0)
    toolish = request("toolish", 60.0, 20.0)
    toolish.remaining_tool_s = 15.0  # its pool work must end by 45: 30 s of work in 35 s
    assert not triage.assess(toolish, now=10.0)
    assert triage.shed == set()


def test_a_stage_that_cannot_end_alone_before_its_deadline_with_its_tools_ahead_is_shed():
    triage = measured(capacity=100.0)
    late = request("late", 15.0, 1.0)  # its 1 s stage fits in the 5 s left, its 4.5 s of tools after it do not
    late.remaining_tool_s = 4.5
    assert triage.assess(late, now=10.0)
    ok = request("ok", 15.0, 1.0)
    ok.remaining_tool_s = 3.5
    assert not triage.assess(ok, now=10.0)
