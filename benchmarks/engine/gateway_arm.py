"""The gateway's decisions in front of the engine replay's vLLM: the `gateway+ARM` arms (benchmarks/engine/arms.py).

What a user deploys is the gateway (serving/gateway/) in front of vLLM. Here its workflow triage runs in the replay
loop (`benchmarks/engine/steps.py`) through the gateway's own objects, fed as the gateway feeds them:
- the triage is `serving.gateway.triage.GatewayTriage` (over `WorkflowTriage`), built as `Gateway` builds it for the
  default system (`serving.core.systems.DEFAULT_SYSTEM`: whether it turns workflows away, its default `TriageConfig`),
  on this object as its dispatcher: `clock()` the replay's step, `is_backlogged()` whether vLLM has requests waiting;
- a stage is triaged when it becomes ready (`turns_away`), as `stage_request` builds it from what the plan tells the
  gateway at readiness (the arm's source: predicted tokens and reserve, the workflow's predicted remaining work, both
  on a one-step-a-token pace, the plugin's), the workflow's arrival and deadline in steps, and the tool steps it is
  predicted to wait from the stage on, as the gateway predicts them (`RemainingWork.tool_ahead_s` over the run's ended
  workflows, fed by the replay loop as the gateway feeds it: benchmarks/engine/tool_ahead.py);
- `served` when a stage ends, its work the same pace over the tokens it produced, with whether work waited then, and its
  wall time (replay steps since the gateway sent it, the arm's clock); `end` when the workflow's stages have all ended
  or it was turned away;
- with the batch-cost gate (`batch_cost`, the `gateway+gate+` arms): a stage that passed the triage queues in the
  gateway's dispatch core (`serving.core.dispatch.DispatchCore` over the default system's policy) and starts when
  the gateway's `BatchCostGate` admits it, through the live adapter (`serving.gateway.batch_gate.refusal`) reading
  the engine as `ReplayNode`: the gateway's `NodePace` fed each finished stage's call time and first-token delay on the
  replay clock (the price of the steps it spanned), and the stages sent and not yet ended; a held stage's wait is in
  its latency, and the triage sees work waiting while any is held;
- a stage that is sent carries vLLM's `priority` as the gateway puts it on the wire, `deadline_priority` of its
  deadline in seconds (steps × `step_s`) from the run's start.
A turned-away workflow ends at the gateway: its stages that have not started never run, and it misses its SLO.
"""

from __future__ import annotations

from collections import deque

from serving.core.admission.batch_cost import BatchCostGate, NodeState, RunningStage
from serving.core.dispatch import DispatchConfig, DispatchCore, Outcome
from serving.core.request import StageRequest, TokenPace, WorkflowInfo, stage_request
from serving.core.scheduler import create_scheduler
from serving.core.systems import DEFAULT_SYSTEM, get_system
from serving.gateway import batch_gate
from serving.gateway.node_pace import NodePace
from serving.gateway.triage import GatewayTriage
from serving.gateway.vllm_priority import deadline_priority
from serving.sim.costmodel import StepLoad

PACE = TokenPace(1.0)  # a stage's predicted, attained and served work: one step a token, as the plugin's hints
POOL = "engine"  # the one model the replayed engine serves: the triage's one pool
MAX_RANK = 9999  # a stage without a deadline is ranked by its predicted tokens, capped here (Gateway.vllm_priority)
PACE_STEPS = 16  # the engine steps that decoded whose prices make the gate's pace and bare step


class ReplayNode:
    """The replayed engine as the gateway's dispatch core (`NodeView`) and batch-cost gate (`NodeState`) read a node.

    The gate is fed what the live adapter (`serving.gateway.batch_gate`) feeds it, the stages sent and not ended (each
    since when, with its deadline and predicted tokens, `batch_gate.candidate` for the one asking), and the step cost
    from the clock the engine is priced by: the pace a running stage gets is the mean price of the last `PACE_STEPS`
    engine steps that decoded (one token a step, prefill chunks in the same step included), the bare step the price of
    those steps' decodes alone; a prefill's stall is the gateway's `NodePace` first-token delay (0 until measured)."""

    name = POOL

    def __init__(self, gate: BatchCostGate, clock):
        self.gate, self.clock = gate, clock
        self.pace = NodePace()
        self.running_requests: dict[StageRequest, float] = {}
        self.prices: deque[tuple[float, float]] = deque(maxlen=PACE_STEPS)  # (step price, its decodes' price)

    def observe_step(self, price: float, decode_price: float) -> None:
        self.prices.append((price, decode_price))

    def state(self) -> NodeState:
        running = tuple(
            RunningStage(r.deadline_s, started, tokens_pred=r.tokens_pred, tokens_reserve=r.tokens_reserve)
            for r, started in self.running_requests.items()
        )
        pace, bare = (sum(p) / len(self.prices) for p in zip(*self.prices)) if self.prices else (0.0, 0.0)
        return NodeState(self.clock(), running, pace, bare, self.pace.first_token_delay_s)

    def admit(self, request: StageRequest) -> bool | None:
        is_ok = not self.running_requests or self.gate.admits_candidate(self.state(), batch_gate.candidate(request))
        return True if is_ok else None

    def may_fit_later(self, request: StageRequest) -> bool:
        return True

    def fitness_terms(self, request: StageRequest) -> tuple[float, float, float]:
        return 1.0, self.load(), 0.0

    def load(self) -> float:
        return float(len(self.running_requests))


