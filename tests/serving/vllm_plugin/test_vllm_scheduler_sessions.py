"""A session's KV held across its tool call inside vLLM (serving/vllm_plugin/session_kv.py), and the seam check,
stepped in process on a fake 20-block pool (vllm_scheduler_steps.py) over both of vLLM's scheduler classes.

The measure is the prompt tokens that a session's next turn computes again though its previous turn had computed
them: under vLLM's prefix cache alone, against Maestro's hold. The clock is the step: a tool call of 110 steps, and
re-prefilling a context counted at a step per token (`prefill_s_per_token`), so that MARS's rule (keep iff re-prefill
time > predicted tool time) keeps a 120-token context across a 110-step tool and lets it go across a 500-step one.
"""

from __future__ import annotations

import pytest

from .test_vllm_scheduler_steps import is_async, steps_of  # noqa: F401 (is_async: the fixture)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

TOOL_STEPS = 110
CONTEXT_TOKENS = 120  # turn 1: 100 prompt + 20 output tokens, 7 full blocks cached
STEP_PREFILL = {"prefill_s_per_token": 1.0}


def session(tool_s: float, background: list[tuple[int, int, int]]) -> list[dict]:
    """Turn 1 of a session, predicted to end in a tool call of `tool_s`; turn 2 after the tool's TOOL_STEPS (its
    context and 20 new tokens); other requests (arrival step, prompt tokens, output tokens) meanwhile."""
    turns = [
        {"id": "t1", "step": 0, "prompt_tokens": 100, "max_tokens": 20, "session": {"session": "s", "tool_s": tool_s}},
        {
            "id": "t2",
            "after": "t1",
            "gap": TOOL_STEPS,
            "prompt_tokens": 20,
            "max_tokens": 10,
            "session": {"session": "s"},
        },
    ]
    return turns + [
        {"id": f"bg{k}", "step": step, "prompt_tokens": prompt, "max_tokens": out}
        for k, (step, prompt, out) in enumerate(background)
    ]


# Three requests in turn during the tool call (90 + 30 tokens, 8 blocks each): one at a time fits beside the held
# context, but together they cycle through every free block, so vLLM's prefix cache evicts the context.
IN_TURN = [(25, 90, 30), (60, 90, 30), (95, 90, 30)]
# One request that needs 15 blocks at once: it fits only if the held context is given up.
LARGE = [(25, 200, 40)]


def kv_counts(result: dict) -> dict:
    return {k.removeprefix("num_kv_"): v for k, v in result["decisions"].items() if k.startswith("num_kv_")}


def test_a_context_held_across_its_tool_call_is_its_next_turns_prefix_hit(tmp_path, tiny_model, is_async):
    vllm, kept, let_go, expired = steps_of(
        tmp_path,
        tiny_model,
        {"scheduler": "vllm", "requests": session(TOOL_STEPS, IN_TURN)},
        {"scheduler": "maestro", "requests": session(TOOL_STEPS, IN_TURN), "maestro_config": STEP_PREFILL},
        {"scheduler": "maestro", "requests": session(500, IN_TURN), "maestro_config": STEP_PREFILL},
        # MARS keeps it, but for 2 × 20 steps: the hold expires long before the next turn, and the requests in
        # between evict part of the context.
        {"scheduler": "maestro", "requests": session(20, IN_TURN), "maestro_config": STEP_PREFILL},
        is_async=is_async,
    )
    assert vllm["recomputed"] == {"t2": CONTEXT_TOKENS}  # evicted by the requests in between
    # Held: only the last, partial block's tokens are computed again.
    assert kept["recomputed"]["t2"] <= 0.3 * vllm["recomputed"]["t2"]
    assert kv_counts(kept) == {
        "kept": 1,
        "not_kept": 0,
        "hits": 1,
        "hit_tokens": 7 * 16,
        "missed": 0,
        "expired": 0,
        "reclaimed": 0,
    }
    # Nothing else changed: the same requests ran in the same steps, preempting nothing.
    assert [set(s["scheduled"]) for s in kept["steps"]] == [set(s["scheduled"]) for s in vllm["steps"]]
    assert not any(s["preempted"] for s in kept["steps"])
    # Re-prefilling 120 tokens (120 steps), with nothing running beside it to hold up, costs less than a 500-step tool:
    # not kept (MARS's rule, and Maestro's at the batch's price).
    assert let_go["recomputed"] == vllm["recomputed"] and kv_counts(let_go)["not_kept"] == 1
    assert kv_counts(expired)["expired"] == 1 and kv_counts(expired)["hits"] == 0
    assert expired["recomputed"]["t2"] > kept["recomputed"]["t2"]


def test_a_turn_ended_by_a_stop_string_is_held_as_one_ended_by_itself(tmp_path, tiny_model, is_async):
    """vLLM ends a turn on a stop string by aborting it in the engine core: its context is held all the same."""
    turns = session(TOOL_STEPS, IN_TURN)
    turns[0] = {**turns[0], "max_tokens": 40, "stop_at": 20}  # the stop string matched at the 20th token
    vllm, held = steps_of(
        tmp_path,
        tiny_model,
        *({"scheduler": s, "requests": turns, "maestro_config": STEP_PREFILL} for s in ("vllm", "maestro")),
        is_async=is_async,
    )
    assert vllm["recomputed"]["t2"] >= CONTEXT_TOKENS  # the prefix cache alone lost it to the requests in between
    assert kv_counts(held)["kept"] == 1 and kv_counts(held)["hits"] == 1
    assert held["recomputed"]["t2"] <= 0.3 * vllm["recomputed"]["t2"]


def test_held_blocks_are_given_up_first_under_memory_pressure(tmp_path, tiny_model, is_async):
    vllm, maestro = steps_of(
        tmp_path,
        tiny_model,
        *(
            {"scheduler": s, "requests": session(TOOL_STEPS, LARGE), "maestro_config": STEP_PREFILL}
            for s in ("vllm", "maestro")
        ),
        is_async=is_async,
    )
    assert kv_counts(maestro)["kept"] == kv_counts(maestro)["reclaimed"] == 1
    # Released when the large request needed its blocks: every step is vLLM's, no preemption came of the hold.
    assert maestro["steps"] == vllm["steps"] and maestro["finished"] == vllm["finished"]


def test_a_vllm_without_a_seam_is_refused_at_start_naming_its_version_and_the_seam(tmp_path, tiny_model, is_async):
    [result] = steps_of(
        tmp_path,
        tiny_model,
        {
            "scheduler": "maestro",
            "requests": [],
            "vllm_version": "0.99.0",
            "without_seam": "_handle_blocked_waiting_request",
        },
        is_async=is_async,
    )
    error = result["error"]
    assert "written for vLLM 0.32.0" in error and "installed vLLM 0.99.0" in error
    assert "Scheduler._handle_blocked_waiting_request" in error
