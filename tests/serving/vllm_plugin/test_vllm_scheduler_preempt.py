"""Maestro's order preemptive (`maestro_scheduler.preemptive`) and admission "adaptive", stepped in process against
hold-back on the fake 20-block pool of test_vllm_scheduler_steps.py (vllm_scheduler_steps.py), over both of vLLM's
scheduler classes.
"""

from __future__ import annotations

import pytest

from tests.serving.vllm_plugin.test_vllm_scheduler_steps import is_async, num_preempted, request, steps_of

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]
__all__ = ["is_async"]  # the fixture, shared


def victims(result: dict) -> list[str]:
    return [rid for step in result["steps"] for rid in step["preempted"]]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_preemptive_maestro_admits_the_urgent_request_and_preempts_the_one_its_order_serves_last(
    tmp_path, tiny_model, is_async, policy
):
    # 14 + 19 blocks at their ends > 19. Held back, "urgent" waits until "relaxed" ends. Preemptive, it starts at once;
    # when the pool runs out (~step 145) relaxed has ~55 tokens left and urgent ~135, but relaxed's deadline is far:
    # the order serves it last, so it is the victim, and urgent ends first.
    requests = [
        request("relaxed", 0, 200, {"tokens_pred": 200, "deadline_s": 5000}),
        request("urgent", 3, 280, {"tokens_pred": 280, "deadline_s": 700}),
    ]
    default, preemptive, admit_only = steps_of(
        tmp_path,
        tiny_model,
        *(
            {"scheduler": "maestro", "policy": policy, "requests": requests, "maestro_config": config}
            for config in ({"admission": "hold"}, {"admission": "vllm"}, {"admission": "vllm", "victim": "remaining"})
        ),
        is_async=is_async,
    )
    assert num_preempted(default) == 0 and default["finished"] == ["relaxed", "urgent"]
    assert default["decisions"]["num_requests_held_back"] == 1
    assert victims(preemptive) == ["relaxed"] and preemptive["finished"] == ["urgent", "relaxed"]
    assert preemptive["decisions"]["num_held_back"] == 0 and preemptive["decisions"]["num_preempted"] == 1
    # vLLM's admission with the default victim rule: urgent starts at once too, but the victim is the one with the
    # most predicted work left, urgent itself, and relaxed ends first.
    assert victims(admit_only) == ["urgent"] and admit_only["finished"] == ["relaxed", "urgent"]
    assert admit_only["decisions"]["num_held_back"] == 0


def test_adaptive_admission_holds_where_the_re_prefill_is_dear_and_admits_where_the_wait_is_long(
    tmp_path, tiny_model, is_async
):
    # The scenario above under admission "adaptive": urgent does not fit beside relaxed, whose ~197 tokens left are
    # the wait for room, and the preemption admitting it would cause drops relaxed's ~13 tokens (the order's victim).
    # At 100 steps a prefilled token that re-prefill costs ~1,300 steps: held, as the default holds it. At 0.001 it
    # costs nothing: admitted, as vLLM admits it, and relaxed is preempted as under `preemptive`.
    requests = [
        request("relaxed", 0, 200, {"tokens_pred": 200, "deadline_s": 5000}),
        request("urgent", 3, 280, {"tokens_pred": 280, "deadline_s": 700}),
    ]
    dear, cheap = steps_of(
        tmp_path,
        tiny_model,
        *(
            {
                "scheduler": "maestro",
                "requests": requests,
                "maestro_config": {"admission": "adaptive", "prefill_s_per_token": prefill_s_per_token},
            }
            for prefill_s_per_token in (100.0, 0.001)
        ),
        is_async=is_async,
    )
    assert num_preempted(dear) == 0 and dear["finished"] == ["relaxed", "urgent"]
    assert dear["decisions"]["num_adaptive_held"] >= 1 and dear["decisions"]["num_adaptive_admitted"] == 0
    assert victims(cheap) == ["relaxed"] and cheap["finished"] == ["urgent", "relaxed"]
    # (request, step) pairs: urgent once, then relaxed, preempted, each step until vLLM can allocate it again
    assert cheap["decisions"]["num_adaptive_admitted"] >= 1 and cheap["decisions"]["num_adaptive_held"] == 0
