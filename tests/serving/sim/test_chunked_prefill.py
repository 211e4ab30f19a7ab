"""Chunked prefill on a simulated node, as vLLM's V1 scheduler runs it: decodes first, then prefill chunks within the
token budget; every step priced by `CostModel.step_time_s`; a long prefill slows the decodes beside it, never stops
them; a preempted stage recomputes through the same chunks."""

import math

import pytest

from serving.core.systems import get_system
from serving.sim.costmodel import CostModel, CostModelConfig, StepLoad
from serving.sim.engine import ClusterConfig, Simulator
from serving.sim.node import PREFILLED, SimNode
from serving.sim.steps import StepBuilder
from serving.sim.workload import SimStage, SimWorkflow

MODEL = "llama-3-8b"


def make_stage(name: str, prompt_tokens: int, output_tokens: int, arrival_s: float = 0.0) -> SimStage:
    workflow = SimWorkflow(name, "app", False, 1e6, arrival_s=arrival_s)
    stage = SimStage(
        workflow,
        0,
        name,
        "agent",
        MODEL,
        [],
        output_tokens,
        False,
        prompt_tokens=prompt_tokens,
        max_tokens=output_tokens,
    )
    workflow.stages, workflow.num_stages_left = [stage], 1
    return stage


def bare_node(budget_tokens: int = 2048) -> SimNode:
    cluster = ClusterConfig(
        num_nodes=1, cost=CostModelConfig(max_num_batched_tokens=budget_tokens), show_progress=False
    )
    return SimNode(0, CostModel(cluster.cost), cluster, get_system("fcfs"))


def run_until_prefilled(node: SimNode, stage: SimStage) -> float:
    """Advance the node's clock to the end of `stage`'s prefill (nothing else may end first); returns when."""
    when = node.next_event_s()
    node.advance(when)
    assert [(kind, s) for kind, s, _ in node.pop_due()] == [(PREFILLED, stage)]
    assert node.end_prefill(stage)
    return when


@pytest.mark.parametrize("prompt_tokens, budget_tokens", [(1, 2048), (2048, 2048), (2049, 2048), (5000, 512)])
def test_a_prefill_alone_takes_ceil_of_its_tokens_over_the_budget_steps(prompt_tokens, budget_tokens):
    node, stage = bare_node(budget_tokens), make_stage("s", prompt_tokens, 10)
    node.add_running(stage, prompt_tokens)
    num_steps = math.ceil(prompt_tokens / budget_tokens)
    assert node.steps.next_end_v() == pytest.approx(num_steps)
    chunk = prompt_tokens / num_steps
    pairs = chunk * prompt_tokens / 2
    step_s = node.cost.step_time_s({MODEL: StepLoad(0, 0, round(chunk), pairs)})
    assert node.step_s() == pytest.approx(step_s)
    assert run_until_prefilled(node, stage) == pytest.approx(num_steps * step_s)
    assert node.produced_tokens(stage, node.v) == pytest.approx(1.0)  # the last chunk's step samples a token


def test_a_long_prefill_slows_the_decodes_beside_it_but_does_not_stop_them():
    node, decoding, long = bare_node(), make_stage("decoding", 100, 5000), make_stage("long", 16_000, 10)
    node.add_running(decoding, 100)
    run_until_prefilled(node, decoding)
    bare_step_s = node.step_s()
    assert bare_step_s == pytest.approx(node.decode_step_s())
    start_s, start_v = node.last_s + 1.0, node.v_at(node.last_s + 1.0)
    node.advance(start_s)
    node.add_running(long, 16_000)
    assert node.step_s() > bare_step_s  # a step carrying a chunk costs more than the decode alone
    assert node.step_s() == pytest.approx(node.cost.step_time_s(node.steps.loads()))
    end_s = run_until_prefilled(node, long)
    tokens = node.produced_tokens(decoding, node.v) - node.produced_tokens(decoding, start_v)
    assert tokens == pytest.approx(math.ceil(16_000 / (2048 - 1)))  # one token a step, a chunk of 2047 beside it
    assert tokens >= 1  # the decode kept going during the prefill
    assert (end_s - start_s) / tokens > bare_step_s  # slower than it decodes alone
    assert tokens < (end_s - start_s) / bare_step_s  # fewer tokens than alone in the same time
    assert node.step_s() == pytest.approx(node.decode_step_s())  # both decode now


