"""Workflow triage in the engine: the one `WorkflowTriage` of serving/core/scheduler/triage.py, which the gateway and
the simulator also run, fed by Maestro's vLLM scheduler (plain Python, no vLLM).

`arrived` when a predicted request enters the engine (a stage became ready there; work waits for the engine while
predicted requests wait), `finished` when one leaves it, with its unloaded service: its tokens at the scheduler's
`decode_s_per_token`, the gateway's unit. The engine serves one model: one pool. A workflow ends at the triage when its
final request (the `final` hint) leaves, or with the request itself where the hints name no workflow (the request is
its own workflow); a workflow that never says so stays open until its deadline passes, when the triage sheds it. The
tool time a workflow waits outside the engine comes with its hints (`remaining_tool_s`, the sender's
`RemainingWork.tool_ahead_s`): its pool work is due by its deadline less that, as at the gateway and in the simulator.

vLLM has no refusal inside the engine: a request of a shed workflow is served, behind every on-time one and with no
deadline left (its hints marked `is_shed`, so that a preempted one goes back there too, and the batch-cost gate
protects no deadline of it).
"""

from __future__ import annotations

import dataclasses
import math

from serving.core.request import TokenPace
from serving.core.scheduler.triage import TriageConfig, WorkflowTriage
from serving.vllm_plugin.hints import MaestroHints, request_from_hints

POOL = ""  # the engine's one model


class EngineTriage:
    """The triage of one engine's predicted requests (see the module docstring)."""

    def __init__(self, decode_s_per_token: float, config: TriageConfig | None = None):
        self.triage = WorkflowTriage(config)
        self.decode_s_per_token = decode_s_per_token
        self.pace = TokenPace(decode_s_per_token)

    def arrived(
        self,
        request_id: str,
        arrival_s: float,
        num_prompt_tokens: int,
        max_tokens: int,
        hints: MaestroHints,
        now: float,
        is_backlogged: bool,
    ) -> MaestroHints:
        """Triage a predicted request as it arrives: its hints, marked shed with no deadline where its workflow is."""
        stage = request_from_hints(request_id, arrival_s, num_prompt_tokens, max_tokens, hints, self.decode_s_per_token)
        if not self.triage.apply(stage, now, is_backlogged) or hints.is_shed:
            return hints
        return dataclasses.replace(hints, is_shed=True, deadline_s=math.inf)

    def finished(
        self,
        request_id: str,
        hints: MaestroHints,
        num_prompt_tokens: int,
        num_output_tokens: int,
        now: float,
        is_backlogged: bool,
    ) -> None:
        """A predicted request left the engine after producing `num_output_tokens`."""
        self.triage.served(POOL, self.pace.service_s(num_prompt_tokens, num_output_tokens), now, is_backlogged)
        if hints.final or not hints.workflow:
            self.triage.end(hints.workflow or request_id)
