"""What one more stage in a node's batch costs the stages already running there, and whether they can afford it.

Continuous batching runs every sequence once per decode step, and a step reads every running sequence's KV: a stage
admitted now adds its prefill to every running stage's time once (prefill stalls decoding) and its KV read to every
step they share. For a running stage r with m_r predicted decode tokens still to come, a candidate x that prefills in
`stall_s` and adds `added_step_s` to each step delays r by

    delay_r = stall_s + min(m_r, n_x) · added_step_s            (n_x: x's predicted output tokens)

and r's slack is  deadline_r − now − m_r · pace  at the node's *measured* pace (seconds per token of a running stage,
the prefill stalls of recent admissions included: on a node busy prefilling, decoding gets only what is left). The gate
refuses x while some running stage that could still make its deadline (at the bare step time, were nothing more
admitted) would be pushed past it: delay_r > `slack_share` · slack_r. Stages already past saving do not hold the
batch back, and a candidate that would itself miss by waiting for the next running stage to end goes in anyway.
Holding back stops the stalls, so the pace recovers and the gate opens again; meanwhile a queue forms and its order
(least slack first) decides who goes next. The gate acts only on a congested node (pace ≥ `min_stretch` × step).

The node's pace is the caller's: the simulator's cost model, or live the engine's measured step time. The gate itself
is pure arithmetic over arrays, shared by the simulator, the gateway and the in-engine scheduler.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def remaining_tokens(tokens_pred: float, tokens_reserve: float, produced: float, step_tokens: float = 16.0) -> float:
    """Predicted decode tokens still to come for a stage that has produced `produced`: its prediction's rest while it
    is under it, then the rest of its reserve (the calibrated upper bound), then `step_tokens` at a time."""
    for bound in (tokens_pred, tokens_reserve):
        if produced < bound:
            return bound - produced
    return step_tokens


def fewest_remaining_tokens(tokens_pred: float, tokens_reserve: float, produced: float,
                            step_tokens: float = 16.0) -> float:
    """The decode tokens a stage still has at the least: the lower bound that mirrors its reserve around the point
    prediction in log space (pred² ÷ reserve; length errors are about symmetric there), less what it produced, then
    `step_tokens`. The gate judges endangerment on it, so a wrong prediction makes it admit, not hold back; a
    prediction with a tight reserve (the true length) keeps its full weight."""
    low = tokens_pred * tokens_pred / max(tokens_reserve, tokens_pred, 1)
    return low - produced if produced < low else step_tokens


def candidate_cost(deadline_s: float, now: float, stall_s: float, added_step_s: float, tokens_pred: float,
                   produced: float, pace_s_per_token: float) -> tuple[float, float, float, float]:
    """What `BatchCostGate.admits` reads of a candidate, computed one way for the simulator, the gateway and the
    vLLM plugin: (its prefill stall, the seconds it adds to each decode step, its predicted output tokens, its own
    slack if it started now at the node's measured pace, counting only the tokens it has still to produce)."""
    left = max(1.0, tokens_pred - produced)
    return stall_s, added_step_s, tokens_pred, deadline_s - now - stall_s - left * pace_s_per_token


@dataclass
class BatchCostConfig:
    slack_share: float = 1.0  # the share of a running stage's slack that one admission may use up
    # The gate acts only while prefill stalls stretch the node's pace this many times or more: below it the node is
    # not congested enough for holding a stage back to pay (serving/EXPERIMENTS.md).
    min_stretch: float = 2.0

    def __post_init__(self):
        if not 0 < self.slack_share <= 1:
            raise ValueError(f"batch cost: slack_share must be in (0, 1], got {self.slack_share}")
        if self.min_stretch < 1:
            raise ValueError(f"batch cost: min_stretch must be >= 1, got {self.min_stretch}")


@dataclass
class RunningBatch:
    """The running stages of one node as the gate reads them (arrays, one entry a stage)."""

    remaining_tokens: np.ndarray  # at the least (`fewest_remaining_tokens`)
    slack_s: np.ndarray  # at the node's measured pace (prefill stalls included)
    is_savable: np.ndarray  # could still make its deadline at the bare step time, if nothing more were admitted
    pace_s_per_token: float
    step_s: float

    @classmethod
    def of(cls, remaining: list[float], deadlines_s: list[float], pace_s_per_token: float, step_s: float,
           now: float) -> RunningBatch:
        """`deadlines_s`: each stage's deadline less the prefills already under way (they stall it too); `step_s`:
        the batch's bare decode step; `pace_s_per_token`: what a running stage's token stream shows now."""
        tokens = np.asarray(remaining, dtype=float)
        time_left_s = np.asarray(deadlines_s, dtype=float) - now
        return cls(tokens, time_left_s - tokens * pace_s_per_token, time_left_s - tokens * step_s >= 0,
                   pace_s_per_token, step_s)

    def next_end_s(self) -> float:
        """Seconds until the running stage predicted to end first ends, at the measured pace."""
        return float(self.remaining_tokens.min()) * self.pace_s_per_token


class BatchCostGate:
    """May a candidate join this batch without pushing a running stage past its deadline (module docstring)."""

    def __init__(self, config: BatchCostConfig | None = None):
        self.config = config or BatchCostConfig()
        self.num_refused = 0

    def is_congested(self, pace_s_per_token: float, step_s: float) -> bool:
        """Whether the gate acts at this pace: prefill stalls stretch it `min_stretch` times the bare step or more."""
        return pace_s_per_token >= self.config.min_stretch * step_s

    def admits(self, batch: RunningBatch, stall_s: float, added_step_s: float, candidate_tokens: float,
               candidate_slack_s: float) -> bool:
        """`candidate_slack_s`: the candidate's own slack if it started now (at the node's measured pace). A
        candidate that would miss its deadline by waiting for the next running stage to end is admitted anyway:
        holding it back would trade one miss for another."""
        if len(batch.remaining_tokens) == 0 or not self.is_congested(batch.pace_s_per_token, batch.step_s):
            return True
        delays = stall_s + np.minimum(batch.remaining_tokens, candidate_tokens) * added_step_s
        endangered = batch.is_savable & (delays > self.config.slack_share * batch.slack_s)
        is_ok = not endangered.any() or candidate_slack_s < batch.next_end_s()
        self.num_refused += not is_ok
        return is_ok
