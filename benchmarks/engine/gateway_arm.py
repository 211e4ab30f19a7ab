"""The gateway's decisions in front of the engine replay's vLLM: the `gateway+ARM` arms (benchmarks/engine/arms.py).

What a user deploys is the gateway (serving/gateway/) in front of vLLM. Here its workflow triage runs in the replay
loop (`benchmarks/engine/steps.py`) through the gateway's own objects, fed as the gateway feeds them:
- the triage is `serving.gateway.triage.GatewayTriage` (over `WorkflowTriage`), built as `Gateway` builds it for the
  default system (`serving.core.systems.DEFAULT_SYSTEM`: whether it turns workflows away, its default `TriageConfig`),
  on this object as its dispatcher: `clock()` the replay's step, `is_backlogged()` whether vLLM has requests waiting;
- a stage is triaged when it becomes ready (`turns_away`), as `stage_request` builds it from what the plan tells the
  gateway at readiness (the arm's source: predicted tokens and reserve, the workflow's predicted remaining work, both
  on a one-step-a-token pace, the plugin's) and the workflow's arrival and deadline in steps;
- `served` when a stage ends, its work the same pace over the tokens it produced, with whether vLLM had requests
  waiting then; `end` when the workflow's stages have all ended or it was turned away;
- a stage that is sent carries vLLM's `priority` as the gateway puts it on the wire, `deadline_priority` of its
  deadline in seconds (steps × `step_s`) from the run's start.
A turned-away workflow ends at the gateway: its stages that have not started never run, and it misses its SLO.
"""

from __future__ import annotations

from serving.core.request import StageRequest, TokenPace, WorkflowInfo, stage_request
from serving.core.systems import DEFAULT_SYSTEM, get_system
from serving.gateway.triage import GatewayTriage
from serving.gateway.vllm_priority import deadline_priority

PACE = TokenPace(1.0)  # a stage's predicted, attained and served work: one step a token, as the plugin's hints
POOL = "engine"  # the one model the replayed engine serves: the triage's one pool
MAX_RANK = 9999  # a stage without a deadline is ranked by its predicted tokens, capped here (Gateway.vllm_priority)


class GatewayArm:
    """The gateway's triage and priority for one replay; the triage keeps the workflows it turned away."""

    def __init__(self, step_s: float, scheduler):
        if step_s <= 0:
            raise ValueError(f"gateway arm: step_s must be > 0, got {step_s}")
        self.step_s, self.scheduler = step_s, scheduler
        self.now, self.is_engine_backlogged = 0.0, False
        self.triage = GatewayTriage(get_system(DEFAULT_SYSTEM).triage_rejects, self)
        self.log: list[dict] = []  # each triage call's inputs and answer

    def clock(self) -> float:
        return self.now

    def is_backlogged(self) -> bool:
        """Whether work waits for the engine: vLLM left requests waiting after its last step (the gateway forwards every
        stage, so its queue is its node's; a request sent since is not waiting yet, it has not been scheduled)."""
        return self.is_engine_backlogged

    def after_step(self) -> None:
        """An engine step ran: whether vLLM left requests waiting."""
        self.is_engine_backlogged = len(self.scheduler.waiting) > 0

    def request(self, workflow: dict, spec: dict, stages: list, step: float) -> StageRequest:
        """The ready stage as the gateway's `prepare` builds it, from what the plan tells the gateway; `stages`: its
        workflow's (the replay's `Stage`s), whose ended ones make its attained service."""
        told = spec["gateway"]
        attained_s = sum(PACE.service_s(0, s.num_output_tokens) for s in stages if s.finish_step >= 0)
        info = WorkflowInfo(
            workflow["id"],
            workflow["arrival_step"],
            workflow["arrival_step"] + workflow["slo_steps"],
            workflow["interactive"],
            attained_s,
            told["workflow_remaining_s"],
        )
        return stage_request(
            info,
            spec["id"],
            prompt_tokens=spec["prompt_tokens"],
            tokens_pred=told["tokens_pred"],
            tokens_reserve=told["tokens_reserve"],
            max_tokens=spec["max_tokens"],
            pace=PACE,
            ready_s=step,
            model=POOL,
        )

    def turns_away(self, request: StageRequest, step: float) -> bool:
        """Triage the ready stage at `step`; True where its workflow is turned away (it ends here)."""
        self.now = step
        is_backlogged = self.is_backlogged()
        was_turned_away = self.triage.has_rejected(request.workflow_id)
        is_turned_away = self.triage.turns_away(request)
        self.log.append(
            {
                "workflow": request.workflow_id,
                "stage": request.stage_id,
                "step": step,
                "pred_service_s": request.pred_service_s,
                "workflow_remaining_s": request.workflow_remaining_s,
                "is_backlogged": is_backlogged,
                "is_turned_away": is_turned_away,
            }
        )
        if is_turned_away and not was_turned_away:
            self.triage.end(request.workflow_id)
        return is_turned_away

    def priority(self, request: StageRequest) -> int:
        """vLLM's `priority` as the gateway sends it (`Gateway.vllm_priority`): the deadline, interactive first."""
        rank = min(MAX_RANK, request.tokens_pred)
        return deadline_priority(request.interactive, request.deadline_s * self.step_s, 0.0, rank)

    def served(self, request: StageRequest, prompt_tokens: int, output_tokens: int, step: float) -> None:
        """A stage ended at `step` having produced `output_tokens`: the triage measures its pool's capacity."""
        self.now = step
        self.triage.served(request, PACE.service_s(prompt_tokens, output_tokens), self.is_backlogged())

    def end(self, workflow_id: str) -> None:
        self.triage.end(workflow_id)

    def snapshot(self) -> dict:
        return {
            **self.triage.snapshot(),
            "num_rejected": self.triage.num_rejected_workflows,
            "rejected": list(self.triage.rejected),
            "triaged": self.log,
        }
