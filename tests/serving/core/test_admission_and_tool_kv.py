"""Admission (the AIMD window with hysteresis) and the keep/evict decisions during tool calls."""

import math

import pytest

from serving.core.admission import AIMDConfig, AIMDWindow, CapKind, SessionWindow
from serving.core.systems import get_system
from serving.core.tool_kv import ToolCallContext, ToolKVConfig, ToolKVPolicy, create_tool_kv


def test_aimd_grows_additively_and_shrinks_multiplicatively():
    w = AIMDWindow(AIMDConfig(start_window=20), num_tool_workers=8)
    assert w.update(kv_usage=0.5, num_tool_jobs=0) == 21
    assert w.size == 21 and w.update(kv_usage=0.95, num_tool_jobs=0) == 14  # int(21 × 0.7)
    for _ in range(10):
        w.update(0.95, 0)
    assert w.size == 4  # never below min


def test_aimd_hysteresis_on_kv():
    w = AIMDWindow(AIMDConfig(), num_tool_workers=8)
    w.update(0.91, 0)
    assert w.is_kv_overloaded
    w.update(0.87, 0)
    assert w.is_kv_overloaded  # between low and high: stays overloaded
    w.update(0.84, 0)
    assert not w.is_kv_overloaded


def test_aimd_cpu_pressure_caps_window():
    w = AIMDWindow(AIMDConfig(), num_tool_workers=4)
    w.update(0.1, num_tool_jobs=9)  # 2.25 jobs per worker
    assert w.is_cpu_overloaded and w.limit(0.1) <= math.ceil(4 * 1.5)


def test_aimd_config_validates():
    with pytest.raises(ValueError):
        AIMDConfig(min_window=10, start_window=5)
    with pytest.raises(ValueError):
        AIMDConfig(decrease_factor=1.5)


def test_maestros_window_never_holds_a_turn_and_mars_holds_every_session():
    def full(kind):  # a window of 4 slots, all held by batch sessions
        window = SessionWindow.of(kind, AIMDWindow(AIMDConfig(start_window=4, min_window=4), 8), lambda: 0.1)
        for i in range(4):
            window.started(f"batch{i}")
        return window

    mars, maestro = full(CapKind.AIMD), full(CapKind.AIMD_BATCH)
    assert not mars.admits("turn", interactive=True, now=0.0)  # MARS has no interactive class
    assert maestro.admits("turn", interactive=True, now=0.0)
    assert not maestro.admits("batch4", interactive=False, now=0.0) and maestro.admits("batch0", False, 0.0)
    maestro.started("turn")  # the window is the batch sessions': the turn's session takes no slot
    maestro.end("batch0")
    assert maestro.admits("batch4", interactive=False, now=0.0)
    maestro.started("batch4")
    assert not maestro.admits("batch5", interactive=False, now=0.0) and maestro.admits("turn2", True, 0.0)
    assert SessionWindow.of(CapKind.NONE, AIMDWindow(AIMDConfig(), 8), lambda: 0.0) is None
    # Maestro's window is an option (`cap: aimd-batch`), off: serving/EXPERIMENTS.md, 2026-12-06 (noon)
    assert get_system("maestro").cap is CapKind.NONE and get_system("mars").cap is CapKind.AIMD


def call(reprefill_s, tool_s, tool="bash", context=1000, other=0, wait=0.0):
    return ToolCallContext(tool, context, reprefill_s, tool_s, other, wait)


def test_mars_keeps_iff_reprefill_exceeds_tool_time():
    policy = create_tool_kv("mars")
    assert policy.ttl_s(call(reprefill_s=3.0, tool_s=1.0)) == math.inf
    assert policy.ttl_s(call(reprefill_s=1.0, tool_s=3.0)) == 0.0
    assert policy.ttl_s(call(reprefill_s=1.0, tool_s=1.0)) == 0.0  # strictly greater to keep


def test_maestros_rule_prices_the_reprefill_at_the_batch_it_would_stall():
    mars, maestro = create_tool_kv("mars"), create_tool_kv("mars-batch")
    evicted_by_mars = ToolCallContext("bash", 1000, 1.0, 3.0, others_stall_s=2.5)
    assert mars.ttl_s(evicted_by_mars) == 0.0  # the session's own re-prefill (1 s) is shorter than the tool (3 s)
    assert maestro.ttl_s(evicted_by_mars) == math.inf  # with the 2.5 s it adds to the running stages, longer: kept
    assert maestro.ttl_s(ToolCallContext("bash", 1000, 1.0, 3.0, others_stall_s=2.0)) == 0.0  # strictly greater
    assert maestro.ttl_s(call(reprefill_s=3.0, tool_s=1.0)) == math.inf  # nothing running beside it: MARS's rule
    assert get_system("maestro").tool_kv is ToolKVPolicy.MARS_BATCH
    assert get_system("mars").tool_kv is ToolKVPolicy.MARS  # the baseline keeps the paper's rule


def test_keep_and_evict_always():
    assert create_tool_kv("keep-always").ttl_s(call(0.0, 100.0)) == math.inf
    assert create_tool_kv("evict-always").ttl_s(call(100.0, 0.0)) == 0.0


def test_continuum_fixed_ttl_unless_tool_average_is_longer():
    policy = create_tool_kv("continuum")
    assert policy.ttl_s(call(5.0, 1.0, tool="pytest")) == 2.0
    for _ in range(5):
        policy.observe("pytest", 5.0)
    assert policy.ttl_s(call(5.0, 1.0, tool="pytest")) == 0.0
    assert policy.ttl_s(call(5.0, 1.0, tool="grep")) == 2.0


def test_continuum_dy_cold_start_and_cdf():
    policy = create_tool_kv(ToolKVConfig(policy="continuum-dy", cold_start_samples=10))
    assert policy.ttl_s(call(reprefill_s=0.5, tool_s=0)) == 0.0  # B = 0.5 s ≤ 1 s
    assert policy.ttl_s(call(reprefill_s=math.e**2, tool_s=0)) == pytest.approx(2.0)  # ln(B)
    for d in [0.1] * 90 + [30.0] * 10:
        policy.observe("bash", d)
    assert policy.ttl_s(call(reprefill_s=5.0, tool_s=0)) == pytest.approx(0.1)  # covers 90% cheaply, not the tail


def test_infercept_formula():
    policy = create_tool_kv("infercept")
    assert policy.ttl_s(call(reprefill_s=2.0, tool_s=0, context=1000, other=3000)) == pytest.approx(2.0 * 4000 / 2000)


def test_unknown_tool_kv_policy():
    with pytest.raises(ValueError, match="known"):
        create_tool_kv("sometimes")
