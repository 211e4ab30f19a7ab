"""A workflow's predicted remaining work after its current stage, learnt from the workflows of its app that ended.

Nobody knows at a stage how many stages its workflow has still to run: an agent decides as it goes. What is known is
the history. For every app, each ended workflow of n stages adds, at every position k < n, the service its stages after
the k-th took; the estimate at position k is the mean of those sums over the ended workflows that reached k (those
that stopped at k add 0). Positions no ended workflow of the app reached fall back to all apps' table, and with no
history at all the estimate is 0 (the stage's own prediction is then the whole of what is known); `own_estimate`
answers from the app's table alone (None where it has none). Service is counted in unloaded seconds of the LLM calls
(prefill, lone decode), the unit of `StageRequest.pred_service_s` and of a pool's capacity, so that queueing in the
history does not inflate it.

Tool time is kept apart: it takes none of a pool's capacity, but the workflow waits for it. `tool_ahead_s` is the mean
tool time of the stages from position k on (the k-th's own tool included), over the same workflows: what a ready
stage's workflow still has to wait outside the pool (`StageRequest.remaining_tool_s`).

The workflow prediction is a median (its model fits the median of log(1 + remaining)), but triage sums the remaining
work of every open workflow against the pool's capacity: the sum wants each workflow's expected work, and on a task
the model never saw its medians also miss by the app (on the referee's dev side: an app's stages predicted at 0.6 to
1.7× the work they then needed). So the prediction is rescaled by its app's ratio: over the stages of the app's ended
workflows that were answered by the prediction, the work they needed after them over the work predicted
(`prediction_scale`), once `min_scale_count` such workflows ended; 1 before. The ranking among an app's workflows is
the model's; only its level is the app's own.

The gateway and the simulator feed it the same way: `observe` when a stage's call ends (its service), `observe_tool`
when its tool returns (the gateway: the session's next call ends the tool phase, `Sessions.arrive`), `end` when the
workflow does (dropped workflows are forgotten: they did not show how much work their app takes), `estimate` when a
stage becomes ready. `remaining_after_s` is the one rule, for both, of which estimate a ready stage gets: the workflow
prediction's (rescaled, and recorded against what the workflow then needs) or this history's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from maestro.prediction import WorkflowFallbackLevel

ALL_APPS = ""


@dataclass
class _Table:
    sum_after_s: list[float] = field(default_factory=list)  # position k → Σ over ended workflows of work after k
    count: list[int] = field(default_factory=list)  # position k → ended workflows that reached k
    sum_tool_from_s: list[float] = field(default_factory=list)  # position k → Σ tool time of stages k, k+1, …

    def add(self, services_s: list[float], tools_s: list[float]) -> None:
        after = tool_from = 0.0
        for k in range(len(services_s) - 1, -1, -1):
            if k >= len(self.count):
                grow = k + 1 - len(self.count)
                self.sum_after_s.extend([0.0] * grow)
                self.sum_tool_from_s.extend([0.0] * grow)
                self.count.extend([0] * grow)
            tool_from += tools_s[k]
            self.sum_after_s[k] += after
            self.sum_tool_from_s[k] += tool_from
            self.count[k] += 1
            after += services_s[k]

    def mean(self, k: int, min_count: int) -> float | None:
        if k < len(self.count) and self.count[k] >= min_count:
            return self.sum_after_s[k] / self.count[k]
        return None

    def mean_tool(self, k: int, min_count: int) -> float | None:
        if k < len(self.count) and self.count[k] >= min_count:
            return self.sum_tool_from_s[k] / self.count[k]
        return None


@dataclass
class _Open:
    app: str
    services_s: list[float] = field(default_factory=list)  # its stages' service, in the order their calls ended
    tools_s: list[float] = field(default_factory=list)  # their tool times
    predicted_s: dict[int, float] = field(default_factory=dict)  # position → the prediction's work after it


@dataclass
class _Scale:
    sum_needed_s: float = 0.0  # Σ over predicted stages of ended workflows: the work needed after them
    sum_predicted_s: float = 0.0  # … and the work predicted after them
    count: int = 0  # ended workflows with a predicted stage


class RemainingWork:
    """Predicted service a workflow still needs after its k-th stage (see the module docstring)."""

    def __init__(self, min_count: int = 3, max_open: int = 100_000, min_scale_count: int = 10):
        if min_count < 1 or max_open < 1 or min_scale_count < 1:
            raise ValueError("RemainingWork: min_count, max_open and min_scale_count must be >= 1")
        self.min_count, self.max_open, self.min_scale_count = min_count, max_open, min_scale_count
        self._tables: dict[str, _Table] = {}
        self._scales: dict[str, _Scale] = {}
        self._open: dict[str, _Open] = {}  # workflow → what it has shown so far

    def _entry(self, workflow_id: str, app: str) -> _Open:
        entry = self._open.get(workflow_id)
        if entry is None:
            if len(self._open) >= self.max_open:  # the oldest open workflow is forgotten, not the history
                self._open.pop(next(iter(self._open)))
            entry = self._open[workflow_id] = _Open(app)
        return entry

    def observe(self, workflow_id: str, app: str, service_s: float) -> None:
        """A stage's call of the workflow ended after `service_s` unloaded seconds of service (no tool time)."""
        entry = self._entry(workflow_id, app)
        entry.services_s.append(service_s)
        entry.tools_s.append(0.0)

    def observe_tool(self, workflow_id: str, tool_s: float) -> None:
        """The tool called by the workflow's last observed stage returned after `tool_s` seconds."""
        if tool_s < 0:
            raise ValueError(f"RemainingWork.observe_tool: tool_s must be >= 0, got {tool_s}")
        entry = self._open.get(workflow_id)
        if entry is not None and entry.tools_s:
            entry.tools_s[-1] += tool_s

    def observe_prediction(self, workflow_id: str, app: str, position: int, predicted_s: float) -> None:
        """The workflow's stage at `position` was answered by the prediction: `predicted_s` of work after it."""
        if predicted_s < 0:
            raise ValueError(f"RemainingWork.observe_prediction: predicted_s must be >= 0, got {predicted_s}")
        self._entry(workflow_id, app).predicted_s[position] = predicted_s

    def end(self, workflow_id: str, completed: bool = True) -> None:
        """The workflow ended; only a completed one joins its app's history."""
        entry = self._open.pop(workflow_id, None)
        if entry is None or not completed:
            return
        for key in {entry.app, ALL_APPS}:
            self._tables.setdefault(key, _Table()).add(entry.services_s, entry.tools_s)
        if entry.predicted_s:
            scale = self._scales.setdefault(entry.app, _Scale())
            scale.count += 1
            for position, predicted_s in entry.predicted_s.items():
                scale.sum_needed_s += sum(entry.services_s[position + 1 :])
                scale.sum_predicted_s += predicted_s

    def prediction_scale(self, app: str) -> float:
        """Work needed over work predicted after the predicted stages of `app`'s ended workflows, once
        `min_scale_count` of them ended (and the prediction said any work); else 1."""
        scale = self._scales.get(app)
        if scale is None or scale.count < self.min_scale_count or scale.sum_predicted_s <= 0:
            return 1.0
        return scale.sum_needed_s / scale.sum_predicted_s

    def own_estimate(self, app: str, position: int) -> float | None:
        """Seconds of work expected after `position` from `app`'s own ended workflows; None where fewer than
        `min_count` of them reached it (no fallback to the other apps)."""
        table = self._tables.get(app)
        return table.mean(position, self.min_count) if table is not None else None

    def estimate(self, app: str, position: int) -> float:
        """Seconds of work expected after the stage at `position` (0-based) of a workflow of `app`."""
        for key in (app, ALL_APPS):
            table = self._tables.get(key)
            mean = table.mean(position, self.min_count) if table is not None else None
            if mean is not None:
                return mean
        return 0.0

    def tool_ahead_s(self, app: str, position: int) -> float:
        """Seconds of tool time expected from the stage at `position` on (its own tool included), by the fallback of
        `estimate`; 0 with no history."""
        for key in (app, ALL_APPS):
            table = self._tables.get(key)
            mean = table.mean_tool(position, self.min_count) if table is not None else None
            if mean is not None:
                return mean
        return 0.0


def remaining_after_s(
    level: WorkflowFallbackLevel,
    predicted_s: Callable[[], float],
    history: RemainingWork,
    app: str,
    position: int,
    workflow_id: str | None = None,
) -> float:
    """The work a ready stage's workflow is expected to need after it, from the workflow prediction's `level` and its
    answer in seconds (`predicted_s`, called only where it is used) or the ended workflows' `history`.

    APP (the model, for an app it was trained on): the prediction. POSITION (only the per-position table over the
    training apps) and PRIOR (no workflow model): the app's own ended workflows once `min_count` of them reached this
    position, else the prediction (POSITION) or every app's history (PRIOR). Where the prediction answers, it is
    rescaled by its app's `prediction_scale` and, given the `workflow_id`, recorded against what the workflow then
    needs after this position."""
    if level is not WorkflowFallbackLevel.APP:
        own_s = history.own_estimate(app, position)
        if own_s is not None:
            return own_s
        if level is not WorkflowFallbackLevel.POSITION:
            return history.estimate(app, position)
    raw_s = predicted_s()
    if workflow_id is not None:
        history.observe_prediction(workflow_id, app, position, raw_s)
    return raw_s * history.prediction_scale(app)
