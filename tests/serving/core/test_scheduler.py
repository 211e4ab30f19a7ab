"""Each policy's ordering, lazy removal, aging and the factory."""

import random

import pytest

from serving.core.request import StageRequest
from serving.core.scheduler import Policy, SchedulerConfig, create_scheduler


def req(name, **fields) -> StageRequest:
    return StageRequest(name, "0", **fields)


def drain(scheduler, now=0.0):
    order = []
    while (r := scheduler.pop(now)) is not None:
        order.append(r.workflow_id)
    return order


def fill(policy, requests, **config):
    scheduler = create_scheduler(SchedulerConfig(policy=policy, **config))
    for r in requests:
        scheduler.add(r, 0.0)
    return scheduler


def test_fcfs_orders_by_ready_time():
    assert drain(fill("fcfs", [req("b", ready_s=2), req("a", ready_s=1), req("c", ready_s=3)])) == ["a", "b", "c"]


def test_edf_orders_by_deadline():
    s = fill("edf", [req("late", deadline_s=50), req("soon", deadline_s=10, ready_s=5), req("mid", deadline_s=20)])
    assert drain(s) == ["soon", "mid", "late"]


def test_srtf_orders_by_attained_service_not_prediction():
    s = fill(
        "srtf",
        [req("old", attained_service_s=30, pred_service_s=0.1), req("new", attained_service_s=0, pred_service_s=100)],
    )
    assert drain(s) == ["new", "old"]


def test_predicted_srtf_shortest_predicted_first_and_interactive_before_batch():
    s = fill(
        "predicted-srtf",
        [
            req("batch-short", pred_service_s=0.1),
            req("long", interactive=True, pred_service_s=9),
            req("short", interactive=True, pred_service_s=1),
        ],
    )
    assert drain(s) == ["short", "long", "batch-short"]


def test_predicted_srtf_workflow_remaining_counts():
    s = fill(
        "predicted-srtf",
        [
            req("more-to-come", pred_service_s=1, workflow_remaining_s=20),
            req("last-stage", pred_service_s=2, workflow_remaining_s=0),
        ],
    )
    assert drain(s) == ["last-stage", "more-to-come"]


def test_predicted_srtf_aging_and_batch_starvation_guard():
    s = fill(
        "predicted-srtf",
        [req("young-short", pred_service_s=1, ready_s=100), req("old-long", pred_service_s=5, ready_s=0)],
        aging_per_s=0.1,
    )
    assert drain(s, now=100) == ["old-long", "young-short"]  # 5 + 0 < 1 + 10
    s = fill(
        "predicted-srtf",
        [req("batch", ready_s=0), req("interactive", interactive=True, ready_s=50)],
        batch_max_wait_s=60,
    )
    assert s.peek(10).workflow_id == "interactive"
    assert s.peek(61).workflow_id == "batch"


def test_mars_low_initial_kv_then_high_service_then_boost():
    s = fill(
        "mars",
        [
            req("long-prompt", prompt_tokens=50000),
            req("short-fresh", prompt_tokens=100),
            req("short-served", prompt_tokens=100, attained_service_s=40),
        ],
    )
    assert drain(s) == ["short-served", "short-fresh", "long-prompt"]
    s = fill("mars", [req("long-waiting", prompt_tokens=50000, ready_s=0), req("short", prompt_tokens=100, ready_s=95)])
    assert s.peek(100).workflow_id == "long-waiting"  # boosted 3 levels after 90 s


def test_continuum_preempted_then_pinned_then_program_arrival():
    s = fill(
        "continuum",
        [
            req("plain-early", workflow_arrival_s=0),
            req("pinned", workflow_arrival_s=5, is_kv_pinned=True),
            req("preempted", workflow_arrival_s=9, is_preempted=True),
        ],
    )
    assert drain(s) == ["preempted", "pinned", "plain-early"]


@pytest.mark.parametrize("policy", [p.value for p in Policy])  # every policy, a new one too
def test_remove_is_lazy_and_len_is_exact(policy):
    requests = [req(f"w{i}", ready_s=i, deadline_s=i, pred_service_s=i, interactive=i % 2 == 0) for i in range(6)]
    s = fill(policy, requests)
    s.remove(requests[3])
    assert len(s) == 5
    assert "w3" not in drain(s)
    s.add(requests[3], 0.0)  # a removed request may come back
    assert drain(s) == ["w3"]


