"""KV a node's stages will hold over time, for admission that does not reserve every stage's peak at once.

vLLM gives a running request one token of KV per decode step: a stage holds its prompt, grows
to prompt + output, then frees everything. Reserving every stage's peak from its start (what
`peak` admission does) leaves the blocks that late stages will only need later idle while early
stages finish. `projected` admission lets a stage in when, with every running stage decoding at
the measured rate, the total never exceeds the node — checked just before each stage ends, where
the piecewise-linear total peaks. A stage past its projected end is held at its peak until the
candidate's end (the rate was optimistic for it).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GrowingStage:
    """One stage's KV on a node: `prompt_tokens` at `start_s`, then one more token per decoded token."""

    prompt_tokens: int
    output_tokens: int
    start_s: float


def _blocks(num_tokens: float, block_size: int) -> int:
    return -(-int(num_tokens) // block_size)


def peak_blocks(stages: list[GrowingStage], candidate: GrowingStage, now_s: float, tokens_per_s: float,
                block_size: int) -> int:
    """The most blocks `stages` plus `candidate` (starting now) hold at once until the candidate ends."""
    candidate_end = candidate.start_s + candidate.output_tokens / tokens_per_s
    everyone = [*stages, candidate]
    ends = [s.start_s + s.output_tokens / tokens_per_s for s in everyone]
    ends = [end if end > now_s else candidate_end for end in ends]  # overran: assume it lasts as long as the candidate
    moments = sorted({now_s, *(end for end in ends if end <= candidate_end)})
    return max(_held_at(everyone, ends, moment, tokens_per_s, block_size) for moment in moments)


def _held_at(stages: list[GrowingStage], ends: list[float], moment: float, tokens_per_s: float,
             block_size: int) -> int:
    """Blocks held just before `moment` by the stages still running then."""
    total = 0
    for stage, end in zip(stages, ends):
        if end >= moment:
            grown = min(stage.output_tokens, max(0.0, tokens_per_s * (moment - stage.start_s)))
            total += _blocks(stage.prompt_tokens + grown, block_size)
    return total
