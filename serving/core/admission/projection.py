"""KV a node's stages will hold over time, for admission that does not reserve every stage's peak at once.

vLLM gives a running request one token of KV per decode step: a stage holds its prompt, grows
to prompt + output, then frees everything. Reserving every stage's peak from its start (what
`peak` admission does) leaves the blocks that late stages will only need later idle while early
stages finish. `projected` admission lets a stage in when, with every running stage decoding at
the measured rate, the total never exceeds the node — checked just before each stage ends, where
the piecewise-linear total peaks. A stage past its projected end is held at its peak until the
candidate's end (the rate was optimistic for it).

A call's time is projected as a fixed overhead (HTTP, tokenising, prefill, the answer's way back)
plus its output at the decode rate (`CallTimeFit`): one pace per node (output / call time) would fold
the overhead into the rate, which makes short calls look slow and long ones fast, and a long stage
hold its peak far longer than it does. The stage is taken to grow from its start and to keep its
peak through the overhead (both conservative: it holds at least what vLLM gives it, for at least as
long).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GrowingStage:
    """One stage's KV on a node: `prompt_tokens` at `start_s`, then one more token per decoded token.

    A stage projected from the node's measured streams (`first_token_s` set) grows from its first token at the
    measured per-stage pace (`tokens_per_s`, or the node's), without the node's fitted overhead — most of that
    overhead is before the first token (vLLM's queue, prefill), and the stage's KV goes back at its last chunk.
    """

    prompt_tokens: int
    output_tokens: int
    start_s: float
    first_token_s: float | None = None
    tokens_per_s: float | None = None

    def end_s(self, tokens_per_s: float, overhead_s: float) -> float:
        if self.first_token_s is None:
            return self.start_s + overhead_s + self.output_tokens / tokens_per_s
        return self.first_token_s + self.output_tokens / (self.tokens_per_s or tokens_per_s)

    def grown(self, moment_s: float, tokens_per_s: float) -> float:
        """Output tokens held at `moment_s`."""
        if self.first_token_s is None:
            return min(self.output_tokens, max(0.0, tokens_per_s * (moment_s - self.start_s)))
        rate = self.tokens_per_s or tokens_per_s
        return min(self.output_tokens, max(0.0, rate * (moment_s - self.first_token_s)))


def _blocks(num_tokens: float, block_size: int) -> int:
    return -(-int(num_tokens) // block_size)


def peak_blocks(
    stages: list[GrowingStage],
    candidate: GrowingStage,
    now_s: float,
    tokens_per_s: float,
    block_size: int,
    overhead_s: float = 0.0,
    measured: tuple[int, float] | None = None,
) -> int:
    """The most blocks `stages` plus `candidate` (starting now) hold at once until the candidate ends.

    `measured` = (blocks vLLM used, when it was asked): a stage past its projected end is held at its
    peak, unless vLLM was asked after that end — then such stages hold together no more than vLLM
    used then, plus a block each for what they could have grown since: the answer that ends a stage can reach the
    gateway well after vLLM freed its blocks (CPU contention), and holding its peak meanwhile would idle the node.
    """
    candidate_end = candidate.end_s(tokens_per_s, overhead_s)
    ends = [s.end_s(tokens_per_s, overhead_s) for s in stages]
    running = [(s, end) for s, end in zip(stages, ends) if end > now_s]
    overran = [(s, end) for s, end in zip(stages, ends) if end <= now_s]
    everyone, ends = [*(s for s, _ in running), candidate], [*(end for _, end in running), candidate_end]
    moments = sorted({now_s, *(end for end in ends if end <= candidate_end)})
    return _held_by_overran(overran, measured, block_size) + max(
        _held_at(everyone, ends, moment, tokens_per_s, block_size) for moment in moments
    )


def _held_by_overran(
    overran: list[tuple[GrowingStage, float]], measured: tuple[int, float] | None, block_size: int
) -> int:
    """Blocks held, until the candidate ends, by stages past their projected end (see `peak_blocks`)."""
    checked, unchecked = 0, 0  # peaks of those vLLM was asked about after their end, and of the others
    num_checked = 0
    for stage, end in overran:
        peak = _blocks(stage.prompt_tokens + stage.output_tokens, block_size)
        if measured is not None and end <= measured[1]:
            checked, num_checked = checked + peak, num_checked + 1
        else:
            unchecked += peak
    if num_checked:
        checked = min(checked, measured[0] + num_checked)
    return checked + unchecked


def _held_at(stages: list[GrowingStage], ends: list[float], moment: float, tokens_per_s: float, block_size: int) -> int:
    """Blocks held just before `moment` by the stages still running then."""
    total = 0
    for stage, end in zip(stages, ends):
        if end >= moment:
            total += _blocks(stage.prompt_tokens + stage.grown(moment, tokens_per_s), block_size)
    return total


MIN_FIT_CALLS = 8  # before this many calls, `CallTimeFit.solve` gives nothing (the node uses one pace)


class CallTimeFit:
    """A node's call time ≈ overhead_s + output_tokens / tokens_per_s, least squares over finished calls.

    Each new call weighs 1 and older ones fade by `forget` per call, so the fit follows load changes.
    """

    def __init__(self, forget: float = 0.95):
        self.forget = forget
        self.num_calls = 0
        self._sums = [0.0] * 5  # weight, Σx, Σy, Σx², Σxy (x = output tokens, y = seconds)

    def observe(self, output_tokens: int, seconds: float) -> None:
        x, y = float(output_tokens), seconds
        self._sums = [self.forget * total + term for total, term in zip(self._sums, (1.0, x, y, x * x, x * y))]
        self.num_calls += 1

    def solve(self) -> tuple[float, float] | None:
        """(overhead_s, tokens_per_s), or None until enough calls of different lengths were seen."""
        weight, sum_x, sum_y, sum_xx, sum_xy = self._sums
        if self.num_calls < MIN_FIT_CALLS:
            return None
        mean_x, mean_y = sum_x / weight, sum_y / weight
        var_x = sum_xx / weight - mean_x**2
        if var_x < (0.2 * mean_x) ** 2:
            return None  # lengths too alike to tell the overhead from the rate
        slope = (sum_xy / weight - mean_x * mean_y) / var_x
        if slope <= 0:
            return None
        overhead_s = min(max(0.0, mean_y - slope * mean_x), mean_y)
        return overhead_s, 1.0 / slope
