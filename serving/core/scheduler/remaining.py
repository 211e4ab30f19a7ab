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
stage's workflow still has to wait outside the pool (`StageRequest.remaining_tool_s`). Of that time, the seconds the
tools ran on a host CPU are kept too (`tool_ahead_s(..., work=True)`, `StageRequest.remaining_tool_work_s`: the work
triage's tool pool counts) where the caller knows them (the simulator's hosts); the gateway sees only the wall.

The gateway and the simulator feed it the same way: `observe` when a stage's call ends (its service), `observe_tool`
when its tool returns (the gateway: the session's next call ends the tool phase, `Sessions.arrive`), `end` when the
workflow does (dropped workflows are forgotten: they did not show how much work their app takes), `estimate` when a
stage becomes ready. `remaining_after_s` is the one rule, for both, of which estimate a ready stage gets: the workflow
prediction's or this history's.

The workflow prediction is also scored here. A model trained on other tasks of an app can be biased on the app's tasks
of today by a factor (measured on the referee's dev side: AutoGen's remaining work read ~3× the truth, ChatDev's
~0.6×), and Moore–Hodgson then sheds the wrong app's workflows. So each prediction the rule used is kept
(`said`) and, when its workflow ends completed, set against the work that followed; `scale` is the app's Σ realised
over Σ predicted once `min_scale_workflows` ended workflows scored it (1 before; one predicted and found to need
nothing after its stages does not count), and the rule answers the prediction
times that scale: an online correction from what a live system has seen end, never from a workflow still running.
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
    sum_tool_work_from_s: list[float] = field(default_factory=list)  # the same, of the tools' work on a host CPU

    def add(self, services_s: list[float], tools_s: list[float], works_s: list[float]) -> None:
        after = tool_from = work_from = 0.0
        for k in range(len(services_s) - 1, -1, -1):
            if k >= len(self.count):
                grow = k + 1 - len(self.count)
                self.sum_after_s.extend([0.0] * grow)
                self.sum_tool_from_s.extend([0.0] * grow)
                self.sum_tool_work_from_s.extend([0.0] * grow)
                self.count.extend([0] * grow)
            tool_from += tools_s[k]
            work_from += works_s[k]
            self.sum_after_s[k] += after
            self.sum_tool_from_s[k] += tool_from
            self.sum_tool_work_from_s[k] += work_from
            self.count[k] += 1
            after += services_s[k]

    def mean(self, k: int, min_count: int) -> float | None:
        if k < len(self.count) and self.count[k] >= min_count:
            return self.sum_after_s[k] / self.count[k]
        return None

    def mean_tool(self, k: int, min_count: int, work: bool = False) -> float | None:
        if k < len(self.count) and self.count[k] >= min_count:
            return (self.sum_tool_work_from_s if work else self.sum_tool_from_s)[k] / self.count[k]
        return None


class RemainingWork:
    """Predicted service a workflow still needs after its k-th stage (see the module docstring)."""

    def __init__(self, min_count: int = 3, max_open: int = 100_000, min_scale_workflows: int = 5):
        self.min_count, self.max_open, self.min_scale_workflows = min_count, max_open, min_scale_workflows
        self._tables: dict[str, _Table] = {}
        # workflow → (app, its stages' service so far, their tool times, their tools' work)
        self._open: dict[str, tuple[str, list[float], list[float], list[float]]] = {}
        self._said: dict[str, list[tuple[int, float]]] = {}  # workflow → (position, the prediction used there)
        self._scored: dict[str, list[float]] = {}  # app → [Σ predicted, Σ realised, workflows scored]

    def observe(self, workflow_id: str, app: str, service_s: float) -> None:
        """A stage's call of the workflow ended after `service_s` unloaded seconds of service (no tool time)."""
        entry = self._open.get(workflow_id)
        if entry is None:
            if len(self._open) >= self.max_open:  # the oldest open workflow is forgotten, not the history
                self._open.pop(next(iter(self._open)))
            entry = self._open[workflow_id] = (app, [], [], [])
        entry[1].append(service_s)
        entry[2].append(0.0)
        entry[3].append(0.0)

    def observe_tool(self, workflow_id: str, tool_s: float, work_s: float | None = None) -> None:
        """The tool called by the workflow's last observed stage returned after `tool_s` seconds, `work_s` of them
        running on a host CPU (None: all of them; the rest it queued for one)."""
        work_s = tool_s if work_s is None else work_s
        if tool_s < 0 or not 0 <= work_s <= tool_s + 1e-9:
            raise ValueError(
                f"RemainingWork.observe_tool: need tool_s >= 0 and 0 <= work_s <= tool_s, got {tool_s}, {work_s}"
            )
        entry = self._open.get(workflow_id)
        if entry is not None and entry[2]:
            entry[2][-1] += tool_s
            entry[3][-1] += work_s

    def said(self, workflow_id: str, position: int, predicted_s: float) -> None:
        """The workflow prediction answered `predicted_s` seconds after the stage at `position`, and was used."""
        said = self._said.get(workflow_id)
        if said is None:
            if len(self._said) >= self.max_open:
                self._said.pop(next(iter(self._said)))
            said = self._said[workflow_id] = []
        said.append((position, predicted_s))

    def end(self, workflow_id: str, completed: bool = True) -> None:
        """The workflow ended; only a completed one joins its app's history and scores its predictions."""
        entry, said = self._open.pop(workflow_id, None), self._said.pop(workflow_id, [])
        if entry is None or not completed:
            return
        app, services, tools, works = entry
        for key in {app, ALL_APPS}:
            self._tables.setdefault(key, _Table()).add(services, tools, works)
        predicted_s = sum(answer_s for _, answer_s in said)
        realised_s = sum(sum(services[position + 1 :]) for position, _ in said)
        if predicted_s > 0 or realised_s > 0:  # a workflow predicted and found to need nothing more tells no ratio
            scored = self._scored.setdefault(app, [0.0, 0.0, 0])
            scored[0] += predicted_s
            scored[1] += realised_s
            scored[2] += 1

    def scale(self, app: str) -> float:
        """The app's realised work over its predicted work, over its ended workflows' predictions; 1 until
        `min_scale_workflows` of them scored some (or where nothing was predicted)."""
        predicted_s, realised_s, workflows = self._scored.get(app, (0.0, 0.0, 0))
        if workflows < self.min_scale_workflows or predicted_s <= 0:
            return 1.0
        return realised_s / predicted_s

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

    def tool_ahead_s(self, app: str, position: int, work: bool = False) -> float:
        """Seconds of tool time expected from the stage at `position` on (its own tool included), by the fallback of
        `estimate`; 0 with no history. `work`: only the seconds the tools run on a host CPU (no queueing for one)."""
        for key in (app, ALL_APPS):
            table = self._tables.get(key)
            mean = table.mean_tool(position, self.min_count, work) if table is not None else None
            if mean is not None:
                return mean
        return 0.0


def remaining_after_s(
    level: WorkflowFallbackLevel,
    predicted_s: Callable[[], float],
    history: RemainingWork,
    workflow_id: str,
    app: str,
    position: int,
) -> float:
    """The work a ready stage's workflow is expected to need after it, from the workflow prediction's `level` and its
    answer in seconds (`predicted_s`, called only where it is used) or the ended workflows' `history`.

    APP (the model, for an app it was trained on): the prediction, times the app's online scale (`RemainingWork.scale`).
    POSITION (only the per-position table over the training apps) and PRIOR (no workflow model): the app's own ended
    workflows once `min_count` of them reached this position, else the scaled prediction (POSITION) or every app's
    history (PRIOR). A prediction used is kept for scoring (`RemainingWork.said`)."""
    own_s = None if level is WorkflowFallbackLevel.APP else history.own_estimate(app, position)
    if own_s is not None:
        return own_s
    if level is WorkflowFallbackLevel.PRIOR:
        return history.estimate(app, position)
    answer_s = predicted_s()
    history.said(workflow_id, position, answer_s)
    return answer_s * history.scale(app)
