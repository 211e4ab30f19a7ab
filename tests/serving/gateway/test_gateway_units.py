"""Fast tests of the gateway: real scheduler/allocator/routing objects, the ASGI app in process.

Upstream vLLM nodes are small aiohttp servers on 127.0.0.1 that answer like vLLM (usage, SSE, /metrics);
the real-engine tests are in test_gateway_vllm.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from maestro.prediction import OutputSize
from pipelines.collect import collect
from serving.core.admission.projection import CallTimeFit, GrowingStage, peak_blocks
from serving.core.request import StageRequest
from serving.core.scheduler import create_scheduler
from serving.gateway.bodies import BodyMetadata
from serving.gateway.config import GatewayConfig, NodeConfig
from serving.gateway.core import Gateway
from serving.gateway.jobs import Dispatcher, Full, Job, NoNode
from serving.gateway.metadata import HEADERS, METADATA_KEYS, parse_metadata
from serving.gateway.nodes import Admission, Node, Refusal
from serving.gateway.outcome import CallResult
from serving.gateway.priority import current_cpu_nice
from serving.gateway.prompt_tokens import PromptSizer
from serving.gateway.traces import TraceWriter
from serving.gateway.validation import BadRequest, check_header_names, check_metadata_keys
from serving.gateway.vllm_sync import parse_metrics
from serving.gateway.workflows import DECODE_S_PER_TOKEN

from .conftest import metrics_text, run_app


def make_node(name: str, blocks: int = 16, usage: float = 0.0) -> Node:
    node = Node(NodeConfig(name, f"http://{name}"), upstream=None)
    node.apply_metrics(parse_metrics(metrics_text(blocks, usage)))
    node.is_healthy = True
    return node


def reserve(node: Node, prompt_tokens: int, output_tokens: int):
    """What the dispatcher does for a stage it starts on `node`: admit, then reserve with that admission."""
    admission = node.admit(prompt_tokens, output_tokens)
    return node.reserve(admission) if admission.is_admitted else None


def make_job(stage: str, tokens: int, interactive: bool = True, loop=None) -> Job:
    request = StageRequest(
        "w",
        stage,
        interactive=interactive,
        size=OutputSize(tokens_pred=tokens, tokens_reserve=0),
        pred_service_s=tokens / 50,
    )
    from serving.gateway.metadata import StageMeta

    job = Job(StageMeta("w", stage), request, reserve_tokens=tokens)
    job.future = (loop or asyncio.new_event_loop()).create_future()
    request.payload = job
    return job


def test_metrics_size_the_pool_in_vllm_blocks():
    node = make_node("a", blocks=16, usage=0.25)
    assert (node.num_blocks, node.kv.block_size) == (16, 128)
    assert node.kv.num_free_blocks == 12  # vLLM's own usage counts even without gateway reservations
    reservation = reserve(node, 128 * 2, 128 * 4)
    assert reservation is not None and node.kv.num_free_blocks == 10  # max(reserved 6, used 4)
    node.release(reservation)  # vLLM freed them too: its stale usage drops until the next /metrics
    assert node.kv.num_free_blocks == 16 and node.kv_usage == 0.0
    node.apply_metrics(parse_metrics(metrics_text(16, 0.25)))
    assert node.kv.num_free_blocks == 12


def test_vllms_null_block_is_not_counted_as_room():
    """vLLM v1 reports num_gpu_blocks including its null block, which no request can hold."""
    node = Node(NodeConfig("a", "http://a"), upstream=None, kv_admission="projected")
    node.apply_metrics(parse_metrics(metrics_text(blocks=15)))
    node.is_healthy = True
    assert 'num_gpu_blocks="16"' in metrics_text(blocks=15) and node.num_blocks == 15
    node.apply_metrics(parse_metrics(metrics_text(blocks=15, usage=14 / 15)))
    assert node.num_unused_blocks == 1
    assert node.admit(128, 0).is_admitted
    assert not node.admit(129, 0).is_admitted  # one block free: a 2-block prompt waits


def test_what_if_admissions_count_no_refusals():
    node = make_node("a", blocks=2)
    assert not node.admit(128 * 3, 0, count_refusal=False).is_admitted and sum(node.num_refused.values()) == 0
    assert node.admit(128 * 3, 0).refusal is Refusal.BUDGET and node.num_refused["budget"] == 1


def test_dispatcher_admits_only_what_fits_and_wakes_the_queue_on_finish():
    loop = asyncio.new_event_loop()
    node = make_node("a", blocks=4)
    dispatcher = Dispatcher(create_scheduler("least-slack"), [node], max_queued=2)
    big, small = make_job("big", 128 * 3, loop=loop), make_job("small", 128 * 2, loop=loop)
    dispatcher.submit(big)
    dispatcher.submit(small)
    assert big.future.done() and not small.future.done()  # 3 of 4 blocks taken: 2 more do not fit
    with pytest.raises(Full):
        dispatcher.submit(make_job("x", 128 * 2, loop=loop))
        dispatcher.submit(make_job("y", 128 * 2, loop=loop))
    dispatcher.finish(big)
    assert small.future.result() is node


def test_a_start_whose_blocks_no_longer_map_puts_the_job_back_in_its_place():
    loop = asyncio.new_event_loop()
    node = make_node("a", blocks=4)
    dispatcher = Dispatcher(create_scheduler("fcfs"), [node], max_queued=8, recheck_s=0)
    reserve, refusals = node.reserve, [None]  # the first reserve finds the blocks gone (the node changed since admit)
    node.reserve = lambda admission: refusals.pop() if refusals else reserve(admission)
    job = make_job("s", 128, loop=loop)
    dispatcher.submit(job)
    assert not job.future.done() and len(dispatcher.core) == 1 and node.num_inflight == 0
    dispatcher.pump()
    assert job.future.result() is node and job.reservation is not None and node.num_inflight == 1


def test_backfill_lets_a_stage_that_fits_pass_a_head_that_does_not():
    loop = asyncio.new_event_loop()
    for depth in (0, 8):
        node = make_node("a", blocks=4)
        dispatcher = Dispatcher(create_scheduler("fcfs"), [node], max_queued=8, backfill_depth=depth)
        running, big, small = (make_job(name, 128 * n, loop=loop) for name, n in (("run", 3), ("big", 3), ("small", 1)))
        for job in (running, big, small):
            dispatcher.submit(job)
        assert running.future.done() and not big.future.done()  # 1 block left: the head needs 3
        assert small.future.done() == (depth > 0)  # strict head-of-line keeps the 1-block stage waiting too
        dispatcher.finish(running)  # 3 blocks free: the head goes (and then, without backfill, the small one)
        assert big.future.result() is node and small.future.result() is node


def test_backfill_overtakes_a_stage_a_bounded_number_of_times():
    loop = asyncio.new_event_loop()
    node = make_node("a", blocks=8)
    dispatcher = Dispatcher(create_scheduler("fcfs"), [node], max_queued=8, backfill_depth=8, backfill_max_overtaken=2)
    running, big = make_job("run", 128 * 6, loop=loop), make_job("big", 128 * 4, loop=loop)
    smalls = [make_job(f"s{i}", 128, loop=loop) for i in range(3)]
    for job in (running, big, *smalls):
        dispatcher.submit(job)
    assert [s.future.done() for s in smalls] == [True, True, False]  # 2 free blocks: two pass the head
    assert dispatcher.core.num_overtaken(big.request) == 2 and dispatcher.num_backfilled == 2
    dispatcher.finish(smalls[0])  # a block is free, but the head has been passed its 2 times
    dispatcher.finish(smalls[1])
    assert not smalls[2].future.done() and not big.future.done()
    dispatcher.finish(running)  # room for the head: it goes first, then the last small one
    assert big.future.result() is node and smalls[2].future.result() is node
    assert dispatcher.core.num_overtaken(smalls[2].request) == 0


def test_backfill_respects_policy_order_and_skips_cancelled_stages():
    loop = asyncio.new_event_loop()
    node = make_node("a", blocks=4)
    dispatcher = Dispatcher(create_scheduler("fcfs"), [node], max_queued=8, backfill_depth=8, backfill_max_overtaken=1)
    running, big = make_job("run", 128 * 3, loop=loop), make_job("big", 128 * 2, loop=loop)
    dispatcher.core.overtaken[big.request] = (
        1  # already passed its one time: strict head-of-line while the others queue
    )
    cancelled, later, earlier = (make_job(name, 128, loop=loop) for name in ("cancelled", "later", "earlier"))
    cancelled.request.ready_s, later.request.ready_s, earlier.request.ready_s = 0.5, 2.0, 1.0
    for job in (running, big, cancelled, later, earlier):
        dispatcher.submit(job)
    assert not any(j.future.done() for j in (big, cancelled, later, earlier))
    cancelled.future.cancel()
    dispatcher.core.overtaken[big.request] = (
        0  # a fresh allowance: the cancelled stage is skipped; FCFS says `earlier` before `later`
    )
    dispatcher.pump()
    assert earlier.future.done() and not later.future.done()


class NodeReadyAt:
    """A node that can take any stage from a given moment on (what projected admission does as stages end)."""

    name, num_inflight, is_healthy, kv_admission = "t", 0, True, "projected"
    kv = SimpleNamespace(allocator=None, num_blocks=1, num_free_blocks=1)
    vllm = SimpleNamespace(num_waiting=0)

    def __init__(self, ready_s: float):
        self.ready_s = ready_s
        self.running_requests = {}

    def admit(self, prompt_tokens: int, output_tokens: int, now: float, count_refusal: bool = True) -> Admission:
        return Admission(prompt_tokens, output_tokens, refusal=None if now >= self.ready_s else Refusal.PROJECTED)

    def reserve(self, admission: Admission) -> object:
        return object()


def test_a_waiting_head_is_rechecked_as_time_passes_without_events():
    async def run(recheck_s: float) -> bool:
        node = NodeReadyAt(time.monotonic() + 0.05)
        dispatcher = Dispatcher(create_scheduler("fcfs"), [node], max_queued=8, recheck_s=recheck_s)
        job = make_job("s", 128, loop=asyncio.get_running_loop())
        dispatcher.submit(job)
        assert not job.future.done()
        await asyncio.sleep(0.2)  # no finish, no poll
        return job.future.done()

    assert asyncio.run(run(0.01)) and not asyncio.run(run(0.0))


def test_never_fitting_stage_is_413_and_dead_cluster_is_503():
    loop = asyncio.new_event_loop()
    node = make_node("a", blocks=2)
    dispatcher = Dispatcher(create_scheduler("fcfs"), [node], max_queued=8)
    with pytest.raises(NoNode) as error:
        dispatcher.submit(make_job("huge", 128 * 3, loop=loop))
    assert error.value.status == 413
    node.is_healthy = False
    with pytest.raises(NoNode) as error:
        dispatcher.submit(make_job("any", 1, loop=loop))
    assert error.value.status == 503


def test_fitness_prefers_the_emptier_node_and_skips_excluded():
    loop = asyncio.new_event_loop()
    busy, idle = make_node("busy", blocks=16, usage=0.75), make_node("idle", blocks=16)
    dispatcher = Dispatcher(create_scheduler("fcfs"), [busy, idle], max_queued=8)
    job = make_job("s", 128, loop=loop)
    assert dispatcher.choose_node(job) is idle
    job.excluded.add("idle")
    assert dispatcher.choose_node(job) is busy


def test_metadata_from_headers_body_or_nothing():
    meta = parse_metadata(
        {
            "x-maestro-workflow": "w1",
            "x-maestro-stage": "3",
            "x-maestro-parents": "1,2",
            "x-maestro-interactive": "false",
        },
        {"metadata": {"role": "coder"}},
    )
    assert (meta.workflow_id, meta.stage_id, meta.parent_ids, meta.interactive, meta.role) == (
        "w1",
        "3",
        ("1", "2"),
        False,
        "coder",
    )
    lone = parse_metadata({}, {})
    assert lone.stage_id == "0" and lone.workflow_id.startswith("gw-")


def test_the_known_headers_and_metadata_keys_are_declared_once():
    """validation refuses what metadata.py does not read; BodyMetadata types exactly the keys parse_metadata reads."""
    assert set(METADATA_KEYS) == set(HEADERS)
    assert set(BodyMetadata.model_fields) == {key for keys in METADATA_KEYS.values() for key in keys}
    check_header_names(["X-MAESTRO-WORKFLOW", "x-maestro-slo-s", "X-Maestro-Osl", "Authorization"])
    with pytest.raises(BadRequest, match="X-Maestro-Workflow-Id: not a Maestro header"):
        check_header_names(["x-MAESTRO-workflow-ID"])  # header names are case-insensitive
    check_metadata_keys({"workflow_id": "w", "parent_ids": [], "slo_s": 9})
    with pytest.raises(BadRequest, match="metadata.role_id: not a Maestro metadata key .did you mean role"):
        check_metadata_keys({"role_id": "coder"})


def test_the_gateway_readme_lists_the_known_headers_and_metadata_keys():
    """serving/gateway/README.md's *Who a call is* table: one row per fact, its header and its metadata keys."""
    readme = (Path(__file__).parents[3] / "serving" / "gateway" / "README.md").read_text()
    rows = [line.split("|")[1:3] for line in readme.splitlines() if line.startswith("| `X-Maestro-")]
    listed = {header.strip(" `").lower(): tuple(k.strip(" `") for k in keys.split(",")) for header, keys in rows}
    assert listed == {HEADERS[fact]: keys for fact, keys in METADATA_KEYS.items()}


