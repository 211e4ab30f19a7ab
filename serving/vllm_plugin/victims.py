"""Which predicted running request vLLM's preemption takes first (plain Python, no vLLM).

vLLM preempts when a running request cannot grow: under `fcfs` the last of `running`, under `priority` the largest
`(priority, arrival_time)`. `MaestroMixin._rank_victims` (scheduler.py) orders the predicted running requests by a rank,
largest last, and raises their priority by it for the step, so either rule takes the largest rank. The rank is the
config's `victim_rule`, which by default follows the admission (`MaestroSchedulerConfig.admission`; `victim` sets it
apart, so that the engine referee can measure admission and victim separately):

- Admission "hold": a request is held back until its predicted footprint fits (admission.py), so vLLM preempts only
  when a request outgrew its prediction; the rank is its predicted work left (`remaining_ranks`).
- Admission "vllm" or "adaptive": a request starts as vLLM starts it (adaptive: unless holding it back pays), so the
  pool runs short as load rises; the rank is the place the request would take in Maestro's queue order were it
  waiting now, its service the predicted work it has left (`order_ranks`), so the request the order would serve last
  goes first, and the one it would serve first goes last.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from serving.core.scheduler import Scheduler
from serving.vllm_plugin.hints import MaestroHints, request_from_hints


@dataclass(frozen=True)
class RunningView:
    """A predicted running request as the victim choice reads it (times on the clock of vLLM's `arrival_time`)."""

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    max_tokens: int
    hints: MaestroHints
    remaining_tokens: int  # its predicted output still to come, re-predicted from what it produced (progress.py)


def remaining_ranks(running: Iterable[RunningView]) -> dict[str, int]:
    """Each request's rank under the `remaining` rule (the default under admission "hold"): its predicted tokens left
    (the most left is preempted first)."""
    return {r.request_id: r.remaining_tokens for r in running}


def order_ranks(
    policy: Scheduler, running: Iterable[RunningView], now: float, decode_s_per_token: float
) -> dict[str, int]:
    """Each request's place (0 first) in the order `policy`, an empty policy object, would serve the running requests
    in at `now` were they waiting, each with the predicted work it has left as its service; the last place is
    preempted first."""
    for view in running:
        hints = replace(view.hints, pred_service_s=view.remaining_tokens * decode_s_per_token)
        policy.add(
            request_from_hints(
                view.request_id, view.arrival_s, view.num_prompt_tokens, view.max_tokens, hints, decode_s_per_token
            ),
            now,
        )
    return {stage.stage_id: place for place, stage in enumerate(policy.in_order(now))}
