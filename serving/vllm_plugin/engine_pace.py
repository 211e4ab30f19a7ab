"""What MaestroScheduler measures of its engine for the batch-cost gate, and its node as the gate reads it (plain
Python, no vLLM).

The plugin times its steps on the policy's clock (scheduler.py: each `schedule` call ends the step before it, when
that one ran anything). A decoding request gets one token a step, so a running stage's pace is the mean step of the
recent ones (steps that carried prefill chunks included: on an engine busy prefilling, decoding gets what is left)
and the bare step the fastest of them. A prefill stalls the running requests for about a request's delay from its
start to its first token (the median of the recent ones). The running requests' tokens are counted; the gate's other
inputs take `serving.core.admission.batch_cost.NodeState`'s defaults, as the gateway's do. On the step clock every step
lasts one step: the pace is never stretched and the gate never acts.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable

from maestro.progressive import ProgressiveTable
from serving.core.admission.batch_cost import Candidate, NodeState, RunningStage
from serving.vllm_plugin.hints import MaestroHints

MIN_STEPS = 8  # steps timed before the pace counts as measured (until then the gate admits)


class EnginePace:
    """The engine's recent steps and first-token delays, and when each running request started (module docstring)."""

    def __init__(self, num_steps: int = 64, num_first_tokens: int = 32):
        self.recent_steps_s: deque[float] = deque(maxlen=num_steps)
        self.recent_first_tokens_s: deque[float] = deque(maxlen=num_first_tokens)
        self.started_s: dict[str, float] = {}  # running request id → when it (last) entered the running batch
        self._awaiting_first: set[str] = set()  # started with no output token yet
        self._busy_step_s: float | None = None  # when the last step that ran anything was scheduled

    def step_began(self, now: float, num_output_tokens: Callable[[str], int]) -> None:
        """A step is being scheduled at `now`: the step before it (if it ran anything) ended, and the requests whose
        first token it produced show it."""
        if self._busy_step_s is not None:
            self.recent_steps_s.append(now - self._busy_step_s)
        for request_id in [r for r in self._awaiting_first if num_output_tokens(r) > 0]:
            self._awaiting_first.discard(request_id)
            self.recent_first_tokens_s.append(now - self.started_s[request_id])

    def step_scheduled(self, now: float, is_busy: bool) -> None:
        self._busy_step_s = now if is_busy else None

    def started(self, request_id: str, now: float, num_output_tokens: int) -> None:
        """The request entered the running batch (a first start, or a resume after preemption)."""
        self.started_s[request_id] = now
        if num_output_tokens == 0:
            self._awaiting_first.add(request_id)

    def forget(self, request_id: str) -> None:
        self.started_s.pop(request_id, None)
        self._awaiting_first.discard(request_id)

    @property
    def pace_s_per_token(self) -> float:
        """A running request's time per token lately (0 until MIN_STEPS were timed)."""
        return statistics.fmean(self.recent_steps_s) if len(self.recent_steps_s) >= MIN_STEPS else 0.0

    @property
    def bare_step_s(self) -> float:
        return min(self.recent_steps_s) if self.recent_steps_s else 0.0

    @property
    def first_token_delay_s(self) -> float:
        return statistics.median(self.recent_first_tokens_s) if self.recent_first_tokens_s else 0.0

    def node_state(
        self,
        now: float,
        running: Iterable[tuple[str, MaestroHints, float, int, str]],
        table: ProgressiveTable | None = None,
    ) -> NodeState:
        """The engine as the gate reads it: `running` the predicted running requests, each (id, hints, arrival time,
        output tokens so far, the class of its first output tokens); one that entered the batch in this step started
        `now`. `table`: the predictor's progressive table the plugin was given (None: parametric)."""
        stages = tuple(
            RunningStage(
                arrival_s + hints.deadline_s,
                self.started_s.get(request_id, now),
                num_output_tokens,
                prefix,
                table,
                hints.interactive,
                tokens_pred=hints.tokens_pred,
                tokens_reserve=hints.tokens_reserve,
            )
            for request_id, hints, arrival_s, num_output_tokens, prefix in running
        )
        return NodeState(now, stages, self.pace_s_per_token, self.bare_step_s, self.first_token_delay_s)


def gate_candidate(hints: MaestroHints, arrival_s: float, num_output_tokens: int) -> Candidate:
    """A waiting predicted request asking to start (a resumed one with the tokens it had produced)."""
    return Candidate(
        arrival_s + hints.deadline_s,
        num_output_tokens,
        is_interactive=hints.interactive,
        tokens_pred=hints.tokens_pred,
        tokens_reserve=hints.tokens_reserve,
    )