def test_trace_writer_rotates_and_collect_reads_the_directory(tmp_path):
    writer = TraceWriter(tmp_path, rotate_lines=2)
    for i in range(5):
        writer.write(
            {
                "workflow_id": "w",
                "stage_id": str(i),
                "role": "r",
                "prompt": "p",
                "output_tokens": i,
                "is_tool_call": False,
            }
        )
    writer.close()
    stages, errors = collect(tmp_path)
    assert writer.num_files == 3 and len(stages) == 5 and not errors


def test_config_file_errors_name_the_field(tmp_path):
    path = tmp_path / "gw.yaml"
    path.write_text("nodes: [{name: a, url: 'http://x'}]\nmax_queue: 3\n")
    with pytest.raises(ValueError, match="max_queue"):
        GatewayConfig.from_file(path)
    path.write_text("nodes: []\n")
    with pytest.raises(ValueError, match="nodes"):
        GatewayConfig.from_file(path)


# ---- the ASGI app with vLLM-like upstreams -------------------------------------------------------
def test_app_json_stream_and_one_trace_per_stage(tmp_path):
    async def calls(client, gateway):
        headers = {"X-Maestro-Workflow": "w", "X-Maestro-Stage": "1", "X-Maestro-Role": "planner"}
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}
        plain = await client.post("/v1/chat/completions", json=body, headers=headers)
        replay = await client.post("/v1/chat/completions", json=body, headers=headers)
        streamed = await client.post(
            "/v1/chat/completions", json={**body, "stream": True}, headers={**headers, "X-Maestro-Stage": "2"}
        )
        return plain, replay, streamed

    plain, replay, streamed = asyncio.run(run_app(tmp_path, {"a": True}, calls))
    assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 7
    assert replay.headers.get("x-maestro-replay") == "1"
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    stages, _ = collect(tmp_path)
    assert sorted((s.stage_id, s.output_tokens, s.role) for s in stages) == [("1", 7, "planner"), ("2", 7, "planner")]


