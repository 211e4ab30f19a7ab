"""Whether holding a predicted request back pays, for admission "adaptive" (plain Python, no vLLM).

Under admission "vllm" a request starts whenever vLLM can allocate its prompt; where the predicted footprints of the
running requests and its own then outgrow the pool, vLLM preempts one of them later (the last in Maestro's order,
victims.py), which drops its KV: its tokens are prefilled again when it resumes. Holding the request back until its
footprint fits (admission "hold") avoids that re-prefill, at the price of the request's wait for the room to free.
`hold_pays` weighs the two on the plugin's clock: the tokens the preemption would drop, at the measured prefill cost a
token, against the predicted wait, the running requests' predicted remaining tokens at the measured decode pace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from serving.core.admission.projection import GrowingStage, peak_blocks


@dataclass(frozen=True)
class RunningRoom:
    """A predicted running request as the wait for room reads it: its KV now (prompt and output so far), its
    projected growth to its reserve (admission's footprint), and its predicted remaining tokens (its median)."""

    held_tokens: int
    growth_tokens: int
    remaining_tokens: int

    def at(self, tokens_later: int) -> GrowingStage:
        """Its KV projection `tokens_later` decode steps from now, from then on (one token a step)."""
        grown = min(tokens_later, self.growth_tokens)
        return GrowingStage(
            prompt_tokens=self.held_tokens + grown,
            output_tokens=self.growth_tokens - grown,
            start_s=0.0,
            first_token_s=0.0,
            tokens_per_s=1.0,
        )


def fits_at(
    running: Sequence[RunningRoom], candidate: GrowingStage, capacity_blocks: int, block_size: int, tokens_later: int
) -> bool:
    """Whether the candidate, started `tokens_later` decode steps from now, fits beside the running requests that
    are still running then (each ends after its predicted remaining tokens), within `capacity_blocks`."""
    still = [r.at(tokens_later) for r in running if r.remaining_tokens > tokens_later]
    return peak_blocks(still, candidate, now_s=0.0, tokens_per_s=1.0, block_size=block_size) <= capacity_blocks


def wait_for_room_tokens(
    running: Sequence[RunningRoom], candidate: GrowingStage, capacity_blocks: int, block_size: int
) -> int:
    """Decode steps until the candidate's footprint fits: the first predicted end of a running request after which
    it fits beside the rest (at the last end, with nothing running, it starts whatever its size)."""
    ends = sorted({r.remaining_tokens for r in running})
    for end in ends:
        if fits_at(running, candidate, capacity_blocks, block_size, end):
            return end
    return ends[-1] if ends else 0


@dataclass(frozen=True)
class HoldWeighing:
    """The two sides of the choice, on the plugin's clock."""

    reprefill_s: float  # the tokens a preemption would drop × prefill_s_per_token
    wait_s: float  # the predicted wait for room × the decode pace

    @property
    def is_hold(self) -> bool:
        return self.reprefill_s > self.wait_s


def weigh_hold(
    dropped_tokens: int, prefill_s_per_token: float, wait_tokens: int, decode_s_per_token: float
) -> HoldWeighing:
    """Hold where re-prefilling the dropped tokens would cost more than waiting for room (a tie admits)."""
    if min(dropped_tokens, wait_tokens) < 0 or min(prefill_s_per_token, decode_s_per_token) < 0:
        raise ValueError(
            f"weigh_hold: token counts and per-token costs must be >= 0, got dropped_tokens={dropped_tokens}, "
            f"wait_tokens={wait_tokens}, prefill_s_per_token={prefill_s_per_token}, "
            f"decode_s_per_token={decode_s_per_token}"
        )
    return HoldWeighing(dropped_tokens * prefill_s_per_token, wait_tokens * decode_s_per_token)


def dropped_tokens(ranks: dict[str, int], held_tokens: Callable[[str], int]) -> int:
    """The tokens a preemption would drop: those the victim holds, the request ranked first for preemption among the
    running ones and the candidate (victims.py ranks, the largest preempted first); 0 with nobody ranked."""
    if not ranks:
        return 0
    return held_tokens(max(ranks, key=ranks.get))