def test_every_step_is_priced_by_step_time_s_alone(monkeypatch):
    """With a step price of 0.1 s whatever a step carries, a stage alone takes one step a chunk (the last one samples
    its first token) and one a further output token: nothing else prices the node's time."""
    monkeypatch.setattr(CostModel, "step_time_s", lambda self, loads, host_slowdown=1.0: 0.1)
    cluster = ClusterConfig(num_nodes=1, show_progress=False, cost=CostModelConfig(max_num_batched_tokens=1024))
    stage = make_stage("s", 3000, 40)
    Simulator(cluster, get_system("fcfs"), [stage.workflow]).run()
    assert stage.finished_s - stage.start_s == pytest.approx(0.1 * (math.ceil(3000 / 1024) + 40 - 1))


def test_a_step_with_a_chunk_is_priced_above_one_without():
    cost = CostModel(CostModelConfig())
    decodes = StepLoad(num_decodes=32, decode_context_tokens=32 * 1000)
    with_chunk = StepLoad(32, 32 * 1000, prefill_tokens=512, prefill_pair_tokens=512 * 256)
    assert cost.step_time_s({MODEL: with_chunk}) > cost.step_time_s({MODEL: decodes})


def test_the_gate_reads_a_starts_chunks_from_the_same_step_builder():
    node = bare_node()
    for i in range(4):
        stage = make_stage(f"d{i}", 200, 1000)
        node.add_running(stage, 200)
        run_until_prefilled(node, stage)
    decodes = {MODEL: StepLoad(4, 4 * 200)}
    chunk = StepLoad(4, 4 * 200, prefill_tokens=1000, prefill_pair_tokens=1000 * 500)
    added_s = node.cost.step_time_s({MODEL: chunk}) - node.cost.step_time_s(decodes)
    assert node.added_prefill_s(MODEL, 1000, 0, node.last_s) == pytest.approx(added_s)
    assert node.prefill_backlog_s(node.last_s) == 0.0
    node.add_running(make_stage("p", 1000, 10), 1000)
    assert node.prefill_backlog_s(node.last_s) == pytest.approx(added_s)  # one whole chunk step still to come
    bare = {MODEL: StepLoad(5, 4 * 200 + 1000)}  # the bare batch counts the prefilling stage as a decode
    assert node.decode_step_s() == pytest.approx(node.cost.step_time_s(bare))
    one_more = {MODEL: StepLoad(6, 4 * 200 + 1000 + 300)}
    assert node.added_decode_s(MODEL, 300) == pytest.approx(
        node.cost.step_time_s(one_more) - node.cost.step_time_s(bare)
    )


def test_chunks_share_the_budget_in_start_order_after_the_decodes():
    steps = StepBuilder(budget_tokens=1000)
    steps.set_decode(MODEL, 500, 1)
    steps.start_prefill("first", MODEL, 3000, 0, 0.0)
    steps.start_prefill("second", MODEL, 3000, 0, 0.0)
    first, second = steps.prefills["first"], steps.prefills["second"]
    assert first.chunk_tokens == pytest.approx(3000 / math.ceil(3000 / 999))
    left = 999 - first.chunk_tokens  # what the first leaves of the budget, spread over the steps the second needs
    assert second.chunk_tokens == pytest.approx(3000 / math.ceil(3000 / left))
    assert steps.loads()[MODEL].num_tokens <= 1000
    assert isinstance(steps.loads()[MODEL].prefill_tokens, int)  # a step schedules whole tokens


