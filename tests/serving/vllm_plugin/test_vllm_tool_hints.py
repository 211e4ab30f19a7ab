"""The tool time a workflow waits outside the engine, in Maestro's hints: the gateway's `StageRequest.remaining_tool_s`
travels to the engine (`hints_for_stage`, the wire, `request_from_hints`) and the plugin's triage reads it as the
gateway's and the simulator's do (`pool_deadline_s`, `is_late_alone`). Plain Python: no engine."""

from __future__ import annotations

import math

import pytest

from serving.core.request import StageRequest
from serving.core.scheduler.triage import is_late_alone, pool_deadline_s
from serving.gateway.workflows import DECODE_S_PER_TOKEN
from serving.vllm_plugin.hints import MaestroHints, hints_for_stage, hints_from_extra_args, request_from_hints
from serving.vllm_plugin.triage import POOL, EngineTriage


def test_the_tool_time_ahead_round_trips_from_the_gateways_stage_to_the_engines():
    sent = StageRequest("w", "s1", deadline_s=130.0, pred_service_s=1.5, remaining_tool_s=7.25)
    hints = hints_for_stage(sent, now_s=100.0)
    assert hints.remaining_tool_s == 7.25
    received = hints_from_extra_args(hints.to_xargs())
    assert received == hints
    stage = request_from_hints("r1", 50.0, 12, 256, received, DECODE_S_PER_TOKEN)
    assert stage.remaining_tool_s == 7.25 and stage.deadline_s == 80.0
    # the engine's triage reads the same pool deadline the gateway's would, each on its own clock
    assert pool_deadline_s(stage) - 50.0 == pool_deadline_s(sent) - 100.0 == 22.75
    assert hints_for_stage(stage, now_s=50.0) == hints


def test_a_sender_that_leaves_the_tool_time_out_still_parses_as_none_ahead():
    old = hints_from_extra_args({"maestro": '{"tokens_pred": 30, "deadline_s": 9.0, "workflow": "w"}'})
    assert old.remaining_tool_s == 0.0
    assert request_from_hints("r", 0.0, 1, 64, old, DECODE_S_PER_TOKEN).remaining_tool_s == 0.0


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan, "3", True, None])
def test_a_bad_tool_time_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="remaining_tool_s must be a finite number of seconds >= 0"):
        MaestroHints(tokens_pred=10, tokens_reserve=10, remaining_tool_s=bad)
    raw = {"tokens_pred": 10, "remaining_tool_s": bad}
    with pytest.raises(ValueError, match=r"extra_args\['maestro'\].*remaining_tool_s"):
        hints_from_extra_args({"maestro": raw})


def test_the_engine_triage_judges_a_stage_late_only_with_its_tool_time_ahead():
    """2 s of service, 5 s to the deadline, work waiting: on time alone; with 4 s of tool time after it, late."""
    on_time, late = EngineTriage(DECODE_S_PER_TOKEN), EngineTriage(DECODE_S_PER_TOKEN)
    hints = MaestroHints(tokens_pred=100, tokens_reserve=100, deadline_s=5.0, workflow="w")
    with_tools = MaestroHints(tokens_pred=100, tokens_reserve=100, deadline_s=5.0, workflow="w", remaining_tool_s=4.0)
    kept = on_time.arrived("r1", 10.0, 5, 256, hints, 10.0, is_backlogged=True)
    assert kept == hints and not kept.is_shed
    assert on_time.triage.pools[POOL].open["w"][0] == 15.0  # no tool time: the pool may use the whole SLO
    shed = late.arrived("r1", 10.0, 5, 256, with_tools, 10.0, is_backlogged=True)
    assert shed.is_shed and shed.deadline_s == math.inf and shed.remaining_tool_s == 4.0
    stage = request_from_hints("r1", 10.0, 5, 256, with_tools, DECODE_S_PER_TOKEN)
    assert is_late_alone(stage, 10.0)  # the rule the gateway and the simulator apply, on the same inputs


def test_the_engine_triage_orders_the_pool_by_deadline_less_tool_time():
    triage = EngineTriage(DECODE_S_PER_TOKEN)
    hints = MaestroHints(tokens_pred=10, tokens_reserve=10, deadline_s=60.0, workflow="w", remaining_tool_s=20.0)
    assert not triage.arrived("r1", 0.0, 5, 256, hints, 0.0, is_backlogged=False).is_shed
    assert triage.triage.pools[POOL].open["w"][0] == 40.0
