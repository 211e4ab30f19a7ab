"""The tool time a replayed workflow is predicted to wait from a ready stage on, as the gateway predicts it.

The engine replay (`benchmarks/engine/steps.py`) plays the gateway's part in what its arms are told of tool time: one
`RemainingWork` (serving/core/scheduler/remaining.py) per run, the gateway's, fed as the gateway feeds it from what
has happened by then on the replay's clock (steps), and read by the same `tool_ahead_s`:
- `ended`, a stage's call ended: its service (`PACE`, one step a token, the plugin's and the gateway arm's unit;
  serving/gateway/record.py), and where it ended in a tool call its workflow's tool phase starts
  (`Sessions.stage_ended`);
- `arrived`, a stage became ready and reaches the gateway (or the engine): its workflow's tool phase, if one is open,
  ends and its steps are observed (`observe_tool`, as `Sessions.arrive` reports it); the stage is its workflow's next
  position (`WorkflowState.next_position`), and the answer is the tool time the app's ended workflows waited from
  that position on (`RemainingWork.tool_ahead_s`, all apps' where the app has too few);
- `end`, the workflow ended: every stage ended (it joins its app's history) or it was turned away (forgotten, and
  nothing of it is fed after).
The answer reads ended workflows only: nothing of the workflow's own later stages, nor of a stage not yet run.
"""

from __future__ import annotations

from benchmarks.engine.gateway_arm import PACE
from serving.core.scheduler.remaining import RemainingWork


class ToolAhead:
    """The replay's history of ended workflows and the tool phases open now (see the module docstring)."""

    def __init__(self, history: RemainingWork | None = None):
        self.history = history or RemainingWork()
        self.tool_since: dict[str, float] = {}  # workflow → the step its tool phase began
        self.num_arrived: dict[str, int] = {}  # workflow → its stages arrived so far (the next one's position)
        self.ended_workflows: set[str] = set()  # ended here: nothing of them is fed after

    def arrived(self, workflow_id: str, app: str, step: float) -> float:
        """A stage of the workflow arrived at `step`: its tool phase ends; the tool steps predicted from it on."""
        since = self.tool_since.pop(workflow_id, None)
        if since is not None:
            self.history.observe_tool(workflow_id, max(0.0, step - since))
        position = self.num_arrived.get(workflow_id, 0)
        self.num_arrived[workflow_id] = position + 1
        return self.history.tool_ahead_s(app, position)

    def ended(
        self, workflow_id: str, app: str, prompt_tokens: int, output_tokens: int, is_tool_call: bool, step: float
    ) -> None:
        """A stage's call of the workflow ended at `step`, in a tool call or not."""
        if workflow_id in self.ended_workflows:
            return
        self.history.observe(workflow_id, app, PACE.service_s(prompt_tokens, output_tokens))
        if is_tool_call:
            self.tool_since[workflow_id] = step

    def end(self, workflow_id: str, completed: bool = True) -> None:
        """The workflow ended: completed (its stages all ended) or turned away."""
        if workflow_id in self.ended_workflows:
            return
        self.ended_workflows.add(workflow_id)
        self.tool_since.pop(workflow_id, None)
        self.num_arrived.pop(workflow_id, None)
        self.history.end(workflow_id, completed)
