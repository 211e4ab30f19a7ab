"""Admission of the requests that carry a prediction, inside vLLM's waiting loop (scheduler.py).

vLLM asks `_handle_blocked_waiting_request(request)` of each waiting request before it tries to start it; False skips
the request for this step. `PredictedAdmission` answers there for a predicted request, after vLLM's own check: it starts
only if the KV of the running predicted requests and its own, projected forward (`serving.core.admission.projection`),
fits in what they hold plus the free blocks and the blocks held for other sessions (session_kv.py) (unless the plugin is
`preemptive`: then vLLM's allocation alone decides, victims.py), no other request is overdue (wait_bound.py) and the
system's batch-cost gate (`serving.core.admission.batch_cost`) lets it join the batch.
It is a base of `MaestroMixin`, whose `__init__` sets what it reads: `hints`, `session_hints`, `decisions`,
`hold_bound`, `session_holds`, `batch_gate`, `progress`, `engine_pace`, `maestro_config` and the `MaestroRequestQueue`
(its `now`).
"""

from __future__ import annotations

from vllm.v1.request import Request

from serving.core.admission.batch_cost import Candidate, NodeState
from serving.core.admission.projection import GrowingStage, peak_blocks
from serving.vllm_plugin.engine_pace import gate_candidate
from serving.vllm_plugin.hints import MaestroHints


class PredictedAdmission:
    """Admission by predicted KV need, the wait bound and the batch-cost gate, over one of vLLM's scheduler classes
    (through `MaestroMixin`); a request without hints is admitted as vLLM would admit it."""

    def _handle_blocked_waiting_request(self, request: Request) -> bool:
        """vLLM's own check, then admission: a predicted request starts only if its predicted KV need and the running
        requests' still fit in the free blocks (not asked when `preemptive`: vLLM's own allocation decides, and its
        preemption makes room), no other request is overdue (wait_bound.py) and the batch-cost gate lets it in; with
        nothing running it starts, as vLLM would start it."""
        if not super()._handle_blocked_waiting_request(request):
            return False
        hints = self.hints.get(request.request_id)
        if hints is None or not self.running:
            return True
        if (
            not self.hold_bound.is_blocked(request.request_id)
            and (self.maestro_config.preemptive or self._fits(request, hints))
            and self._gate_admits(request, hints)
        ):
            return True
        self.decisions.hold_back(request.request_id)
        self.decisions.num_overdue += self.hold_bound.hold(request.request_id, self.waiting.now)
        return False

    def _fits(self, request: Request, hints: MaestroHints) -> bool:
        """Whether the blocks that the running predicted requests and this one hold at once, each growing a token a
        step to its reserve (`serving.core.admission.projection`), stay within what those requests hold plus the free
        blocks and the blocks held for other sessions (released first when needed), from now until this one ends."""
        running = [r for r in self.running if r.request_id in self.hints]
        shared_tokens = self._num_shared_hit_blocks(request) * self.block_size
        # A resumed (preempted) request starts again from its prompt and what it had produced.
        candidate = GrowingStage(
            prompt_tokens=max(request.num_tokens - shared_tokens, 0),
            start_s=0.0,
            output_tokens=self._output_tokens_at_end(request, hints) - request.num_output_tokens,
        )
        # A running request holds its prompt and what it produced, and grows a token a step from now to its end.
        growing = [
            GrowingStage(
                prompt_tokens=r.num_prompt_tokens + r.num_output_tokens,
                start_s=0.0,
                first_token_s=0.0,
                output_tokens=max(0, self._output_tokens_at_end(r, self.hints[r.request_id]) - r.num_output_tokens),
                tokens_per_s=1.0,
            )
            for r in running
        ]
        held = sum(len(self.kv_cache_manager.get_block_ids(r.request_id)[0]) for r in running)
        peak = peak_blocks(growing, candidate, now_s=0.0, tokens_per_s=1.0, block_size=self.block_size)
        hint = self.session_hints.get(request.request_id)
        releasable = self.session_holds.num_releasable_blocks(hint.session if hint else None)
        return peak <= held + self.kv_cache_manager.block_pool.get_num_free_blocks() + releasable

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
