"""The Gateway object: nodes, dispatcher, predictor and trace writer, plus the /metrics poller.

`prepare(meta, body)` turns a call into a `Job` (prepare.py: predict → reserve size → StageRequest);
`call.py` (`StageCall`) forwards it; `record(job, ...)` writes its one trace line and observes the outcome (record.py).
Per workflow (bounded, least recently seen dropped first) it keeps when its first stage came, its place in
arrival order and the service its finished stages received, so the policy can order workflows, not only stages.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

from maestro.own_reserve import OwnReserveLevels
from maestro.prediction import Prediction
from serving.core.admission.aimd import AIMDWindow, SessionWindow
from serving.core.admission.batch_cost import BatchCostGate
from serving.core.admission.cap import CapSignals, SessionCap
from serving.core.request import ServicePace, workflow_remaining_s
from serving.core.scheduler import Policy, create_scheduler
from serving.core.scheduler.remaining import RemainingWork, remaining_after_s
from serving.gateway import events
from serving.gateway.config import GatewayConfig
from serving.gateway.exposition import GatewayMetrics
from serving.gateway.jobs import Arrival, Dispatcher, Job
from serving.gateway.metadata import StageMeta, workflow_key
from serving.gateway.nodes import Node
from serving.gateway.outcome import CallResult
from serving.gateway.predict import StagePredictor, create_predictor
from serving.gateway.prepare import prepare_job
from serving.gateway.priority import current_cpu_nice
from serving.gateway.prompt_tokens import PromptSizer
from serving.gateway.record import record_call
from serving.gateway.sessions import Sessions
from serving.gateway.traces import TraceWriter
from serving.gateway.triage import GatewayTriage
from serving.gateway.upstream import Upstream
from serving.gateway.vllm_priority import BATCH_PRIORITY, deadline_priority, vllm_priority_value
from serving.gateway.workflows import SERVICE_PACE, WorkflowState

log = logging.getLogger(__name__)
MAX_WORKFLOWS = 100000  # workflows remembered (WorkflowState); the least recently seen is forgotten first
__all__ = ["BATCH_PRIORITY", "Gateway", "vllm_priority_value"]


class Gateway:
    def __init__(self, config: GatewayConfig, predictor: StagePredictor | None = None):
        self.config, self.system = config, config.system.resolve()
        self.started_s = time.monotonic()  # the origin of the deadlines sent as vLLM's priority
        kv, limits = config.kv, config.limits
        self.upstream = Upstream(config.upstream.node_timeout_s, config.upstream.connect_timeout_s)
        self.nodes = [
            Node(
                n,
                self.upstream,
                kv_overcommit=kv.overcommit,
                kv_admission=kv.admission,
                decode_rate_margin=kv.decode_rate_margin,
                max_inflight=limits.max_inflight_per_node,
                admission_headroom_frac=self.system.admission_headroom_frac,
            )
            for n in config.nodes
        ]
        self.scheduler_config = config.system.scheduler_config()
        cap = self._make_cap(config)
        self.dispatcher = Dispatcher(
            create_scheduler(self.scheduler_config),
            self.nodes,
            limits.max_queued,
            backfill_depth=limits.backfill_depth,
            backfill_max_overtaken=limits.backfill_max_overtaken,
            recheck_s=limits.admission_recheck_s,
            cap=cap,
            batch_cost=BatchCostGate() if self.system.batch_cost else None,
            router=self.system.router,
        )
        # What each app's workflows needed after each of their stages: a stage's `workflow_remaining_s` where its
        # prediction has no workflow answer, and the tool time ahead of it (fed by record and the sessions' tool
        # phases, as the simulator feeds its own).
        self.remaining_work = RemainingWork()
        self.own_reserves = OwnReserveLevels()  # an unseen app's reserve level from its finished stages (record)
        self.sessions = Sessions(
            self.system.tool_kv,
            config.sessions.idle_s,
            config.sessions.prefill_s_per_token,
            cap,
            on_tool_s=self.remaining_work.observe_tool,  # a tool phase's wall time, as the simulator feeds it
            tool_workers=config.sessions.tool_workers,
        )
        self.pace: ServicePace = SERVICE_PACE  # the unit of a stage's predicted, attained and remaining service
        self.triage = (
            GatewayTriage(self.system.triage_rejects, self.dispatcher, self.sessions.tool_pool)
            if Policy(self.scheduler_config.policy) is Policy.TRIAGE
            else None
        )
        self.predictor = predictor or create_predictor(config.predictor)
        self.traces = TraceWriter(config.traces.dir, config.traces.rotate_lines)
        self.spans = _stage_spans(config.model) if config.server.otel_spans else None
        self.sizer = PromptSizer(kv.chars_per_token, is_calibrated=kv.calibrate_prompt_tokens)
        self.inflight: set[tuple[str, str, str]] = set()
        self.completed: OrderedDict[tuple[str, str, str], bytes | None] = OrderedDict()  # JSON answers, for replays
        self.workflows: OrderedDict[str, WorkflowState] = OrderedDict()
        self._num_workflows_seen = 0
        self.counters = {
            "requests": 0,
            "rejected_invalid": 0,
            "rejected_full": 0,
            "rejected_no_node": 0,
            "rejected_shed": 0,
            "retries": 0,
            "failed": 0,
            "cancelled": 0,
            "replayed": 0,
            "upstream_chunks": 0,
        }
        self.metrics = GatewayMetrics(self)  # GET /metrics: reads the counters above, observes each trace line
        self._poller: asyncio.Task | None = None

    def _make_cap(self, config: GatewayConfig) -> SessionCap | None:
        aimd = AIMDWindow(config.sessions.aimd_config(), config.sessions.tool_workers)
        return SessionWindow.of(self.system.cap, aimd, self.kv_usage)

    def kv_usage(self) -> float:
        """The healthy nodes' KV in use, held session contexts included, as a share of their blocks."""
        nodes = [n for n in self.nodes if n.is_healthy and n.num_blocks]
        total = sum(n.num_blocks for n in nodes)
        return sum(n.num_blocks - n.num_unused_blocks for n in nodes) / total if total else 0.0

    # ---- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Ready the predictor (a local model loaded and warmed, a service checked), then the nodes: the app's
        lifespan runs this before the server takes its first call."""
        await self.predictor.start()
        await self.upstream.start()
        await self.poll_once()
        self._poller = asyncio.create_task(self._poll_loop())
        events.log.info(events.start_line(self))

    async def stop(self) -> None:
        if self._poller:
            self._poller.cancel()
        await self.predictor.aclose()
        await self.upstream.close()
        self.traces.close()

    async def poll_once(self) -> None:
        upstream = self.config.upstream
        await asyncio.gather(
            *(n.poll(upstream.connect_timeout_s, upstream.node_down_after_failed_polls) for n in self.nodes)
        )
        if not any(n.is_healthy for n in self.nodes):
            self.dispatcher.fail_all_queued("no healthy vLLM node: every node failed its /metrics check")
        now = time.monotonic()
        self.sessions.expire(now, busy={workflow_key(*key[:2]) for key in self.inflight})
        self.dispatcher.pump()
        self.dispatcher.adapt_cap(
            CapSignals(
                kv_usage=self.kv_usage(),
                num_tool_jobs=self.sessions.num_in_tool,
                preemptions={n.name: n.num_preemptions for n in self.nodes if n.is_healthy},
            )
        )

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.upstream.metrics_period_s)
            try:
                await self.poll_once()
            except Exception:  # noqa: BLE001 — the poller must outlive any one bad answer
                log.exception("metrics poll failed")

    def mark_failed(self, node: Node) -> None:
        """A forward to this node failed at the transport level: stop sending there until /metrics answers."""
        node.is_healthy = False
        if not any(n.is_healthy for n in self.nodes):
            self.dispatcher.fail_all_queued(f"no healthy vLLM node (last failure: {node.name})")

    # ---- one call ---------------------------------------------------------------------------
    async def prepare(self, meta: StageMeta, body: dict, arrival: Arrival | None = None) -> Job:
        """Predict the stage and size its KV reserve (prepare.py); the Job is ready for `dispatcher.submit`."""
        return await prepare_job(self, meta, body, arrival)

    def workflow_remaining_s(
        self, prediction: Prediction, prompt_tokens: int, workflow_key: str, app: str, position: int
    ) -> float:
        """A stage's predicted work after it: its workflow prediction or what the app's ended workflows needed after
        this position, by the rule the simulator follows too (`remaining_after_s`)."""
        return remaining_after_s(
            prediction.wf_fallback_level,
            lambda: workflow_remaining_s(
                self.pace, prompt_tokens, prediction.wf_remaining_calls, prediction.wf_remaining_tokens
            ),
            self.remaining_work,
            workflow_key,
            app,
            position,
        )

    def turns_away(self, job: Job) -> bool:
        """Workflow triage on a stage that became ready (triage.py); True where the system turns its workflow away,
        which then ends here."""
        if self.triage is None or not self.triage.turns_away(job.request):
            return False
        self.end_workflow(job.meta.workflow_key, completed=False)
        return True

    def end_workflow(self, workflow_key: str, completed: bool) -> None:
        """The workflow ended (its final stage's call, or turned away): its session, history and triage claim end."""
        self.sessions.end(workflow_key)
        self.remaining_work.end(workflow_key, completed=completed)
        if self.triage is not None:
            self.triage.end(workflow_key)

    def served(self, job: Job, work_s: float) -> None:
        """A stage's call ended after `work_s` unloaded seconds: the triage measures the pool's capacity with it."""
        if self.triage is not None:
            wall_s = None if job.started_s is None else self.dispatcher.clock() - job.started_s
            self.triage.served(job.request, work_s, job.was_backlogged, wall_s)

    def output_cap(self, prompt_tokens: int) -> int:
        """A call without max_tokens is sized to, and sent with (forward.forward_body), `default_max_tokens`, less where
        the smallest context of the nodes (their /v1/models `max_model_len`) leaves less room after the prompt's
        estimate: vLLM refuses a call whose prompt + max_tokens exceeds it."""
        lengths = [n.max_model_len for n in self.nodes if n.max_model_len]
        default = self.config.kv.default_max_tokens
        room = min(lengths) - prompt_tokens if lengths else default
        return max(1, min(default, room))

    def vllm_priority(self, job: Job) -> int:
        """vLLM's `priority` (lower first; vLLM also preempts the highest first): the stage's deadline
        (vllm_priority.py: interactive before batch, then the earliest deadline, in ms since the gateway started).

        A stage without a deadline goes after those with one, ranked, under a policy that puts workflows further
        along first (continuum, mars, maestro with attained_weight) or with a workflow cap, by the workflow's arrival
        rank (older first), else by predicted tokens.
        """
        if self.scheduler_config.is_workflow_order or self.dispatcher.cap is not None:
            state = self.workflows.get(job.meta.workflow_key)
            rank = state.seq if state is not None else self._num_workflows_seen
        else:
            rank = min(9999, job.request.tokens_pred)
        return deadline_priority(job.meta.interactive, job.request.deadline_s, self.started_s, rank)

    def workflow(self, workflow_id: str, now: float) -> WorkflowState:
        """The workflow's state (by `StageMeta.workflow_key`), made at its first stage; the least recently seen are
        forgotten beyond MAX_WORKFLOWS."""
        state = self.workflows.get(workflow_id)
        if state is None:
            state = self.workflows[workflow_id] = WorkflowState(now, self._num_workflows_seen)
            self._num_workflows_seen += 1
            while len(self.workflows) > MAX_WORKFLOWS:
                forgotten, _ = self.workflows.popitem(last=False)
                if self.triage is not None:
                    self.triage.end(forgotten)
        else:
            self.workflows.move_to_end(workflow_id)
        return state

    def remember(self, key: tuple[str, str, str], response: bytes | None) -> None:
        self.completed[key] = response
        while len(self.completed) > self.config.limits.completed_cache:
            self.completed.popitem(last=False)

    def record(self, job: Job, body: dict, result: CallResult, node_name: str | None, kv_usage: float | None) -> None:
        """Write the stage's one trace line and feed what its end teaches (record.py)."""
        record_call(self, job, body, result, node_name, kv_usage)

    def readiness(self) -> dict:
        """Whether the gateway should get calls: its predictor is ready (model warmed, service answering) and a
        node is healthy; /ready answers 200 or 503 with this."""
        return {
            "ready": self.predictor.is_ready and any(n.is_healthy for n in self.nodes),
            "predictor_ready": self.predictor.is_ready,
            "healthy_nodes": sum(n.is_healthy for n in self.nodes),
        }

    def status(self) -> dict:
        return {
            "nodes": [n.snapshot() for n in self.nodes],
            "queued": len(self.dispatcher.scheduler),
            "inflight": len(self.inflight),
            "trace_lines": self.traces.num_lines,
            "chars_per_token": round(self.sizer.chars_per_token, 3),
            "dispatched": self.dispatcher.num_dispatched,
            "backfilled": self.dispatcher.num_backfilled,
            "cpu": current_cpu_nice(),
            **self.counters,
            "predictor": self.predictor.snapshot(),
            "sessions": self.sessions.snapshot(),
            **({"triage": self.triage.snapshot()} if self.triage is not None else {}),
        }


def _stage_spans(model: str):
    from serving.gateway.spans import StageSpans  # OpenTelemetry is imported only when spans are on

    return StageSpans(model)
