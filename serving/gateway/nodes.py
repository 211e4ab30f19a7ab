"""One vLLM node as the gateway sees it, and the one admission question it answers: may this stage start here now?

A `Node` composes its KV budget (`kv`, kv_budget.py: reservations, vLLM's measured use, held session contexts), its
pace (`pace`, pace.py: how fast its calls go, from which a stage's KV over time is projected) and what its engine's
/metrics and /v1/models say (`vllm`, vllm_sync.py). `admit` decides once and returns an `Admission`, which the
dispatcher carries in its decision and hands back to `reserve`.

`kv_admission` "peak" admits a stage when its peak (prompt + output) fits in the budget and in vLLM's free blocks at
once; "projected" admits it while, with every running stage growing at the node's pace, the node is never overfilled
before it ends (admission/projection.py). Either way the system's admission headroom (`headroom_pages`, as the
simulator keeps it) stays free: the blocks a stage reserves or takes from vLLM now, and the node's projected peak,
leave it.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from serving.core.admission.projection import GrowingStage, peak_blocks
from serving.core.admission.sizing import headroom_pages
from serving.core.kv import Reservation
from serving.gateway import events
from serving.gateway.config import NodeConfig
from serving.gateway.kv_budget import KVBudget
from serving.gateway.node_pace import DECODE_RATE_MARGIN, NodePace
from serving.gateway.upstream import Upstream
from serving.gateway.vllm_sync import VllmSync

# With fewer stages than this in flight on a node, a new stage is projected from measured streams (pace.py), not from
# the fitted call time, which grows it too fast from dispatch: admission is less conservative on an under-occupied node.
UNDEROCCUPIED_INFLIGHT = 2
KV_ADMISSIONS = ("peak", "projected")  # see the module docstring


class Refusal(str, enum.Enum):
    """Why a stage may not start on a node now."""

    UNAVAILABLE = "unavailable"  # down, or vLLM's block count not known yet
    INFLIGHT = "inflight"  # `max_inflight` stages dispatched there already
    BUDGET = "budget"  # its peak does not fit in the reservation budget
    VLLM_FREE = "vllm_free"  # vLLM has no room for it now (peak), or for its prompt (projected)
    PROJECTED = "projected"  # projected to overfill the node before it ends


COUNTED_REFUSALS = (Refusal.BUDGET, Refusal.VLLM_FREE, Refusal.PROJECTED, Refusal.INFLIGHT)  # in `Node.num_refused`


@dataclass(frozen=True, slots=True)
class Admission:
    """A node's answer for one stage (`Node.admit`): what the decision computed, which `Node.reserve` maps."""

    prompt_tokens: int
    output_tokens: int
    num_blocks: int = 0  # prompt + output in blocks: what the reservation holds (0 when refused before counting)
    peak_blocks: int | None = None  # projected admission: the most blocks the node holds, with it, before it ends
    refusal: Refusal | None = None  # why it may not start (None: it may)

    @property
    def is_admitted(self) -> bool:
        return self.refusal is None