def test_dead_node_is_retried_elsewhere(tmp_path):
    async def calls(client, gateway):
        gateway.nodes[0].is_healthy = True  # it answered /metrics a moment ago, then died
        return [await client.post("/v1/completions", json={"prompt": "p", "max_tokens": 3}) for _ in range(3)]

    responses = asyncio.run(run_app(tmp_path, {"dead": False, "live": True}, calls))
    assert all(r.status_code == 200 and r.headers["x-maestro-node"] == "live" for r in responses)
    assert len(collect(tmp_path)[0]) == 3


def test_all_nodes_dead_fails_back_with_reason(tmp_path):
    async def calls(client, gateway):
        return await client.post("/v1/completions", json={"prompt": "p", "max_tokens": 3})

    response = asyncio.run(run_app(tmp_path, {"dead": False}, calls))
    assert response.status_code == 503 and "Retry-After" in response.headers
    assert "no healthy vLLM node" in response.json()["error"]["message"]


def test_prompt_sizer_starts_conservative_then_uses_vllms_counts():
    sizer = PromptSizer(chars_per_token=3.0, min_observations=4, margin=0.0)
    assert sizer.estimate(3000, 2) == 1000 + sizer.template_tokens(2)
    for _ in range(4):  # vLLM counted 4 chars per token (plus the template)
        sizer.observe(4000, 2, 1000 + sizer.template_tokens(2))
    assert sizer.chars_per_token == 4.0 and sizer.estimate(3000, 2) == 750 + sizer.template_tokens(2)
    assert PromptSizer(3.0, is_calibrated=False, min_observations=0).chars_per_token == 3.0


