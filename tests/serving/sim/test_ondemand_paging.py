"""Stock vLLM's paging in the simulator: a system that maps KV on demand holds blocks for the tokens a sequence has and
no virtual range for its max_tokens, so pages alone limit how many sequences run, as in vLLM's own scheduler.

The scenario is the step harness's (tests/serving/vllm_plugin/vllm_scheduler_steps.py): 20 blocks of 16 tokens (vLLM
keeps one back), eight requests of 10 prompt tokens and 200 output tokens arriving at once, eight sequences at most.
Each needs 14 blocks at its end: 8 × 14 = 112 is past 3 × 19 = 57, the virtual space a reserving system may overcommit.
"""

from __future__ import annotations

import pytest

from serving.core.admission.sizing import ReservationMode
from serving.core.systems import get_system
from serving.sim.costmodel import CostModel, CostModelConfig
from serving.sim.engine import ClusterConfig, Simulator
from serving.sim.workload import SimStage, SimWorkflow
from tests.serving.vllm_plugin.test_vllm_scheduler_steps import num_preempted, request, steps_of

MODEL = "llama-3-8b"
BLOCK_TOKENS, NUM_BLOCKS, NUM_REQUESTS, PROMPT, OUTPUT = 16, 19, 8, 10, 200


def workflows() -> list[SimWorkflow]:
    out = []
    for i in range(NUM_REQUESTS):
        workflow = SimWorkflow(f"r{i}", "app", False, 1e9, arrival_s=0.0)
        stage = SimStage(
            workflow, 0, f"r{i}", "agent", MODEL, [], OUTPUT, False, prompt_tokens=PROMPT, max_tokens=OUTPUT
        )
        workflow.stages, workflow.num_stages_left = [stage], 1
        out.append(workflow)
    return out


def simulate(system: str) -> tuple[int, int]:
    """(stages started at once, preemptions) of the scenario on one simulated node."""
    cost = CostModel(CostModelConfig())
    page_bytes = BLOCK_TOKENS * cost.model(MODEL).kv_bytes_per_token
    cluster = ClusterConfig(
        num_nodes=1,
        cost=cost,
        kv_pool_bytes=NUM_BLOCKS * page_bytes,
        page_bytes=page_bytes,
        max_batch_seqs=NUM_REQUESTS,
        grow_chunk_tokens=BLOCK_TOKENS,
        show_progress=False,
    )
    runs = workflows()
    summary = Simulator(cluster, get_system(system), runs).run().summary
    assert all(w.done_s >= 0 for w in runs)
    return sum(w.stages[0].first_start_s == 0.0 for w in runs), summary["num_preemptions"]


def test_only_a_reserving_system_has_a_virtual_limit():
    assert ReservationMode.ON_DEMAND.virtual_overcommit(3.0) == float("inf")
    assert all(mode.virtual_overcommit(3.0) == 3.0 for mode in ReservationMode if mode is not ReservationMode.ON_DEMAND)


def test_stock_vllm_starts_every_sequence_its_pages_hold_now_and_preempts_when_they_run_out():
    started, preemptions = simulate("vllm")
    assert started == NUM_REQUESTS  # under a 3x virtual limit only 57 // 14 = 4 would start
    assert preemptions > 0
    # a max-len system maps 14 blocks up front: one runs at a time and nothing is preempted
    assert simulate("fcfs") == (1, 0)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_vllms_scheduler_starts_as_many_as_the_simulated_stock_vllm(tmp_path, tiny_model):
    requests = [request(f"r{i}", 0, OUTPUT) for i in range(NUM_REQUESTS)]
    (run,) = steps_of(tmp_path, tiny_model, {"scheduler": "vllm", "requests": requests})
    assert len(run["steps"][0]["scheduled"]) == simulate("vllm")[0] == NUM_REQUESTS
    assert num_preempted(run) > 0
