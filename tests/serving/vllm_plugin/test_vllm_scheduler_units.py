"""The vLLM-free parts of Maestro's vLLM scheduler: the hints messages, KV arithmetic, config, decisions lines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from serving.core.admission.batch_cost import Candidate
from serving.core.scheduler import Policy, SchedulerConfig, create_scheduler
from serving.core.systems import DEFAULT_SYSTEM, get_system
from serving.gateway.config import SessionsConfig
from serving.gateway.workflows import DECODE_S_PER_TOKEN
from serving.vllm_plugin.decisions import Decisions, parse_decision_lines
from serving.vllm_plugin.engine_pace import EnginePace, gate_candidate
from serving.vllm_plugin.hints import (
    MaestroHints,
    footprint_tokens,
    hints_for_stage,
    hints_from_extra_args,
    output_bounds,
    remaining_tokens,
    request_from_hints,
)
from serving.vllm_plugin.scheduler_config import MaestroSchedulerConfig
from serving.vllm_plugin.session_kv import SessionHint, session_hint_from_extra_args
from serving.vllm_plugin.triage import POOL, EngineTriage
from serving.vllm_plugin.victims import RunningView, order_ranks, remaining_ranks
from serving.vllm_plugin.wait_bound import HoldBound


def test_hints_round_trip_through_vllm_xargs_as_json_text():
    hints = MaestroHints(
        tokens_pred=40, tokens_reserve=64, pred_service_s=0.8, deadline_s=12.5, interactive=True, workflow="wf-1"
    )
    xargs = hints.to_xargs()
    assert all(isinstance(v, str) for v in xargs.values())  # vLLM types vllm_xargs values as str | int | float | list
    assert hints_from_extra_args(xargs) == hints
    assert (
        hints_from_extra_args(
            {
                "maestro": {
                    "tokens_pred": 40,
                    "tokens_reserve": 64,
                    "pred_service_s": 0.8,
                    "deadline_s": 12.5,
                    "interactive": True,
                    "workflow": "wf-1",
                }
            }
        )
        == hints
    )


def test_no_deadline_is_left_out_of_the_message_and_reserve_defaults_to_the_prediction():
    hints = MaestroHints(tokens_pred=30, tokens_reserve=0)
    assert "deadline_s" not in hints.to_xargs()["maestro"] and hints.tokens_reserve == 30
    assert hints_from_extra_args(hints.to_xargs()).deadline_s == math.inf
    assert hints_from_extra_args({"maestro": '{"tokens_pred": 30}'}) == hints  # the wire may leave the reserve out


@pytest.mark.parametrize("extra_args", [None, {}, {"other": 1}])
def test_a_request_without_hints_has_none(extra_args):
    assert hints_from_extra_args(extra_args) is None


@pytest.mark.parametrize("raw", ['{"tokens_pred": -1}', '{"tokens": 3}', "not json", '{"tokens_pred": 5, "x": 1}'])
def test_malformed_hints_are_a_value_error_that_names_the_field(raw):
    with pytest.raises(ValueError, match="extra_args\\['maestro'\\]"):
        hints_from_extra_args({"maestro": raw})


def test_stage_request_puts_the_relative_deadline_on_the_engine_clock():
    stage = request_from_hints(
        "r1", 1000.0, 12, 256, MaestroHints(tokens_pred=50, tokens_reserve=50, deadline_s=30.0, workflow="w"), 0.02
    )
    assert (stage.workflow_id, stage.stage_id, stage.ready_s, stage.deadline_s) == ("w", "r1", 1000.0, 1030.0)
    assert stage.pred_service_s == pytest.approx(1.0) and stage.prompt_tokens == 12
    capped = request_from_hints("r2", 0.0, 1, 10, MaestroHints(tokens_pred=50, tokens_reserve=50), 0.02)
    assert capped.pred_service_s == pytest.approx(0.2) and capped.workflow_id == "r2"


def test_a_stage_travels_to_the_engine_and_back_with_its_deadline_relative():
    stage = request_from_hints(
        "r1",
        100.0,
        12,
        256,
        MaestroHints(
            tokens_pred=50,
            tokens_reserve=80,
            pred_service_s=1.5,
            workflow_remaining_s=4.0,
            deadline_s=30.0,
            interactive=True,
            workflow="w",
        ),
        0.02,
    )
    hints = hints_for_stage(stage, now_s=110.0)
    assert hints == MaestroHints(
        tokens_pred=50,
        tokens_reserve=80,
        pred_service_s=1.5,
        workflow_remaining_s=4.0,
        deadline_s=20.0,
        interactive=True,
        workflow="w",
    )
    no_deadline = request_from_hints("r2", 0.0, 1, 9, MaestroHints(tokens_pred=5, tokens_reserve=5), 0.02)
    assert hints_for_stage(no_deadline, 3.0).deadline_s == math.inf


def test_the_default_paces_are_the_gateways():
    config = MaestroSchedulerConfig()
    assert config.decode_s_per_token == DECODE_S_PER_TOKEN
    assert config.prefill_s_per_token == SessionsConfig().prefill_s_per_token


def test_a_session_hint_round_trips_through_vllm_xargs_as_flat_values():
    hint = SessionHint("wf-3", tool_s=2.5)
    xargs = hint.to_xargs()
    assert all(isinstance(v, (str, float)) for v in xargs.values())  # vLLM's vllm_xargs value types
    assert session_hint_from_extra_args(xargs | {"maestro": "{}"}) == hint
    assert session_hint_from_extra_args({"maestro_session": "wf-3"}) == SessionHint("wf-3", 0.0)
    assert session_hint_from_extra_args({"maestro_tool_s": 2.0}) is None  # no session: nothing to continue


@pytest.mark.parametrize(
    "extra_args, key",
    [
        ({"maestro_session": ""}, "maestro_session"),
        ({"maestro_session": 7}, "maestro_session"),
        ({"maestro_session": "s", "maestro_tool_s": -1}, "maestro_tool_s"),
        ({"maestro_session": "s", "maestro_tool_s": "2"}, "maestro_tool_s"),
    ],
)
def test_a_malformed_session_hint_names_its_key(extra_args, key):
    with pytest.raises(ValueError, match=key):
        session_hint_from_extra_args(extra_args)


def test_the_tool_hold_settings_are_checked():
    with pytest.raises(ValueError, match="tool_hold_factor"):
        MaestroSchedulerConfig(tool_hold_factor=0)


def test_config_comes_from_vllms_additional_config():
    config = MaestroSchedulerConfig.from_additional_config(
        {"maestro_scheduler": {"scheduler": {"policy": "edf"}, "clock": "step"}, "other_plugin": {}}
    )
    assert config.scheduler.policy == "edf" and config.clock == "step" and config.log_period_s == 5.0
    table_policy = get_system(DEFAULT_SYSTEM).scheduler.value
    assert MaestroSchedulerConfig.from_additional_config(object()).scheduler.policy == table_policy == "triage"


@pytest.mark.parametrize(
    "raw, match",
    [({"clock": "sundial"}, "clock"), ({"scheduler": {"policy": "x"}}, "policy"), ({"log_period": 1}, "unknown keys")],
)
def test_config_errors_name_what_is_wrong(raw, match):
    with pytest.raises(ValueError, match=match):
        MaestroSchedulerConfig.from_additional_config({"maestro_scheduler": raw})


def test_stage_requests_order_by_the_policy_object():
    policy = create_scheduler("least-slack")
    urgent = request_from_hints(
        "urgent", 5.0, 1, 100, MaestroHints(tokens_pred=10, tokens_reserve=10, deadline_s=2.0), 0.02
    )
    relaxed = request_from_hints(
        "relaxed", 0.0, 1, 100, MaestroHints(tokens_pred=10, tokens_reserve=10, deadline_s=60.0), 0.02
    )
    for stage in (relaxed, urgent):
        policy.add(stage, 5.0)
    assert [s.stage_id for s in policy.in_order(5.0)] == ["urgent", "relaxed"]


def test_footprint_is_prompt_and_reserve_capped_by_max_tokens():
    hints = MaestroHints(tokens_pred=100, tokens_reserve=150)
    assert footprint_tokens(10, 0, 1000, hints) == 160
    assert footprint_tokens(10, 0, 120, hints) == 130
    assert remaining_tokens(30, hints) == 70


def test_a_request_that_outlives_its_prediction_is_re_predicted_from_the_tail():
    hints = MaestroHints(tokens_pred=100, tokens_reserve=150, reserve_level=0.9)
    assert output_bounds(99, hints) == (100, 150)  # short of the median: the prediction stands
    median, reserve = output_bounds(400, hints)
    assert 400 < median < reserve  # past its reserve: the tail's median and bound, not "nothing left"
    assert remaining_tokens(400, hints) == math.ceil(median) - 400 > 0
    assert footprint_tokens(10, 400, 1000, hints) == 10 + math.ceil(reserve)
    assert footprint_tokens(10, 400, 420, hints) == 430  # never past max_tokens
    # The longer it has run, the more it is predicted to still need (a log-normal's tail grows).
    assert remaining_tokens(800, hints) > remaining_tokens(400, hints)
    # A point prediction (reserve = median) moves only to what was produced.
    assert output_bounds(50, MaestroHints(tokens_pred=40, tokens_reserve=40)) == (51, 51)


def test_the_tail_bound_holds_the_reserve_level_for_log_normal_lengths():
    """Among log-normal lengths that outlived n, the re-predicted reserve covers about reserve_level of them."""
    rng = np.random.default_rng(0)
    hints = MaestroHints(tokens_pred=100, tokens_reserve=round(100 * math.exp(0.8 * 1.2816)), reserve_level=0.9)
    lengths = 100 * np.exp(rng.normal(0.0, 0.8, 200_000))
    for produced in (150, 300):
        tail = lengths[lengths > produced]
        assert abs(np.mean(tail <= output_bounds(produced, hints)[1]) - 0.9) < 0.01


def test_decisions_lines_parse_back_from_a_log():
    decisions = Decisions()
    decisions.hold_back("a")
    decisions.hold_back("a")
    decisions.forget("a")
    decisions.hold_back("a")
    decisions.num_preempted = 1
    log = f"(EngineCore pid=1) INFO 12-02 [scheduler.py:9] {decisions.log_line(7)}\nother line\n"
    [line] = parse_decision_lines(log)
    assert line["step"] == 7 and line["num_held_back"] == 3 and line["num_requests_held_back"] == 2 and not line["idle"]
    assert line["num_preempted"] == 1 and "_held_ids" not in line


def test_a_request_held_back_past_the_bound_blocks_the_others_until_it_starts():
    bound = HoldBound(max_hold_s=10.0)
    assert not bound.hold("big", 0.0) and not bound.is_blocked("small")
    assert not bound.hold("big", 9.0)
    assert bound.hold("big", 10.0)  # overdue: from now on the others wait for it
    assert bound.is_blocked("small") and not bound.is_blocked("big")
    assert not bound.hold("other", 0.0) and not bound.hold("other", 50.0)  # one overdue request at a time
    bound.forget("big")
    assert not bound.is_blocked("small") and bound.hold("other", 51.0)
    assert not HoldBound(max_hold_s=None).hold("big", 1e9)


def test_the_hold_bound_is_positive_or_none():
    assert MaestroSchedulerConfig.from_additional_config({"maestro_scheduler": {"max_hold_s": None}}).max_hold_s is None
    with pytest.raises(ValueError, match="max_hold_s"):
        MaestroSchedulerConfig(max_hold_s=0)


def test_the_plugin_takes_its_queue_order_from_the_system_table():
    assert MaestroSchedulerConfig().scheduler.policy == get_system("maestro").scheduler.value == Policy.TRIAGE.value
    assert MaestroSchedulerConfig(system="maestro-slack").scheduler.policy == Policy.LEAST_SLACK.value
    config = MaestroSchedulerConfig.from_additional_config({"maestro_scheduler": {"system": "edf"}})
    assert config.scheduler.policy == "edf"
    with pytest.raises(ValueError, match="system: unknown policy"):
        MaestroSchedulerConfig(system="nope")


def test_the_engine_pace_times_busy_steps_and_first_tokens():
    pace, tokens = EnginePace(), {"a": 0}
    pace.step_began(0.0, tokens.get)
    pace.started("a", 0.0, num_output_tokens=0)
    pace.step_scheduled(0.0, is_busy=True)  # a's prefill: 0.5 s
    tokens["a"] = 1
    for k in range(8):
        pace.step_began(0.5 + 0.1 * k, tokens.get)
        pace.step_scheduled(0.5 + 0.1 * k, is_busy=True)
    assert pace.first_token_delay_s == 0.5 and pace.bare_step_s == pytest.approx(0.1)
    assert pace.pace_s_per_token == pytest.approx((0.5 + 7 * 0.1) / 8)
    pace.step_scheduled(1.2, is_busy=False)  # nothing ran: the idle time until the next step is no step
    pace.step_began(5.0, tokens.get)
    assert len(pace.recent_steps_s) == 8
    state = pace.node_state(
        5.0,
        [
            ("a", MaestroHints(tokens_pred=40, tokens_reserve=40, deadline_s=30.0), 0.0, 9, "unknown"),
            ("b", MaestroHints(tokens_pred=10, tokens_reserve=10), 4.0, 0, "unknown"),
        ],
    )
    assert [(s.deadline_s, s.started_s, s.produced) for s in state.running] == [(30.0, 0.0, 9), (math.inf, 5.0, 0)]
    assert (state.pace_s_per_token, state.prefill_s) == (pace.pace_s_per_token, 0.5)
    assert gate_candidate(MaestroHints(tokens_pred=20, tokens_reserve=20, deadline_s=3.0), 2.0, 4) == Candidate(
        5.0, 4, tokens_pred=20, tokens_reserve=20
    )
    turn = MaestroHints(tokens_pred=20, tokens_reserve=20, deadline_s=3.0, interactive=True)
    assert gate_candidate(turn, 2.0, 0).is_interactive  # the gate never holds it
    pace.forget("a")
    assert "a" not in pace.started_s


def test_triage_hints_travel_to_the_engine():
    stage = request_from_hints(
        "r1", 0.0, 12, 256, MaestroHints(tokens_pred=50, tokens_reserve=50, workflow="w", is_shed=True), 0.02
    )
    assert stage.is_shed and stage.deadline_s == math.inf
    hints = hints_for_stage(stage, 1.0, final=True)
    assert hints.is_shed and hints.final and hints_from_extra_args(hints.to_xargs()) == hints


def test_the_engine_triage_sheds_a_workflow_that_cannot_make_its_deadline_and_it_queues_behind():
    triage, decode_s = EngineTriage(DECODE_S_PER_TOKEN), DECODE_S_PER_TOKEN
    late = MaestroHints(
        tokens_pred=100, tokens_reserve=100, deadline_s=1.0, workflow="late"
    )  # 2 s of work, 1 s left, work waiting
    on_time = MaestroHints(tokens_pred=100, tokens_reserve=100, deadline_s=60.0, workflow="ok")
    assert triage.arrived("r1", 10.0, 5, 256, on_time, 10.0, is_backlogged=True) == on_time
    shed = triage.arrived("r2", 10.0, 5, 256, late, 10.0, is_backlogged=True)
    assert shed.is_shed and shed.deadline_s == math.inf and shed.tokens_pred == 100
    assert triage.arrived(
        "r3",
        11.0,
        5,
        256,
        MaestroHints(tokens_pred=1, tokens_reserve=1, deadline_s=99.0, workflow="late"),
        11.0,
        is_backlogged=False,
    ).is_shed  # shedding is final: the workflow's later requests too
    alone = MaestroHints(tokens_pred=100, tokens_reserve=100, deadline_s=1.0, workflow="alone")
    assert not triage.arrived("r4", 10.0, 5, 256, alone, 10.0, is_backlogged=False).is_shed  # nothing waits: kept
    policy = create_scheduler(get_system("maestro").scheduler.value)
    for rid, hints in (("r2", shed), ("r1", on_time)):
        policy.add(request_from_hints(rid, 10.0, 5, 256, hints, decode_s), 10.0)
    assert [s.stage_id for s in policy.in_order(10.0)] == ["r1", "r2"]


def test_the_engine_triage_counts_a_finished_requests_tokens_and_ends_its_workflow_at_its_final_request():
    triage = EngineTriage(0.5)
    triage.arrived(
        "r1", 0.0, 5, 256, MaestroHints(tokens_pred=10, tokens_reserve=10, deadline_s=60.0, workflow="w"), 0.0, False
    )
    triage.finished("r1", MaestroHints(tokens_pred=10, tokens_reserve=10, workflow="w"), 5, 8, 1.0, True)
    pool = triage.triage.pools[POOL]
    assert pool.window_work_s == 8 * 0.5 and "w" in pool.open  # the workflow goes on
    triage.finished("r2", MaestroHints(tokens_pred=10, tokens_reserve=10, workflow="w", final=True), 5, 2, 2.0, True)
    assert "w" not in pool.open and pool.window_work_s == 10 * 0.5
    triage.arrived("r3", 0.0, 5, 256, MaestroHints(tokens_pred=10, tokens_reserve=10, deadline_s=60.0), 0.0, False)
    assert "r3" in pool.open  # no workflow named: the request is its own, and ends with it
    triage.finished("r3", MaestroHints(tokens_pred=10, tokens_reserve=10), 5, 1, 3.0, True)
    assert "r3" not in pool.open


def running_view(rid: str, arrival_s: float, deadline_s: float, remaining: int) -> RunningView:
    hints = MaestroHints(tokens_pred=remaining + 10, tokens_reserve=0, deadline_s=deadline_s, workflow=rid)
    return RunningView(rid, arrival_s, 10, 200, hints, remaining)


def test_preemptive_victims_are_ranked_by_maestros_order_the_last_served_preempted_first():
    # At step 100: "urgent" must start by 110 to make its deadline, "relaxed" by 995, and "lost" could not make its
    # deadline at all (late: served after the on-time work). The most predicted work left is urgent's.
    running = [
        running_view("urgent", 50.0, 100.0, remaining=40),
        running_view("relaxed", 0.0, 1000.0, remaining=5),
        running_view("lost", 90.0, 5.0, remaining=10),
    ]
    policy = create_scheduler(SchedulerConfig(policy="least-slack"))
    ranks = order_ranks(policy, running, now=100.0, decode_s_per_token=1.0)
    assert sorted(ranks, key=ranks.get) == ["urgent", "relaxed", "lost"]  # lost is preempted first, urgent last
    by_work = remaining_ranks(running)
    assert max(by_work, key=by_work.get) == "urgent"  # not preemptive: the most work left goes first


def test_a_running_requests_slack_counts_the_work_it_has_left_not_its_whole_prediction():
    # Same deadline; "nearly_done" was predicted at 90 tokens and has 2 left, "fresh" has 60: fresh has less slack.
    nearly_done = RunningView(
        "nearly_done", 0.0, 10, 200, MaestroHints(tokens_pred=90, tokens_reserve=0, deadline_s=100.0), 2
    )
    running = [nearly_done, running_view("fresh", 0.0, 100.0, remaining=60)]
    ranks = order_ranks(create_scheduler("least-slack"), running, now=10.0, decode_s_per_token=1.0)
    assert ranks == {"fresh": 0, "nearly_done": 1}


def test_the_older_preemptive_switch_still_names_an_admission_and_a_disagreement_is_refused_by_name():
    assert MaestroSchedulerConfig().preemptive is None
    config = MaestroSchedulerConfig.from_additional_config({"maestro_scheduler": {"preemptive": True}})
    assert config.admission == "vllm" and MaestroSchedulerConfig(preemptive=False).admission == "hold"
    assert MaestroSchedulerConfig(preemptive=True, admission="vllm").admission == "vllm"
    with pytest.raises(ValueError, match="preemptive must be true, false or null"):
        MaestroSchedulerConfig(preemptive="yes")
    with pytest.raises(ValueError, match="preemptive must be true, false or null"):
        MaestroSchedulerConfig(preemptive=1)
    with pytest.raises(ValueError, match="admission 'adaptive' and preemptive True disagree"):
        MaestroSchedulerConfig(admission="adaptive", preemptive=True)


def test_the_victim_rule_follows_preemptive_unless_set_and_a_wrong_one_is_refused_by_name():
    assert [MaestroSchedulerConfig(preemptive=p).victim_rule for p in (False, True)] == ["remaining", "order"]
    config = MaestroSchedulerConfig.from_additional_config(
        {"maestro_scheduler": {"preemptive": True, "victim": "remaining"}}
    )
    assert config.victim_rule == "remaining" and MaestroSchedulerConfig(victim="order").victim_rule == "order"
    with pytest.raises(ValueError, match=r"victim must be one of \['remaining', 'order'\]"):
        MaestroSchedulerConfig(victim="last")
