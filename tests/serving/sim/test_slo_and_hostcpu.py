"""SLO definitions (scaled unloaded latency vs catalog) and the host-CPU modes for tool calls."""

import pytest

from serving.sim.costmodel import CostModel, CostModelConfig
from serving.sim.hostcpu import HostCPU
from serving.sim.slo import SLOConfig, apply_slo, stage_unloaded_s, unloaded_latency_s
from serving.sim.workload import SimStage, SimWorkflow


def diamond() -> SimWorkflow:
    """a → (b, c) → d, where c is the slow branch; b is a tool call that d does not continue."""
    w = SimWorkflow("w", "app", True, 30.0)
    specs = [
        ("a", [], 100, False, 0.0),
        ("b", [0], 50, True, 2.0),
        ("c", [0], 800, False, 0.0),
        ("d", [1, 2], 200, False, 0.0),
    ]
    for i, (name, parents, out, tool, tool_s) in enumerate(specs):
        w.stages.append(
            SimStage(w, i, name, "r", "llama-3-8b", parents, out, tool, tool_exec_s=tool_s, prompt_tokens=500)
        )
    for s in w.stages:
        for p in s.parents:
            w.stages[p].children.append(s.index)
    return w


def test_unloaded_latency_is_the_longest_path():
    cost, w = CostModel(CostModelConfig()), diamond()
    a, b, c, d = (stage_unloaded_s(s, cost) for s in w.stages)
    assert b > 2.0  # the tool's time is on the path
    assert unloaded_latency_s(w, cost) == pytest.approx(a + max(b, c) + d)


def test_session_child_prefills_only_new_tokens():
    cost, w = CostModel(CostModelConfig()), diamond()
    child = w.stages[3]
    alone = stage_unloaded_s(child, cost)
    child.session_parent, child.prompt_tokens = 1, 500 + 50 + 300
    model = cost.model("llama-3-8b")
    expected = cost.prefill_s(model, 300, 550) + cost.decode_s(model, 200, 850)
    assert stage_unloaded_s(child, cost) == pytest.approx(expected)
    assert alone < expected + cost.prefill_s(model, 550)


def test_apply_slo_scaled_and_catalog():
    cost = CostModel(CostModelConfig())
    w = diamond()
    apply_slo([w], cost, SLOConfig(mode="catalog"))
    assert w.slo_s == 30.0
    apply_slo([w], cost, SLOConfig(mode="scaled", slo_scale=4.0))
    assert w.slo_s == pytest.approx(4.0 * unloaded_latency_s(w, cost))
    twin = diamond()
    twin.stages[2].output_tokens = 10  # a shorter workflow of the same app
    apply_slo([w, twin], cost, SLOConfig(mode="scaled-app", slo_scale=4.0))
    median = (unloaded_latency_s(w, cost) + unloaded_latency_s(twin, cost)) / 2
    assert w.slo_s == twin.slo_s == pytest.approx(4.0 * median)
    with pytest.raises(ValueError, match="known"):
        SLOConfig(mode="p99")
    with pytest.raises(ValueError, match="slo_scale"):
        SLOConfig(slo_scale=0)


def drain(host: HostCPU) -> dict:
    finished = {}
    while (when := host.next_done_s()) is not None:
        done, _ = host.pop_done(when)
        finished.update({job: when for job in done})
    return finished


def test_workers_queue_fifo_and_report_waits():
    host = HostCPU("workers", 2)
    assert host.submit("a", 1.0, 0.0) == [("a", 0.0)]
    host.submit("b", 3.0, 0.0)
    assert host.submit("c", 1.0, 0.5) == [] and host.num_jobs() == 3
    done, started = host.pop_done(1.0)
    assert done == ["a"] and started == [("c", 0.5)]
    assert host.engine_slowdown() == 1.0
    assert drain(host) == {"c": pytest.approx(2.0), "b": pytest.approx(3.0)}


def test_time_sliced_is_processor_sharing():
    host = HostCPU("time-sliced", 2)
    for job in "abcd":
        host.submit(job, 1.0, 0.0)  # 4 calls on 2 cores: each at half speed
    assert host.rate() == 0.5 and host.engine_slowdown() == 1.0
    assert drain(host) == {j: pytest.approx(2.0) for j in "abcd"}


def test_time_sliced_rate_changes_when_a_call_leaves():
    host = HostCPU("time-sliced", 1)
    host.submit("short", 1.0, 0.0)
    host.submit("long", 3.0, 0.0)
    finished = drain(host)
    assert finished["short"] == pytest.approx(2.0)  # half speed while both run
    assert finished["long"] == pytest.approx(4.0)  # 1 s done by t=2, then 2 s alone


def test_shared_cores_slow_the_engine_and_the_tools():
    host = HostCPU("shared", 4)
    for job in "abc":
        host.submit(job, 1.0, 0.0)
    assert host.engine_slowdown() == 1.0 and host.rate() == 1.0  # 3 calls + engine fit 4 cores
    for job in "def":
        host.submit(job, 1.0, 0.0)
    assert host.engine_slowdown() == pytest.approx(7 / 4) and host.rate() == pytest.approx(4 / 7)
    cost = CostModel(CostModelConfig())
    assert cost.step_s(0.01, 0, 2.0) == pytest.approx(cost.step_s(0.01, 0) + cost.config.step_overhead_s)


def test_unknown_host_mode_fails():
    with pytest.raises(ValueError):
        HostCPU("numa", 4)
    with pytest.raises(ValueError, match="num_cores"):
        HostCPU("workers", 0)


def test_prefix_cache_is_lru_and_trimmed_by_live_allocations():
    from serving.sim.prefixcache import PrefixCache

    cache = PrefixCache()
    cache.put("a", 10)
    cache.put("b", 5)
    cache.trim(num_free_pages=20)
    assert len(cache) == 2
    cache.trim(num_free_pages=12)  # live allocations took 8 of the 20 free pages: the oldest goes
    assert not cache.take("a") and cache.take("b") and cache.num_pages == 0
    off = PrefixCache(is_enabled=False)
    off.put("a", 10)
    assert not off.take("a")


def test_moe_attention_width_follows_query_heads():
    from serving.sim.costmodel import MODEL_PROFILES

    assert MODEL_PROFILES["qwen3-coder-30b-a3b"].attention_dim == 4096
    assert MODEL_PROFILES["llama-3-8b"].attention_dim == 4096