@pytest.mark.parametrize("policy", [p.value for p in Policy])  # every policy, a new one too
@pytest.mark.parametrize("now", [0.0, 120.0, 200.0])  # Maestro's batch guard for none, some, all; MARS boosts
def test_peek_n_lists_what_pop_would_give_without_removing(policy, now):
    rng = random.Random(7)
    requests = [
        req(
            f"w{i}",
            ready_s=rng.uniform(0, 100),
            deadline_s=rng.uniform(0, 100),
            pred_service_s=rng.uniform(0, 10),
            attained_service_s=rng.choice([0, 1, 2]),
            interactive=rng.random() < 0.5,
            prompt_tokens=rng.choice([100, 4000, 20000, 50000]),
        )
        for i in range(40)
    ]
    s = fill(policy, requests)
    for r in requests[::5]:
        s.remove(r)
    listed = [r.workflow_id for r in s.peek_n(now, 12)]
    assert len(s) == 32 and len(listed) == 12
    assert listed == drain(s, now)[:12]


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(ValueError, match="known policies"):
        create_scheduler("lottery")


def test_predicted_srtf_attained_weight_finishes_workflows_in_progress_first():
    requests = [req("fresh-short", pred_service_s=1), req("served", pred_service_s=2, attained_service_s=4)]
    assert drain(fill("predicted-srtf", requests)) == [
        "fresh-short",
        "served",
    ]  # per-stage SRTF (the simulator's default)
    assert drain(fill("predicted-srtf", requests, attained_weight=0.5)) == ["served", "fresh-short"]  # 2 − 2 < 1
    assert SchedulerConfig("predicted-srtf", attained_weight=0.5).is_workflow_order
    assert not SchedulerConfig("predicted-srtf").is_workflow_order and SchedulerConfig("continuum").is_workflow_order


# ---- Maestro: least predicted slack -------------------------------------------------------------------------
def test_maestro_least_slack_first_not_earliest_deadline():
    # latest starts: big-stage 100 − 80 = 20, small-stage 50 − 5 = 45: less slack despite the later deadline
    s = fill(
        "least-slack",
        [req("small-stage", deadline_s=50, pred_service_s=5), req("big-stage", deadline_s=100, pred_service_s=80)],
    )
    assert drain(s, now=0) == ["big-stage", "small-stage"]
    # the workflow's predicted remaining work counts with its weight (0 by default: the stage's own work only)
    requests = [
        req("small-job", deadline_s=50, pred_service_s=5),
        req("big-job", deadline_s=100, pred_service_s=30, workflow_remaining_s=50),
    ]
    assert drain(fill("least-slack", requests)) == ["small-job", "big-job"]  # 45 < 70
    assert drain(fill("least-slack", requests, slack_workflow_weight=1.0)) == ["big-job", "small-job"]  # 20 < 45
    assert drain(fill("edf", [req("small-job", deadline_s=50), req("big-job", deadline_s=100)])) == [
        "small-job",
        "big-job",
    ]


def test_maestro_demotes_work_that_can_no_longer_make_it_and_counts_it():
    s = fill(
        "least-slack",
        [
            req("hopeless", deadline_s=10, pred_service_s=20),  # latest start −10: late at once
            req("tight", deadline_s=30, pred_service_s=20),  # latest start 10
            req("loose", deadline_s=100, pred_service_s=20),
        ],
    )  # 80
    assert s.peek(0).workflow_id == "tight" and s.num_demoted == 1
    assert [r.workflow_id for r in s.peek_n(15, 3)] == ["loose", "hopeless", "tight"]  # at 15 "tight" is late too
    assert s.num_demoted == 2
    assert drain(s, now=15) == ["loose", "hopeless", "tight"]  # late work by predicted remaining (20 + aging)


def test_maestro_late_work_does_not_starve():
    s = fill(
        "least-slack",
        [
            req("late", deadline_s=1, pred_service_s=5, ready_s=0),
            req("on-time", deadline_s=1000, pred_service_s=5, ready_s=0),
        ],
        late_max_wait_s=30,
    )
    assert s.peek(10).workflow_id == "on-time"
    assert s.peek(30).workflow_id == "late"


def test_maestro_interactive_before_batch_with_a_wait_bound():
    s = fill(
        "least-slack",
        [
            req("batch-urgent", deadline_s=10, pred_service_s=5, ready_s=0),
            req("interactive", interactive=True, deadline_s=500, ready_s=0),
        ],
        batch_max_wait_s=60,
    )
    assert s.peek(1).workflow_id == "interactive"
    assert s.peek(60).workflow_id == "batch-urgent"


def test_maestro_without_deadlines_orders_by_predicted_remaining_work_with_aging():
    s = fill(
        "least-slack",
        [
            req("long", pred_service_s=9, ready_s=0),
            req("short", pred_service_s=1, ready_s=0),
            req("short-more-to-come", pred_service_s=1, workflow_remaining_s=20, ready_s=0),
        ],
    )
    assert drain(s) == ["short", "long", "short-more-to-come"]
    s = fill(
        "least-slack",
        [req("young-short", pred_service_s=1, ready_s=100), req("old-long", pred_service_s=5)],
        aging_per_s=0.1,
    )
    assert drain(s, now=100) == ["old-long", "young-short"]  # 5 + 0 < 1 + 10
