"""vLLM's `priority` for a stage sent to a node that runs stock vLLM (`--scheduling-policy priority`): an int, lower
served first (and, when vLLM must preempt, the highest preempted first).

The encoding, from the top: interactive stages take [0, 2⁴⁰), batch stages [2⁴⁰, 2⁴¹), so every interactive stage
goes before every batch one. Within a class, a stage with a deadline (its workflow's first arrival + its SLO:
`X-Maestro-SLO-S`, or `system.slo_s`) gets its deadline in whole milliseconds since the gateway started, in
[0, 2³⁹) (17 years): vLLM serves, and keeps, the earliest deadline first. A stage without a deadline comes after
every stage with one, at 2³⁹ + the gateway's own rank of it (`Gateway.vllm_priority`: the workflow's arrival rank, or
its predicted tokens). Stages of equal priority vLLM serves in arrival order.
"""

from __future__ import annotations

import math

BATCH_PRIORITY = 1 << 40  # vLLM priority offset of batch stages: every interactive one goes first
NO_DEADLINE = 1 << 39  # within a class, the offset of the stages without a deadline: after every deadline
MS_PER_S = 1000  # a deadline is sent in whole milliseconds


def vllm_priority_value(is_interactive: bool, rank: int) -> int:
    """vLLM's `priority` of a stage (lower first): interactive before batch, then by `rank` within each."""
    return (0 if is_interactive else BATCH_PRIORITY) + rank


def deadline_priority(is_interactive: bool, deadline_s: float, origin_s: float, rank_without_deadline: int) -> int:
    """The `priority` of a stage whose deadline is `deadline_s` (monotonic; inf: none), `origin_s` the clock's
    instant that counts as 0 ms (the gateway's start)."""
    if not math.isfinite(deadline_s):
        return vllm_priority_value(is_interactive, NO_DEADLINE + min(max(0, rank_without_deadline), NO_DEADLINE - 1))
    deadline_ms = round((deadline_s - origin_s) * MS_PER_S)
    return vllm_priority_value(is_interactive, min(max(0, deadline_ms), NO_DEADLINE - 1))