def test_overcommit_lets_reservations_exceed_blocks_but_not_vllms_measured_use():
    node = Node(NodeConfig("a", "http://a"), upstream=None, kv_overcommit=1.5)
    node.apply_metrics(parse_metrics(metrics_text(blocks=8)))
    node.is_healthy = True
    assert node.num_blocks == 8 and reserve(node, 128 * 8, 0) is not None
    assert node.kv.num_free_blocks == 4 and reserve(node, 128, 128 * 3) is not None  # 12 of 1.5 × 8 reserved
    assert node.admit(1, 0).refusal is Refusal.BUDGET
    node.apply_metrics(parse_metrics(metrics_text(blocks=8, usage=0.75)))
    assert node.kv.num_free_blocks == 0


def test_projection_admits_a_stage_that_needs_the_blocks_only_after_others_end():
    # 100 tokens/s, block 128: A (256 + 256) started 2 s ago ends at 0.56 s; B (128 + 128) ends at 1.28 s.
    running = [GrowingStage(256, 256, start_s=-2.0), GrowingStage(128, 128, start_s=0.0)]
    late_peaker = GrowingStage(128, 512, start_s=0.0)  # 5 blocks at its end (5.12 s), long after A and B
    assert peak_blocks(running, late_peaker, 0.0, 100.0, 128) == 4 + 2 + 2  # just before A ends
    overran = [GrowingStage(256, 256, start_s=-100.0), running[1]]  # should have ended: held at its peak
    assert peak_blocks(overran, late_peaker, 0.0, 100.0, 128) == 4 + 5  # A's peak to the end, with the candidate's


def test_projected_admission_lets_more_stages_in_than_peak_reservations():
    def node(admission: str, overcommit: float) -> Node:
        n = Node(NodeConfig("a", "http://a"), upstream=None, kv_overcommit=overcommit, kv_admission=admission)
        n.apply_metrics(parse_metrics(metrics_text(blocks=8)))
        n.is_healthy, n.pace.decode_tokens_per_s = True, 100.0
        return n

    peak, projected = node("peak", 1.0), node("projected", 2.0)
    for n in (peak, projected):
        assert reserve(n, 128, 128 * 5) is not None  # 6 blocks at its end, in 5 s
    assert not peak.admit(128, 128 * 2).is_admitted  # 6 + 3 > 8: peak reservations overlap
    admission = projected.admit(128, 128)  # ends (2.6 s) well before the first one peaks: 3 + 2 ≤ 8 at any time
    assert admission.is_admitted and admission.peak_blocks <= 8 and admission.num_blocks == 2