class GatewayArm:
    """The gateway's triage, priority and (with `batch_cost`) batch-cost gate for one replay; the triage keeps the
    workflows it turned away."""

    def __init__(self, step_s: float, scheduler, batch_cost: bool = False):
        if step_s <= 0:
            raise ValueError(f"gateway arm: step_s must be > 0, got {step_s}")
        self.step_s, self.scheduler = step_s, scheduler
        self.now, self.is_engine_backlogged = 0.0, False
        system = get_system(DEFAULT_SYSTEM)
        self.triage = GatewayTriage(system.triage_rejects, self)
        self.log: list[dict] = []  # each triage call's inputs and answer
        self.sent_step: dict[StageRequest, float] = {}  # a sent stage's step, until it ends
        self.first_token_step: dict[StageRequest, float] = {}
        self.gate = BatchCostGate() if batch_cost else None
        self.node = ReplayNode(self.gate, self.clock) if batch_cost else None
        self.queue = DispatchCore(
            create_scheduler(system.scheduler),
            DispatchConfig(router="least-loaded"),
            is_live=lambda request, now: not self.triage.has_rejected(request.workflow_id),
        )
        self.held: dict[StageRequest, object] = {}  # a queued stage's replay Stage
        self.held_log: list[dict] = []  # each stage the gate held: its workflow, class and steps waiting

    def clock(self) -> float:
        return self.now

    def is_backlogged(self) -> bool:
        """Whether work waits for the engine: vLLM left requests waiting after its last step (the gateway forwards every
        stage, so its queue is its node's; a request sent since is not waiting yet, it has not been scheduled)."""
        return self.is_engine_backlogged or len(self.queue) > 0

    def after_step(self, live, price, load: StepLoad, step: float) -> None:
        """An engine step carrying `load` ended at `step` (`price`: what a load costs on the replay clock): whether
        vLLM left requests waiting; the step's price and its decodes' alone (for the gate's pace, where it decoded);
        the first token of each sent stage (`live`: the replay's stages in vLLM)."""
        self.is_engine_backlogged = len(self.scheduler.waiting) > 0
        if self.node is not None and load.num_decodes:
            self.node.observe_step(price(load), price(StepLoad(load.num_decodes, load.decode_context_tokens)))
        for stage in live:
            request = stage.triaged
            if stage.num_output_tokens > 0 and request is not None and request not in self.first_token_step:
                self.first_token_step[request] = step

    def passes(self, request: StageRequest, stage, step: float) -> bool:
        """A stage the triage let through: True where it goes to vLLM now (no gate), else it queues in the gateway
        until `releases` lets it go."""
        if self.gate is None:
            return True
        self.queue.add(request, step)
        self.held[request] = stage
        return False

    def releases(self, step: float) -> list:
        """The queued stages the gate lets start now, in the queue's order (their replay Stages); a stage of a
        workflow turned away since it queued is dropped."""
        self.now, out = step, []
        if self.gate is None:
            return out
        for decision in self.queue.decisions([self.node], step):
            stage = self.held.pop(decision.request)
            if decision.outcome is Outcome.START:
                self.node.running_requests[decision.request] = step
                request, waited = decision.request, step - decision.request.ready_s
                if waited > 0:
                    self.held_log.append(
                        {"workflow": request.workflow_id, "interactive": request.interactive, "waited": waited}
                    )
                out.append(stage)
        return out

    def sent(self, request: StageRequest, step: float) -> None:
        self.sent_step[request] = step
        if self.node is not None:
            self.node.running_requests[request] = step

    def request(self, workflow: dict, spec: dict, stages: list, step: float, remaining_tool_s: float) -> StageRequest:
        """The ready stage as the gateway's `prepare` builds it, from what the plan tells the gateway; `stages`: its
        workflow's (the replay's `Stage`s), whose ended ones make its attained service; `remaining_tool_s`: the tool
        steps predicted from it on (`ToolAhead.arrived`)."""
        told = spec["gateway"]
        attained_s = sum(PACE.service_s(0, s.num_output_tokens) for s in stages if s.finish_step >= 0)
        info = WorkflowInfo(
            workflow["id"],
            workflow["arrival_step"],
            workflow["arrival_step"] + workflow["slo_steps"],
            workflow["interactive"],
            attained_s,
            told["workflow_remaining_s"],
            remaining_tool_s,
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
                "remaining_tool_s": request.remaining_tool_s,
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
        """A stage ended at `step` having produced `output_tokens`: the triage measures its pool's capacity, with the
        stage's wall time since it was sent; the gate's node its pace (call time and first-token delay)."""
        self.now = step
        sent = self.sent_step.pop(request)
        first = self.first_token_step.pop(request, step)
        work_s = PACE.service_s(prompt_tokens, output_tokens)
        self.triage.served(request, work_s, self.is_backlogged(), wall_s=step - sent)
        if self.node is not None:
            self.node.running_requests.pop(request, None)
            self.node.pace.observe_decode(output_tokens, step - sent)
            self.node.pace.observe_stream(first - sent, output_tokens, step - first)

    def end(self, workflow_id: str) -> None:
        self.triage.end(workflow_id)

    def snapshot(self) -> dict:
        return {
            **self.triage.snapshot(),
            "num_rejected": self.triage.num_rejected_workflows,
            "rejected": list(self.triage.rejected),
            "triaged": self.log,
            "batch_cost": None
            if self.gate is None
            else {
                "num_refused": self.gate.num_refused,
                "num_held": len(self.held_log),
                "held_steps": round(sum(h["waited"] for h in self.held_log), 2),
                "held": self.held_log,
                "num_queued": len(self.queue),
                "pace": self.node.pace.snapshot(),
                "last_state": {
                    "pace_s_per_token": self.node.state().pace_s_per_token,
                    "step_s": self.node.state().step_s,
                },
            },
        }
