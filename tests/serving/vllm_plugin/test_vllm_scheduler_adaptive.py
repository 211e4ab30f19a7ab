"""Admission "adaptive" (serving/vllm_plugin/adaptive.py) on constructed cases, and the admission field's validation
(plain Python, no vLLM)."""

from __future__ import annotations

import pytest

from serving.core.admission.projection import GrowingStage
from serving.vllm_plugin.adaptive import (
    RunningRoom,
    dropped_tokens,
    fits_at,
    wait_for_room_tokens,
    weigh_hold,
)
from serving.vllm_plugin.decisions import Decisions
from serving.vllm_plugin.scheduler_config import ADMISSIONS, DEFAULT_ADMISSION, MaestroSchedulerConfig

BLOCK = 32
PREFILL_S_PER_TOKEN = 0.0142  # the engine referee's fitted clock: a full prefill chunk's price a token, in steps


def candidate(prompt_tokens: int, output_tokens: int) -> GrowingStage:
    return GrowingStage(prompt_tokens=prompt_tokens, output_tokens=output_tokens, start_s=0.0)


def weighing(running: list[RunningRoom], new: GrowingStage, capacity_blocks: int, victim_held_tokens: int):
    wait = wait_for_room_tokens(running, new, capacity_blocks, BLOCK)
    return weigh_hold(victim_held_tokens, PREFILL_S_PER_TOKEN, wait, decode_s_per_token=1.0)


def test_it_holds_where_the_re_prefill_is_dear_and_the_room_frees_soon():
    # A 20-block pool; a running request holds 600 tokens (19 blocks) and ends in 5 steps. The candidate (64 + 32
    # tokens) does not fit now; it fits once the running one ends, 5 steps from now. Admitted, the preemption would
    # drop the running one's 600 tokens: 8.5 steps of prefill against a 5-step wait.
    running = [RunningRoom(held_tokens=600, growth_tokens=5, remaining_tokens=5)]
    new = candidate(64, 32)
    assert not fits_at(running, new, 20, BLOCK, tokens_later=0)
    choice = weighing(running, new, 20, victim_held_tokens=600)
    assert choice.wait_s == 5 and choice.reprefill_s == pytest.approx(8.52)
    assert choice.is_hold


def test_it_admits_where_the_wait_for_room_is_long():
    # The same pool and candidate, but the running request has 200 tokens left: waiting costs 200 steps, more than
    # re-prefilling the 600 tokens a preemption drops.
    running = [RunningRoom(held_tokens=600, growth_tokens=200, remaining_tokens=200)]
    choice = weighing(running, candidate(64, 32), 20, victim_held_tokens=600)
    assert choice.wait_s == 200 and not choice.is_hold


def test_it_admits_where_the_victim_holds_little_however_short_the_wait():
    # The victim the order would take is the candidate itself, with a 64-token prompt: 0.9 steps of prefill < 5.
    running = [RunningRoom(held_tokens=600, growth_tokens=5, remaining_tokens=5)]
    assert not weighing(running, candidate(64, 32), 20, victim_held_tokens=64).is_hold


def test_the_wait_is_the_first_predicted_end_after_which_the_candidate_fits():
    # Two running requests: the one ending at 10 frees 4 blocks, not enough; the one ending at 40 frees 12.
    running = [
        RunningRoom(held_tokens=128, growth_tokens=10, remaining_tokens=10),
        RunningRoom(held_tokens=384, growth_tokens=40, remaining_tokens=40),
    ]
    new = candidate(256, 64)  # 10 blocks at its end
    assert wait_for_room_tokens(running, new, 20, BLOCK) == 40
    assert not fits_at(running, new, 20, BLOCK, tokens_later=10) and fits_at(running, new, 20, BLOCK, 40)
    # Too large for the pool even alone: it waits for everything to end (then it starts as vLLM would start it).
    assert wait_for_room_tokens(running, candidate(2000, 10), 20, BLOCK) == 40
    assert wait_for_room_tokens([], new, 20, BLOCK) == 0


def test_the_dropped_tokens_are_the_victims_and_a_tie_admits_and_bad_figures_are_refused():
    held = {"a": 100, "b": 700, "candidate": 50}
    assert dropped_tokens({"a": 0, "b": 2, "candidate": 1}, held.__getitem__) == 700
    assert dropped_tokens({}, held.__getitem__) == 0
    assert not weigh_hold(100, 0.5, 50, 1.0).is_hold  # 50 steps each way: admit
    with pytest.raises(ValueError, match="dropped_tokens=-1"):
        weigh_hold(-1, 0.5, 50, 1.0)


def test_the_admission_field_is_validated_by_name_and_sets_the_victim_rule():
    assert MaestroSchedulerConfig().admission == DEFAULT_ADMISSION in ADMISSIONS
    config = MaestroSchedulerConfig.from_additional_config({"maestro_scheduler": {"admission": "adaptive"}})
    assert config.admission == "adaptive" and config.victim_rule == "order"
    assert MaestroSchedulerConfig(admission="hold").victim_rule == "remaining"
    assert MaestroSchedulerConfig(admission="vllm").victim_rule == "order"
    with pytest.raises(ValueError, match=r"admission must be one of \['hold', 'vllm', 'adaptive'\]"):
        MaestroSchedulerConfig(admission="preempt")


def test_the_decisions_snapshot_counts_each_way_the_adaptive_rule_took():
    counts = Decisions().snapshot()
    assert counts["num_adaptive_held"] == 0 and counts["num_adaptive_admitted"] == 0