class Node:
    """A vLLM engine behind the gateway."""

    def __init__(
        self,
        config: NodeConfig,
        upstream: Upstream | None,
        kv_overcommit: float = 1.0,
        kv_admission: str = "peak",
        decode_rate_margin: float = DECODE_RATE_MARGIN,
        max_inflight: int = 0,
        admission_headroom_frac: float = 0.0,
    ):
        self.name, self.url, self.upstream = config.name, config.url, upstream
        self.runs_maestro_scheduler = config.maestro_scheduler
        self.has_polled = False  # /metrics asked at least once (a node's first answer is no state change)
        if kv_admission not in KV_ADMISSIONS:
            raise ValueError(f"node {config.name}: kv_admission must be one of {KV_ADMISSIONS}, got {kv_admission!r}")
        self.kv_admission = kv_admission
        self.admission_headroom_frac = admission_headroom_frac  # share of vLLM's blocks admission keeps free
        self.kv = KVBudget(kv_overcommit)
        self.pace = NodePace(decode_rate_margin)
        self.vllm = VllmSync(self.url, upstream, self.kv)
        self.active: dict[int, GrowingStage] = {}  # reservation handle → the stage's KV over time
        self.max_inflight = max_inflight  # stages dispatched here at once (0 = no cap)
        self.running_requests: dict = {}  # StageRequest dispatched here → when (monotonic), for the batch gate
        self.num_refused = {r.value: 0 for r in COUNTED_REFUSALS}  # refusals by reason (`/maestro/status`)
        self.num_inflight = 0  # dispatched by the gateway, not yet finished

    # ---- the one admission question ---------------------------------------------------------
    def admit(
        self, prompt_tokens: int, output_tokens: int, now: float | None = None, count_refusal: bool = True
    ) -> Admission:
        """Whether a stage may start here now (`Admission.refusal` None), and what that decision computed; a refusal
        is counted by its reason unless `count_refusal` is False (a what-if, not an admission decision)."""
        admission = self._decide(prompt_tokens, output_tokens, time.monotonic() if now is None else now)
        if count_refusal and admission.refusal in COUNTED_REFUSALS:
            self.num_refused[admission.refusal.value] += 1
        return admission

    def _decide(self, prompt_tokens: int, output_tokens: int, now: float) -> Admission:
        kv = self.kv
        if not self.is_healthy or kv.allocator is None:
            return Admission(prompt_tokens, output_tokens, refusal=Refusal.UNAVAILABLE)
        if self.max_inflight and self.num_inflight >= self.max_inflight:
            return Admission(prompt_tokens, output_tokens, refusal=Refusal.INFLIGHT)
        num_blocks, headroom = kv.blocks_for(prompt_tokens + output_tokens), self.headroom_blocks
        if num_blocks + headroom > kv.num_unreserved_blocks:
            return Admission(prompt_tokens, output_tokens, num_blocks, refusal=Refusal.BUDGET)
        if self.kv_admission == "peak":
            fits = num_blocks + headroom <= kv.num_unused_blocks
            return Admission(prompt_tokens, output_tokens, num_blocks, refusal=None if fits else Refusal.VLLM_FREE)
        if kv.blocks_for(prompt_tokens) + headroom > kv.num_unused_blocks:
            return Admission(prompt_tokens, output_tokens, num_blocks, refusal=Refusal.VLLM_FREE)
        peak = self.projected_peak_blocks(prompt_tokens, output_tokens, now)
        return Admission(
            prompt_tokens,
            output_tokens,
            num_blocks,
            peak,
            refusal=None if peak + headroom <= kv.num_blocks else Refusal.PROJECTED,
        )

    @property
    def headroom_blocks(self) -> int:
        """Blocks admission keeps free here (the system's `admission_headroom_frac` of vLLM's blocks)."""
        return headroom_pages(self.admission_headroom_frac, self.kv.num_blocks)

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether a stage of `num_tokens` could start here with nothing else running (the headroom kept free)."""
        kv = self.kv
        return kv.allocator is not None and kv.blocks_for(num_tokens) + self.headroom_blocks <= kv.num_blocks

    def projected_peak_blocks(self, prompt_tokens: int, output_tokens: int, now: float) -> int:
        """The most blocks the running stages and this one, starting now, are projected to hold at once."""
        candidate = self.pace.project(
            prompt_tokens, output_tokens, now, from_streams=self.num_inflight < UNDEROCCUPIED_INFLIGHT
        )
        measured = (self.kv.num_blocks - self.kv.num_unused_blocks, self.vllm.metrics_asked_s)
        return peak_blocks(
            list(self.active.values()),
            candidate,
            now,
            self.pace.decode_tokens_per_s,
            self.kv.block_size,
            self.pace.call_overhead_s,
            measured,
        )

    def reserve(self, admission: Admission) -> Reservation | None:
        """Map an admitted stage's blocks; None when they no longer fit (the node changed since `admit`)."""
        if not admission.is_admitted:
            raise ValueError(f"node {self.name}: reserve() of a refused admission ({admission.refusal.value})")
        reservation = self.kv.reserve(admission.prompt_tokens + admission.output_tokens)
        if reservation is not None:
            self.active[reservation.handle] = self.pace.project(
                admission.prompt_tokens, admission.output_tokens, time.monotonic()
            )
        return reservation

    def release(self, reservation: Reservation | None) -> None:
        if reservation is None or self.kv.allocator is None or reservation.virtual_pages < 0:
            return
        self.active.pop(reservation.handle, None)
        self.kv.release(reservation)

    # ---- its engine, as other parts of the gateway see it ------------------------------------
    async def poll(self, timeout_s: float, down_after_failed_polls: int = 1) -> bool:
        """Ask vLLM's /metrics (`VllmSync.poll`; busy while stages are in flight here); returns the node's health."""
        was_healthy, is_first = self.vllm.is_healthy, not self.has_polled
        is_healthy = await self.vllm.poll(timeout_s, down_after_failed_polls, is_busy=self.num_inflight > 0)
        self.has_polled = True
        if is_healthy != was_healthy and not is_first:  # (the first poll's answer is in the gateway's start line)
            why = "its /metrics answers" if is_healthy else "its /metrics poll failed"
            events.node_changed(self.name, self.url, is_healthy, why)
        return is_healthy

    def apply_metrics(self, samples: dict[str, tuple[dict, float]], asked_s: float | None = None) -> None:
        self.vllm.apply_metrics(samples, asked_s)

    @property
    def is_healthy(self) -> bool:
        return self.vllm.is_healthy

    @is_healthy.setter
    def is_healthy(self, is_healthy: bool) -> None:  # a failed forward marks it down until /metrics answers
        if is_healthy != self.vllm.is_healthy:
            why = "marked up" if is_healthy else "a call to it failed"
            events.node_changed(self.name, self.url, is_healthy, why)
        self.vllm.is_healthy = is_healthy

    @property
    def num_preemptions(self) -> int:
        return self.vllm.num_preemptions

    @property
    def max_model_len(self) -> int | None:
        return self.vllm.max_model_len

    @property
    def kv_usage(self) -> float:
        return self.kv.kv_usage

    @property
    def num_blocks(self) -> int:
        return self.kv.num_blocks

    @property
    def num_unused_blocks(self) -> int:
        return self.kv.num_unused_blocks

    def hold(self, key: str, num_tokens: int) -> bool:
        """A session's context held during its tool call (`KVBudget.hold`)."""
        return self.kv.hold(key, num_tokens)

    def unhold(self, key: str) -> None:
        self.kv.unhold(key)

    def observe_decode(self, output_tokens: int, seconds: float) -> None:
        self.pace.observe_decode(output_tokens, seconds)

    def observe_stream(self, first_token_delay_s: float, output_tokens: int, decode_s: float) -> None:
        self.pace.observe_stream(first_token_delay_s, output_tokens, decode_s)

    def snapshot(self) -> dict:
        vllm = self.vllm
        return {
            "name": self.name,
            "url": self.url,
            "healthy": vllm.is_healthy,
            "num_blocks": self.kv.num_blocks,
            "num_free_blocks": self.kv.num_free_blocks,
            "kv_usage": round(self.kv.kv_usage, 4),
            "running": vllm.num_running,
            "waiting": vllm.num_waiting,
            "inflight": self.num_inflight,
            "preemptions": vllm.num_preemptions,
            "refused": dict(self.num_refused),
            **self.pace.snapshot(),
            "failed_polls": vllm.num_failed_polls,
            "max_model_len": vllm.max_model_len,
            "slow_polls": vllm.num_slow_polls,
            "held_blocks": sum(self.kv.held.values()),
        }