def test_a_preempted_stage_recomputes_its_context_through_chunks(monkeypatch):
    started = []
    start_prefill = StepBuilder.start_prefill

    def spy(self, key, model, context_tokens, cached_tokens, v):
        start_prefill(self, key, model, context_tokens, cached_tokens, v)
        started.append((key.stage_id, context_tokens, cached_tokens, self.prefills[key].end_v - v, v))

    monkeypatch.setattr(StepBuilder, "start_prefill", spy)
    cluster = ClusterConfig(
        num_nodes=1,
        show_progress=False,
        prefix_caching=False,
        cost=CostModelConfig(max_num_batched_tokens=256),
        grow_chunk_tokens=16,
    )
    cluster.kv_pool_bytes = 64 * cluster.page_bytes  # 64 pages of 16 tokens: the two stages cannot both grow
    workflows = [make_stage("a", 300, 700).workflow, make_stage("b", 300, 700, arrival_s=0.01).workflow]
    sim = Simulator(cluster, get_system("vllm"), workflows)
    sim.run()
    assert sim.recorder.preemptions > 0
    restarts = [(context, cached, num_steps) for _, context, cached, num_steps, _ in started if context > 300]
    assert restarts and all(cached == 0 for _, cached, _ in restarts)  # prompt + generated, all of it recomputed
    assert all(num_steps >= math.ceil(context / 256) for context, _, num_steps in restarts)  # in chunks

    assert all(w.done_s > 0 for w in workflows)


def test_no_stage_starts_in_a_step_that_preempted(monkeypatch):
    """Two stages fill a 2-sequence batch and outgrow the KV; a small one waits. When the later of the two is
    preempted, the small one fits in its slot, yet starts only in the next step, as vLLM admits no waiting request in
    a step that preempted."""
    held_v, started_v = [], {}
    hold_starts, start_prefill = SimNode.hold_starts, StepBuilder.start_prefill

    def hold_spy(self):
        held_v.append(self.v)
        hold_starts(self)

    def start_spy(self, key, model, context_tokens, cached_tokens, v):
        started_v.setdefault(key.stage_id, v)
        start_prefill(self, key, model, context_tokens, cached_tokens, v)

    monkeypatch.setattr(SimNode, "hold_starts", hold_spy)
    monkeypatch.setattr(StepBuilder, "start_prefill", start_spy)
    cluster = ClusterConfig(
        num_nodes=1, max_batch_seqs=2, show_progress=False, prefix_caching=False, grow_chunk_tokens=16
    )
    cluster.kv_pool_bytes = 64 * cluster.page_bytes
    stages = [make_stage("a", 300, 700), make_stage("b", 300, 700, 0.01), make_stage("c", 20, 5, 0.02)]
    sim = Simulator(cluster, get_system("vllm"), [s.workflow for s in stages])
    sim.run()
    assert held_v and all(s.workflow.done_s > 0 for s in stages)
    first_hold_v = held_v[0]
    assert first_hold_v < started_v["c"]  # the small one waited for the preemption's slot ...
    assert started_v["c"] == pytest.approx(first_hold_v + 1.0)  # ... and started in the next step


def test_the_token_budget_is_validated():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        ClusterConfig(cost=CostModelConfig(max_num_batched_tokens=128), max_batch_seqs=256)
    assert ClusterConfig().cost.token_budget == 2048


def test_a_hold_that_has_all_but_passed_schedules_no_event_at_the_same_instant(monkeypatch):
    """A preempting step's hold within a float's rounding of the clock has passed (as `may_start` reads it): were it
    scheduled, its event would not move the clock and would come back at the same instant for ever."""
    node, stage = bare_node(), make_stage("s", 100, 10)
    monkeypatch.setattr(type(node.core), "__len__", lambda self: 1)  # a stage waits
    node.add_running(stage, 100)
    node.starts_held_until_v = node.v + 1e-9
    assert node.may_start(node.last_s)
    assert node.next_event_s() - node.last_s >= 0.5 * node.step_s()  # the prefill's end, a step away
