"""What one vLLM engine step carried, read from its scheduler's output: the `StepLoad` a step is priced by.

`LoadTap` wraps a vLLM scheduler's `schedule()` and keeps the load of the step it just scheduled, so that the step
profile (`benchmarks/engine/step_profile.py`) can time steps against their content and the engine replay's fitted
clock (`benchmarks/engine/steps.py`) can price each step by it. vLLM advances a request's `num_computed_tokens` by the
tokens it scheduled before `schedule()` returns, so the tokens already in the KV cache when the step ran are that
count less the scheduled ones: a decode's context, or a prefill chunk's cached prefix (earlier chunks and prefix-cache
hits).
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.sim.costmodel import StepLoad


@dataclass
class ScheduledStep:
    """One step's content: the load it is priced by and the chunks' cached prefix (the profile's CSV records it)."""

    load: StepLoad
    prefill_cached_tokens: int = 0
    num_prefills: int = 0

    @property
    def is_empty(self) -> bool:
        return self.load.num_tokens == 0


def scheduled_step(requests, num_scheduled_tokens: dict) -> ScheduledStep:
    """The content of a step from vLLM's `SchedulerOutput.num_scheduled_tokens` and the scheduler's requests (read
    after `schedule()` returned). A request scheduled one token past its prompt decodes; any other scheduled tokens
    are a prefill chunk (a resumed request's recompute included)."""
    step = ScheduledStep(StepLoad())
    load = step.load
    for request_id, num_tokens in num_scheduled_tokens.items():
        request = requests[request_id]
        before = request.num_computed_tokens - num_tokens
        if num_tokens == 1 and before >= request.num_prompt_tokens:
            load.num_decodes += 1
            load.decode_context_tokens += before
        else:
            load.prefill_tokens += num_tokens
            load.prefill_pair_tokens += num_tokens * (before + num_tokens / 2)
            step.prefill_cached_tokens += before
            step.num_prefills += 1
    return step


class LoadTap:
    """Wraps `scheduler.schedule` in place; `last` is the content of the step scheduled last."""

    def __init__(self, scheduler):
        self.last = ScheduledStep(StepLoad())
        schedule = scheduler.schedule

        def tapped_schedule(*args, **kwargs):
            output = schedule(*args, **kwargs)
            self.last = scheduled_step(scheduler.requests, output.num_scheduled_tokens)
            return output

        scheduler.schedule = tapped_schedule