def test_decode_pace_starts_slow_takes_the_first_measure_then_averages_then_fits():
    pace = Node(NodeConfig("a", "http://a"), upstream=None, kv_admission="projected").pace
    assert pace.decode_tokens_per_s == 10.0  # unmeasured: projections assume long overlaps
    pace.observe_decode(100, 1.0)
    assert pace.decode_tokens_per_s == 80.0  # 100 tokens/s, projected 20 % slower
    pace.observe_decode(200, 1.0)
    assert pace.decode_tokens_per_s == 96.0 and pace.call_overhead_s == 0.0
    for tokens in (50, 300, 100, 250, 40, 280):  # 0.2 s per call + 500 tokens/s: the fit takes over
        pace.observe_decode(tokens, 0.2 + tokens / 500)
    # the two first calls (1 s each) still weigh in: close to, not exactly, 0.2 s and 500 tokens/s
    assert 0.1 < pace.call_overhead_s * 0.8 < 0.4 and 300 < pace.decode_tokens_per_s / 0.8 < 700


def test_call_time_fit_splits_the_overhead_from_the_rate():
    fit = CallTimeFit()
    for tokens in (40, 300, 120, 60, 250, 200, 90):
        fit.observe(tokens, 0.15 + tokens / 400)
    assert fit.solve() is None  # 7 calls: not yet
    fit.observe(180, 0.15 + 180 / 400)
    overhead_s, tokens_per_s = fit.solve()
    assert abs(overhead_s - 0.15) < 1e-6 and abs(tokens_per_s - 400) < 1e-3
    same = CallTimeFit()
    for _ in range(10):
        same.observe(100, 0.4)
    assert same.solve() is None  # all one length: overhead and rate cannot be told apart


def test_an_overran_stage_is_held_at_its_peak_unless_vllm_said_later_it_holds_less():
    # 100 tokens/s, block 128: A (256 + 256) should have ended at 2.56 s; it is 3.0 s. The candidate needs 2 blocks.
    overran, candidate = GrowingStage(256, 256, start_s=0.0), GrowingStage(128, 128, start_s=3.0)
    assert peak_blocks([overran], candidate, 3.0, 100.0, 128) == 4 + 2
    assert peak_blocks([overran], candidate, 3.0, 100.0, 128, measured=(0, 2.9)) == 0 + 1 + 2  # + a block of slack
    assert peak_blocks([overran], candidate, 3.0, 100.0, 128, measured=(0, 2.0)) == 4 + 2  # asked before its end


