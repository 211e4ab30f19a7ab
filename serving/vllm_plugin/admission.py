"""Admission of the requests that carry a prediction, inside vLLM's waiting loop (scheduler.py).

vLLM asks `_handle_blocked_waiting_request(request)` of each waiting request before it tries to start it; False skips
the request for this step. `PredictedAdmission` answers there for a predicted request, after vLLM's own check: it starts
only if the pool's room lets it, by `MaestroSchedulerConfig.admission`: "hold", where the KV of the running predicted
requests and its own, projected forward (`serving.core.admission.projection`), fits in what they hold plus the free
blocks and the blocks held for other sessions (session_kv.py); "vllm", always (vLLM's allocation decides, and its
preemption makes room, victims.py); "adaptive", where it fits or holding it back does not pay (adaptive.py); no other
request is overdue (wait_bound.py) and the system's batch-cost gate (`serving.core.admission.batch_cost`) lets it join
the batch.
It is a base of `MaestroMixin`, whose `__init__` sets what it reads: `hints`, `session_hints`, `decisions`,
`hold_bound`, `session_holds`, `batch_gate`, `progress`, `engine_pace`, `maestro_config` and the `MaestroRequestQueue`
(its `now`).
"""

from __future__ import annotations

from vllm.v1.request import Request

from serving.core.admission.batch_cost import Candidate, NodeState
from serving.core.admission.projection import GrowingStage
from serving.vllm_plugin.adaptive import (
    HoldWeighing,
    RunningRoom,
    dropped_tokens,
    fits_at,
    wait_for_room_tokens,
    weigh_hold,
)
from serving.vllm_plugin.engine_pace import gate_candidate
from serving.vllm_plugin.hints import MaestroHints


class PredictedAdmission:
    """Admission by predicted KV need, the wait bound and the batch-cost gate, over one of vLLM's scheduler classes
    (through `MaestroMixin`); a request without hints is admitted as vLLM would admit it."""

    def _handle_blocked_waiting_request(self, request: Request) -> bool:
        """vLLM's own check, then admission: a predicted request starts only if the pool's room lets it
        (`_room_admits`, by the configured admission), no other request is overdue (wait_bound.py) and the
        batch-cost gate lets it in; with nothing running it starts, as vLLM would start it."""
        if not super()._handle_blocked_waiting_request(request):
            return False
        hints = self.hints.get(request.request_id)
        if hints is None or not self.running:
            return True
        if (
            not self.hold_bound.is_blocked(request.request_id)
            and self._room_admits(request, hints)
            and self._gate_admits(request, hints)
        ):
            return True
        self.decisions.hold_back(request.request_id)
        self.decisions.num_overdue += self.hold_bound.hold(request.request_id, self.waiting.now)
        return False

    def _room_admits(self, request: Request, hints: MaestroHints) -> bool:
        """Whether the pool's room lets the request start, by `MaestroSchedulerConfig.admission`: "vllm", always (vLLM's
        own allocation decides, and its preemption makes room); "hold", when its footprint fits (`_room`); "adaptive",
        when it fits or where holding it back does not pay (adaptive.py), each way counted."""
        admission = self.maestro_config.admission
        if admission == "vllm":
            return True
        room = self._room(request, hints)
        if fits_at(*room, self.block_size, tokens_later=0):
            return True
        if admission == "hold":
            return False
        is_hold = self._weigh_hold(request, *room).is_hold
        self.decisions.num_adaptive_held += is_hold
        self.decisions.num_adaptive_admitted += not is_hold
        return not is_hold

    def _room(self, request: Request, hints: MaestroHints) -> tuple[list[RunningRoom], GrowingStage, int]:
        """The running predicted requests and the candidate as the KV projection reads them (each running one holds
        its prompt and what it produced, and grows a token a step to its reserve; the candidate is admitted when, so
        projected until it ends, they stay within the blocks they may hold), and those blocks: what the running ones
        hold plus the free blocks and the blocks held for other sessions (released first when needed)."""
        running = [r for r in self.running if r.request_id in self.hints]
        shared_tokens = self._num_shared_hit_blocks(request) * self.block_size
        # A resumed (preempted) request starts again from its prompt and what it had produced.
        candidate = GrowingStage(
            prompt_tokens=max(request.num_tokens - shared_tokens, 0),
            start_s=0.0,
            output_tokens=self._output_tokens_at_end(request, hints) - request.num_output_tokens,
        )
        # A running request holds its prompt and what it produced, and grows a token a step from now to its end.
        rooms = [
            RunningRoom(
                held_tokens=r.num_prompt_tokens + r.num_output_tokens,
                growth_tokens=max(0, self._output_tokens_at_end(r, self.hints[r.request_id]) - r.num_output_tokens),
                remaining_tokens=self.progress.remaining_tokens(r, self.hints[r.request_id]),
            )
            for r in running
        ]
        held = sum(len(self.kv_cache_manager.get_block_ids(r.request_id)[0]) for r in running)
        hint = self.session_hints.get(request.request_id)
        releasable = self.session_holds.num_releasable_blocks(hint.session if hint else None)
        return rooms, candidate, held + self.kv_cache_manager.block_pool.get_num_free_blocks() + releasable

    def _weigh_hold(
        self, request: Request, running: list[RunningRoom], candidate: GrowingStage, capacity_blocks: int
    ) -> HoldWeighing:
        """Admission "adaptive" for a request whose footprint does not fit: the tokens the preemption that admitting
        it would likely cause drops (those of the request the victim rule ranks first among the running ones and it)
        at `prefill_s_per_token`, against its predicted wait for room at the measured decode pace (adaptive.py)."""
        wait_tokens = wait_for_room_tokens(running, candidate, capacity_blocks, self.block_size)
        victim_tokens = {r.request_id: r.num_tokens for r in self.running}
        victim_tokens[request.request_id] = request.num_tokens
        dropped = dropped_tokens(self.victim_ranks(request), victim_tokens.__getitem__)
        decode_s_per_token = self.engine_pace.pace_s_per_token or self.maestro_config.decode_s_per_token
        return weigh_hold(dropped, self.maestro_config.prefill_s_per_token, wait_tokens, decode_s_per_token)

    def _gate_admits(self, request: Request, hints: MaestroHints) -> bool:
        """Whether the system's batch-cost gate (if it has one) lets the request join the running batch; a refusal
        is counted."""
        if self.batch_gate is None:
            return True
        is_ok = self.batch_gate.admits_candidate(*self.gate_view(request, hints))
        self.decisions.num_batch_cost_refused += not is_ok
        return is_ok

    def gate_view(self, request: Request, hints: MaestroHints) -> tuple[NodeState, Candidate]:
        """The engine and the request as the batch-cost gate reads them: the predicted running requests (their hints,
        arrival, tokens so far) and the engine's measured pace (engine_pace.py)."""
        running = [
            (
                r.request_id,
                self.hints[r.request_id],
                r.arrival_time,
                r.num_output_tokens,
                self.progress.prefix(r.request_id, r.output_token_ids),
            )
            for r in self.running
            if r.request_id in self.hints
        ]
        return (
            self.engine_pace.node_state(self.waiting.now, running, self.progress.table),
            gate_candidate(hints, request.arrival_time, request.num_output_tokens),
        )

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
        tokens = self.progress.footprint_tokens(request, hints)
        return min(tokens, self.max_model_len) - request.num_prompt_tokens