def test_stream_assembler_rebuilds_the_non_streamed_answer():
    from serving.gateway.outcome import StreamAssembler

    chunks = [
        {
            "id": "c1",
            "created": 7,
            "model": "tiny",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        },
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": "Let me "}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": "look."}}]},
        {
            "id": "c1",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "t0",
                                "type": "function",
                                "function": {"name": "search", "arguments": ""},
                            }
                        ]
                    },
                }
            ],
        },
        {
            "id": "c1",
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"q": '}}]}}],
        },
        {
            "id": "c1",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 1,
                                "id": "t1",
                                "type": "function",
                                "function": {"name": "open", "arguments": "{}"},
                            }
                        ]
                    },
                }
            ],
        },
        {
            "id": "c1",
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"oslo"}'}}]},
                    "finish_reason": "tool_calls",
                }
            ],
        },
    ]
    assembler = StreamAssembler(is_chat=True)
    for chunk in chunks:
        assembler.feed_line(f"data: {json.dumps(chunk)}")
    assert assembler.is_finished  # the finish_reason of the one choice: vLLM is done with it
    assembler.feed_line('data: {"id": "c1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 21}}')
    assembler.feed_line("data: [DONE]")
    body = assembler.response()
    [choice] = body["choices"]
    assert body["id"] == "c1" and body["model"] == "tiny" and body["object"] == "chat.completion"
    assert choice["message"]["content"] == "Let me look." and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [
        {"id": "t0", "type": "function", "function": {"name": "search", "arguments": '{"q": "oslo"}'}},
        {"id": "t1", "type": "function", "function": {"name": "open", "arguments": "{}"}},
    ]
    assert body["usage"] == {"prompt_tokens": 9, "completion_tokens": 21}
    result = CallResult()
    result.read_response(body)  # what the trace line is made from: as from vLLM's own non-streamed answer
    assert result.is_tool_call and result.output_tokens == 21 and result.num_tool_calls == 2

    completion = StreamAssembler(is_chat=False, num_choices=2)
    for index, text in ((0, "a"), (1, "b"), (0, "c")):
        completion.feed({"id": "x", "choices": [{"index": index, "text": text, "finish_reason": None}]})
    completion.feed({"id": "x", "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
    assert not completion.is_finished  # choice 1 still decoding
    completion.feed({"id": "x", "choices": [{"index": 1, "text": "", "finish_reason": "length"}]})
    assert completion.is_finished
    assert [c["text"] for c in completion.response()["choices"]] == ["ac", "b"]


def test_a_non_streamed_call_gives_its_kv_back_at_vllms_last_chunk_not_when_the_answer_is_in(tmp_path):
    """vLLM's whole answer (or its stream's end) comes 2 s after its last token: the reservation must not wait."""
    received: list[dict] = []
    tails: list[bool] = []

    async def calls(client, gateway):
        node = gateway.nodes[0]
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        call = asyncio.ensure_future(client.post("/v1/chat/completions", json=body))
        while not tails:  # vLLM has produced every token (the fake is in its 2 s tail now)
            await asyncio.sleep(0.005)
        deadline = time.monotonic() + 0.5
        while node.num_inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        held, answered = node.num_inflight, call.done()
        return (await call), held, answered

    for stream_upstream in (True, False):
        received.clear()
        tails.clear()
        response, held, answered = asyncio.run(
            run_app(
                tmp_path / str(stream_upstream),
                {"a": True},
                calls,
                node_kw={"tail_delay_s": 2.0, "received": received, "tails": tails},
                upstream={"stream": stream_upstream},
            )
        )
        assert response.status_code == 200 and not answered
        answer = response.json()
        assert answer["choices"][0]["message"]["content"] == "x " * 5 and answer["usage"]["completion_tokens"] == 5
        [stage] = collect(tmp_path / str(stream_upstream))[0]
        assert stage.output_tokens == 5 and stage.is_tool_call is False and stage.output_text == "x " * 5
        if stream_upstream:
            assert received[0]["stream"] is True and received[0]["stream_options"]["include_usage"] is True
            assert held == 0  # released at the last chunk, the answer still 1.5 s away
            assert stage.model_extra["kv_released_s"] < 1.0 < 2.0 < stage.e2e_s
        else:
            assert "stream" not in received[0] and held == 1  # held until the whole answer is in


def test_a_streaming_client_releases_at_the_usage_chunk_and_logprobs_calls_go_unstreamed(tmp_path):
    received: list[dict] = []

    async def calls(client, gateway):
        node = gateway.nodes[0]
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        call = asyncio.ensure_future(client.post("/v1/chat/completions", json={**body, "stream": True}))
        await asyncio.sleep(0.3)  # the usage chunk is in; the stream's [DONE] is 0.6 s away
        held = node.num_inflight
        streamed = await call
        plain = await client.post(
            "/v1/chat/completions", json={**body, "logprobs": True}, headers={"X-Maestro-Stage": "lp"}
        )
        return held, streamed, plain

    held, streamed, plain = asyncio.run(
        run_app(tmp_path, {"a": True}, calls, node_kw={"tail_delay_s": 0.6, "received": received})
    )
    assert held == 0 and streamed.status_code == 200 and streamed.text.rstrip().endswith("[DONE]")
    assert plain.status_code == 200 and "stream" not in received[-1]  # logprobs: not rebuilt from chunks


def test_an_underoccupied_node_projects_new_stages_from_measured_streams_once_there_are_enough():
    node = Node(NodeConfig("a", "http://a"), upstream=None, kv_overcommit=2.0, kv_admission="projected")
    node.apply_metrics(parse_metrics(metrics_text(16, 0.0)))
    node.is_healthy, node.pace.decode_tokens_per_s, node.pace.call_overhead_s = True, 750.0, 0.6
    # Fitted from whole calls under contention: fast growth from dispatch, then the peak held for the overhead.
    running = reserve(node, 512, 512)
    assert node.admit(768, 384).refusal is Refusal.PROJECTED  # 8 + 9 blocks at its end
    for _ in range(8):
        node.observe_stream(first_token_delay_s=0.2, output_tokens=101, decode_s=0.5)
    node.observe_stream(first_token_delay_s=0.2, output_tokens=300, decode_s=0.001)  # read in one go: ignored
    node.observe_stream(first_token_delay_s=0.9, output_tokens=300, decode_s=0.06)  # an outlier: the median holds
    assert node.pace.num_streams_observed == 9
    stage = node.pace.project(768, 384, now=10.0, from_streams=True)
    assert stage.first_token_s == pytest.approx(10.0 + 0.2 * node.pace.decode_rate_margin)  # first token early ...
    assert stage.tokens_per_s == pytest.approx(200 * node.pace.decode_rate_margin)  # ... and a slow pace: late end
    node.release(running)
    running = reserve(node, 512, 512)
    assert node.admit(768, 384).is_admitted  # the running stage ends (3.4 s) before the candidate outgrows 7 blocks
    node.num_inflight = 2  # not under-occupied: projected from the fitted call time again
    assert node.admit(768, 384).refusal is Refusal.PROJECTED
    assert node.num_refused["projected"] == 2


def test_a_streaming_client_asking_for_usage_in_every_chunk_keeps_its_kv_until_the_last(tmp_path):
    async def calls(client, gateway):
        node = gateway.nodes[0]
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 40,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        call = asyncio.ensure_future(client.post("/v1/chat/completions", json=body))
        deadline = time.monotonic() + 10
        while not received and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)  # 40 chunks 20 ms apart: mid-stream, every chunk so far carried usage
        held = node.num_inflight
        return held, await call

    received: list[dict] = []
    held, streamed = asyncio.run(
        run_app(tmp_path, {"a": True}, calls, node_kw={"token_delay_s": 0.02, "received": received})
    )
    assert held == 1 and streamed.status_code == 200
    assert collect(tmp_path)[0][0].output_tokens == 40


def test_a_stage_request_carries_its_workflows_remaining_work_and_kept_context(tmp_path):
    from serving.gateway.metadata import StageMeta

    async def calls(client, gateway):
        for w in ("w1", "w2", "w3"):  # three workflows of app x end: 10 output tokens after their first stage
            for stage, final in (("s1", "false"), ("s2", "true")):
                response = await client.post(
                    "/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10},
                    headers={
                        "X-Maestro-Workflow": w,
                        "X-Maestro-Stage": stage,
                        "X-Maestro-App": "x",
                        "X-Maestro-Final": final,
                    },
                )
                assert response.status_code == 200
        body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 50}
        first = await gateway.prepare(StageMeta("w4", "s1", app="x"), body)
        gateway.nodes[0].hold("w4", 128)  # its context kept on the node during a tool call
        second = await gateway.prepare(StageMeta("w4", "s2", app="x"), body)
        return first, second

    first, second = asyncio.run(run_app(tmp_path, {"a": True}, calls))
    assert first.request.workflow_remaining_s == pytest.approx(10 * DECODE_S_PER_TOKEN)
    assert second.request.workflow_remaining_s == 0.0  # no ended workflow of x went past its second stage
    assert not first.request.is_kv_pinned and second.request.is_kv_pinned


def test_workflows_get_their_attained_service_and_vllm_priority_follows_the_policy_order(tmp_path, monkeypatch):
    from serving.gateway import core
    from serving.gateway.metadata import StageMeta
    from serving.gateway.vllm_priority import NO_DEADLINE

    async def calls(client, gateway):
        async def call(workflow: str, stage: str, tokens: int) -> None:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}
            response = await client.post(
                "/v1/chat/completions",
                json=body,
                headers={"X-Maestro-Workflow": workflow, "X-Maestro-Stage": stage, "X-Maestro-Interactive": "false"},
            )
            assert response.status_code == 200

        await call("old", "s1", 10)
        await call("new", "s1", 4)
        body = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 50}
        second = [await gateway.prepare(StageMeta(w, "s2", interactive=False), body) for w in ("new", "old")]
        return gateway, second

    received: list[dict] = []
    gateway, (new2, old2) = asyncio.run(
        run_app(
            tmp_path,
            {"a": True},
            calls,
            node_kw={"received": received},
            system={"name": "maestro-srtf", "options": {"attained_weight": 1.0}},
        )
    )
    assert old2.request.attained_service_s == pytest.approx(10 * DECODE_S_PER_TOKEN)
    assert new2.request.attained_service_s == pytest.approx(4 * DECODE_S_PER_TOKEN)
    assert old2.request.workflow_arrival_s < new2.request.workflow_arrival_s
    scheduler = create_scheduler(gateway.scheduler_config)
    for job in (new2, old2):
        scheduler.add(job.request, 0.0)
    order = [scheduler.pop(0.0).payload for _ in range(2)]
    assert order == [old2, new2]  # the workflow further along first, and vLLM agrees:
    no_deadline = core.BATCH_PRIORITY + NO_DEADLINE  # (no SLO: after every stage with a deadline, in its class)
    assert [gateway.vllm_priority(j) for j in order] == [no_deadline, no_deadline + 1]
    assert received[0]["priority"] < received[1]["priority"]  # sent as "old" then "new"

    nodes = [{"name": "a", "url": "http://a"}]
    per_stage = core.Gateway(GatewayConfig(nodes=nodes, system={"name": "maestro"}))
    assert per_stage.vllm_priority(old2) == no_deadline + old2.request.tokens_pred  # stage order: tokens
    capped = core.Gateway(GatewayConfig(nodes=nodes, system={"name": "maestro", "cap": "aimd-batch"}))
    assert capped.vllm_priority(old2) == no_deadline + 0  # by arrival rank: it has seen no workflow yet

    monkeypatch.setattr(core, "MAX_WORKFLOWS", 2)
    for i, workflow in enumerate(("a", "b", "a", "c")):  # "a" seen again: "b" is the least recently seen
        per_stage.workflow(workflow, float(i))
    assert list(per_stage.workflows) == ["a", "c"] and per_stage.workflows["c"].seq == 2


def test_policy_options_are_checked():
    with pytest.raises(ValueError, match="system.options: unknown"):
        GatewayConfig(nodes=[{"name": "a", "url": "http://a"}], system={"options": {"attained": 1}})
    with pytest.raises(ValueError, match="attained_weight"):
        GatewayConfig(nodes=[{"name": "a", "url": "http://a"}], system={"options": {"attained_weight": -1}})


# ---- cpu_nice (priority.py) ------------------------------------------------------------------------------------
_NICE_PROBE = (
    "import json, sys; from serving.gateway.priority import apply_cpu_nice, current_cpu_nice; "
    "w = apply_cpu_nice(int(sys.argv[1])); print(json.dumps({'warnings': w, **current_cpu_nice()}))"
)


def _nice_probe(nice: int, own_session: bool) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _NICE_PROBE, str(nice)],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=own_session,
        cwd=Path(__file__).parents[3],
        check=True,
    )
    return json.loads(done.stdout)


def test_cpu_nice_reaches_the_autogroup_of_a_gateway_in_its_own_session():
    # a positive nice needs no privilege; with autogroup on, only the group's nice ranks a session against vLLM's
    probe = _nice_probe(5, own_session=True)
    assert probe["nice"] == 5 and probe["warnings"] == []
    if probe["autogroup_nice"] is not None:
        assert probe["autogroup_nice"] == 5


def test_cpu_nice_leaves_a_shared_sessions_autogroup_alone_and_says_so():
    before = current_cpu_nice()["autogroup_nice"]
    probe = _nice_probe(5, own_session=False)
    assert probe["nice"] == 5 and probe["autogroup_nice"] == before
    if before is not None:
        assert len(probe["warnings"]) == 1 and "setsid" in probe["warnings"][0]


def test_cpu_nice_out_of_range_is_a_config_error():
    with pytest.raises(ValueError, match="server.cpu_nice"):
        GatewayConfig(nodes=[{"name": "a", "url": "http://127.0.0.1:1"}], server={"cpu_nice": -30})


def test_a_stage_refused_for_a_full_queue_answers_429_with_retry_after_and_is_traced(tmp_path):
    """Peak admission, one stage's KV at a time, a queue of one: of three stages at once, one runs, one waits and
    the third is refused; all three end with one trace line each, the refused one with its reason."""

    async def calls(client, gateway):
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1500}
        return await asyncio.gather(
            *(
                client.post(
                    "/v1/chat/completions", json=body, headers={"X-Maestro-Workflow": "w", "X-Maestro-Stage": f"s{i}"}
                )
                for i in range(3)
            )
        )

    responses = asyncio.run(
        run_app(
            tmp_path,
            {"a": True},
            calls,
            node_kw={"tail_delay_s": 0.3},
            limits={"max_queued": 1},
            kv={"admission": "peak", "overcommit": 1.0},
        )
    )
    assert sorted(r.status_code for r in responses) == [200, 200, 429]
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["Retry-After"] == "1"
    lines = [json.loads(line) for p in tmp_path.glob("*.jsonl") for line in p.read_text().splitlines()]
    assert sorted(line["stage_id"] for line in lines) == ["s0", "s1", "s2"]
    assert [line["error"] for line in lines if "error" in line] == ["refused: gateway queue full (1 stages waiting)"]


def test_an_old_flat_config_file_says_where_each_field_went(tmp_path):
    path = tmp_path / "gw.yaml"
    path.write_text(
        "nodes: [{name: a, url: 'http://x'}]\npolicy: mars\nkv_admission: peak\nworkflow_cap: 4\n"
        "predictor: http://p:3000\n"
    )
    with pytest.raises(ValueError) as error:
        GatewayConfig.from_file(path)
    message = str(error.value)
    assert "policy → system.name" in message and "kv_admission → kv.admission" in message
    assert "removed (no gain measured" in message and "workflow_cap" in message
    assert "predictor: {source: 'http://p:3000'}" in message


def test_the_config_reads_as_a_few_sections():
    assert len(GatewayConfig.model_fields) <= 12  # nodes, model and sections; a new knob goes in its section


def test_a_system_name_and_its_overrides_build_the_gateway_from_the_system_table():
    from serving.core.admission.sizing import ReservationMode
    from serving.core.systems import SYSTEMS

    nodes = [{"name": "a", "url": "http://a"}]
    for name, system in SYSTEMS.items():
        gateway = Gateway(GatewayConfig(nodes=nodes, system={"name": name}))
        assert gateway.system == system and gateway.scheduler_config.policy == system.scheduler.value
        assert gateway.sessions.tool_kv.config.policy == system.tool_kv.value
        assert (gateway.dispatcher.batch_cost is not None) == system.batch_cost
        assert gateway.dispatcher.core.config.router is system.router
    fcfs = Gateway(GatewayConfig(nodes=nodes, system={"name": "fcfs", "reservation": "predicted"})).system
    assert fcfs.reservation is ReservationMode.PREDICTED and fcfs.scheduler.value == "fcfs"
    with pytest.raises(ValueError, match="system.reservation"):
        GatewayConfig(nodes=nodes, system={"reservation": "lots"})
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        GatewayConfig(nodes=nodes, system={"name": "nope"})
