"""One vLLM node as the gateway sees it: the upstream it is reached through, its KV budget and what `/metrics` last said.

The KV budget is counted in vLLM blocks: a host-backend `KVAllocator` whose page is one block
(`block_size` tokens, one "byte" per token) holds the gateway's reservations; `/metrics` gives
vLLM's own view (`vllm:kv_cache_usage_perc`, `num_gpu_blocks` from `vllm:cache_config_info`).
Free blocks = total − max(reserved by the gateway, used according to vLLM), so traffic that
bypasses the gateway still counts.
"""
from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import replace

from serving.gateway.config import NodeConfig
from serving.gateway.upstream import Upstream
from serving.gateway.vllm_sync import VllmSync
from serving.admission.projection import CallTimeFit, GrowingStage, peak_blocks
from serving.kv import KVAllocator, Reservation

INITIAL_DECODE_TOKENS_PER_S = 10.0  # slow on purpose: until measured, projections assume stages overlap long
DECODE_RATE_WEIGHT = 0.2  # EWMA weight of each finished stage's pace (the first one is taken as it is)
MIN_PROGRESS_TOKENS = 8  # a stage's own pace is used once it streamed this many tokens (else the node's)
MIN_PROGRESS_S = 0.05  # a pace is taken from a stream only over at least this long (chunks read in one go: none)
MIN_STREAMS = 8  # streamed calls measured before new stages are projected from those measures
DECODE_RATE_MARGIN = 0.8  # default: project 20 % slower than measured (a slower stage than projected risks preemption)
# (the pace is used until `CallTimeFit` can split a call's time into overhead + output / rate; then that is)


class Node(VllmSync):
    """A vLLM engine behind the gateway."""

    def __init__(self, config: NodeConfig, upstream: Upstream | None, kv_overcommit: float = 1.0,
                 kv_admission: str = "peak", decode_rate_margin: float = DECODE_RATE_MARGIN, use_progress: bool = False,
                 underoccupied_inflight: int = 0, handover_lead_s: float = 0.0, max_inflight: int = 0):
        self.name, self.url, self.upstream = config.name, config.url, upstream
        self.runs_maestro_scheduler = config.maestro_scheduler
        self.kv_overcommit, self.kv_admission, self.decode_rate_margin = kv_overcommit, kv_admission, decode_rate_margin
        self.active: dict[int, GrowingStage] = {}  # reservation handle → the stage's KV over time
        self.use_progress = use_progress  # project running stages from their streamed progress
        # With fewer than this many stages in flight, a new stage is projected from measured streams (as with
        # use_progress), not from the fitted call time, which grows it ~3× too fast from dispatch (0 = never).
        self.underoccupied_inflight = underoccupied_inflight
        # A stage that fits only once the running stage projected to end first has ended, and whose prompt vLLM has no
        # room for until then, is sent this long before that end: it waits in vLLM's queue, which starts it within a
        # step of the end, instead of after vLLM's answer reached the gateway and the next stage reached vLLM (0 = off).
        self.handover_lead_s = handover_lead_s
        self.num_ahead = 0  # stages sent ahead of a running stage's end
        self.max_inflight = max_inflight  # stages dispatched here at once (0 = no cap)
        self.recent_streams: deque[tuple[float, float]] = deque(maxlen=32)  # (first token delay, pace) of streams
        self.first_token_delay_s = 0.0  # dispatch → first streamed token, median of recent streams
        self.stage_tokens_per_s = 0.0  # one stage's pace while streaming, median of recent streams
        self.num_streams_observed = 0
        self.decode_tokens_per_s = INITIAL_DECODE_TOKENS_PER_S  # projected, per stage, learned from finished stages
        self.call_overhead_s = 0.0  # projected fixed time of a call besides its decoding
        self.mean_pace = 0.0  # output tokens / call time, EWMA
        self.recent_paces: deque[float] = deque(maxlen=64)  # output tokens / call time of the last calls
        self.running_requests: dict = {}  # StageRequest dispatched here → when (monotonic): Maestro's batch gate reads it
        self.num_paces_observed = 0
        self.call_fit = CallTimeFit()
        self.num_refused = {"budget": 0, "vllm_free": 0, "projected": 0, "inflight": 0}  # why `can_fit` said no
        self.is_healthy = False
        self.allocator: KVAllocator | None = None
        self.block_size = 16
        self.kv_usage = 0.0
        self.held: dict[str, int] = {}  # session → blocks held for it during a tool call (hold)
        self.num_running = 0
        self.num_waiting = 0
        self.num_preemptions = 0
        self.num_inflight = 0  # dispatched by the gateway, not yet finished
        self.metrics_asked_s = float("-inf")  # when the /metrics now in use was asked for (monotonic)
        self.num_failed_polls = 0  # in a row
        self.num_slow_polls = 0  # timed out while stages were in flight: busy, not down
        self.models: list[str] = []
        # vLLM's max_model_len (prompt + output), from /v1/models once the node is up; None where it reports none
        self.max_model_len: int | None = None
        self.has_listed_models = False  # /v1/models answered since the node (re)started
        self.num_vllm_blocks = 0

    # ---- KV budget ------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.num_vllm_blocks if self.allocator else 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new stage may reserve: room in the (overcommitted) reservation budget and in vLLM right now."""
        return min(self.num_unreserved_blocks, self.num_unused_blocks) if self.allocator else 0

    @property
    def num_unreserved_blocks(self) -> int:
        return self.allocator.num_physical_pages - self.allocator.backend.num_mapped_pages if self.allocator else 0

    @property
    def num_unused_blocks(self) -> int:
        """Free according to vLLM's last /metrics (less what finished since), less the blocks held for sessions in a
        tool call (`hold`)."""
        return self.num_blocks - math.ceil(self.kv_usage * self.num_blocks) - sum(self.held.values())

    def hold(self, key: str, num_tokens: int) -> bool:
        """Count a session's context as used while its tool runs (gateway/sessions.py), so that no stage is admitted
        into it and vLLM's prefix cache keeps it; False (nothing held) where it does not fit in the free blocks."""
        num_blocks = self.blocks_for(num_tokens)
        if self.allocator is None or num_blocks > self.num_unused_blocks:
            return False
        self.held[key] = num_blocks
        return True

    def unhold(self, key: str) -> None:
        self.held.pop(key, None)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_fit(self, prompt_tokens: int, output_tokens: int) -> bool:
        """Whether a stage may start here now; a refusal is counted by its reason (`/maestro/status`)."""
        return self.check(prompt_tokens, output_tokens) is None

    def check(self, prompt_tokens: int, output_tokens: int) -> str | None:
        """Why a stage may not start here now (None: it may), the refusal counted by its reason."""
        reason, _ = self._decide(prompt_tokens, output_tokens)
        self._count_refusal(reason)
        return reason

    def would_fit(self, prompt_tokens: int, output_tokens: int) -> bool:
        """`can_fit` without counting a refusal (a what-if, not an admission decision)."""
        return self.refusal(prompt_tokens, output_tokens) is None

    def _admit(self, prompt_tokens: int, output_tokens: int) -> float | None:
        """When an admitted stage is projected to start (now, or a running stage's end when sent ahead); None,
        with the refusal counted by its reason, when it may not start here now."""
        reason, start_s = self._decide(prompt_tokens, output_tokens)
        self._count_refusal(reason)
        return start_s

    def _count_refusal(self, reason: str | None) -> None:
        if reason is not None and reason in self.num_refused:
            self.num_refused[reason] += 1

    def refusal(self, prompt_tokens: int, output_tokens: int) -> str | None:
        """Why a stage may not start here now (None: it may), counting nothing."""
        return self._decide(prompt_tokens, output_tokens)[0]

    def _decide(self, prompt_tokens: int, output_tokens: int) -> tuple[str | None, float | None]:
        """(refusal reason, None) or (None, projected start): `kv_admission` is peak reserved at once, or
        projected over time."""
        now = time.monotonic()
        if not self.is_healthy or self.allocator is None:
            return "unavailable", None
        if self.max_inflight and self.num_inflight >= self.max_inflight:
            return "inflight", None
        num_blocks = self.blocks_for(prompt_tokens + output_tokens)
        if num_blocks > self.num_unreserved_blocks:
            return "budget", None
        if self.kv_admission == "peak":
            return (None, now) if num_blocks <= self.num_unused_blocks else ("vllm_free", None)
        measured = (self.num_blocks - self.num_unused_blocks, self.metrics_asked_s)
        from_streams = self.num_inflight < self.underoccupied_inflight
        if self.blocks_for(prompt_tokens) > self.num_unused_blocks:
            reason = "vllm_free"
        else:
            candidate = self.new_stage(prompt_tokens, output_tokens, now, from_streams=from_streams)
            peak = peak_blocks(list(self.active.values()), candidate, now, self.decode_tokens_per_s, self.block_size,
                               self.call_overhead_s, measured)
            if peak <= self.num_blocks:
                return None, now
            reason = "projected"
        start_s = self.ahead_start(prompt_tokens, output_tokens, now, measured, from_streams)
        return (reason, None) if start_s is None else (None, start_s)

    def ahead_start(self, prompt_tokens: int, output_tokens: int, now: float, measured: tuple[int, float],
                    from_streams: bool = False) -> float | None:
        """When a stage that does not fit now may be sent ahead (`handover_lead_s`): the projected end of the running
        stage that ends first, if that is within the lead, vLLM has no room for the stage's prompt now (so it cannot
        start it before a stage ends), and the stage fits from that end on without it; else None."""
        if self.handover_lead_s <= 0 or not self.active or self.blocks_for(prompt_tokens) <= self.num_unused_blocks:
            return None
        ends = {h: s.end_s(self.decode_tokens_per_s, self.call_overhead_s) for h, s in self.active.items()}
        first = min(ends, key=ends.get)
        end_s = ends[first]
        if not now <= end_s <= now + self.handover_lead_s:
            return None  # (a stage already past its projected end is not known to end soon)
        others = [s for h, s in self.active.items() if h != first]
        candidate = self.new_stage(prompt_tokens, output_tokens, end_s, from_streams=from_streams)
        peak = peak_blocks(others, candidate, end_s, self.decode_tokens_per_s, self.block_size, self.call_overhead_s,
                           measured)
        return end_s if peak <= self.num_blocks else None

    def observe_decode(self, output_tokens: int, seconds: float) -> None:
        """A finished stage's call time: the fitted overhead + rate once there is a fit, else the mean pace."""
        if output_tokens < 8 or seconds <= 0:
            return
        weight = DECODE_RATE_WEIGHT if self.num_paces_observed else 1.0
        self.mean_pace += weight * (output_tokens / seconds - self.mean_pace)
        self.recent_paces.append(output_tokens / seconds)
        self.num_paces_observed += 1
        self.call_fit.observe(output_tokens, seconds)
        overhead_s, tokens_per_s = self.call_fit.solve() or (0.0, self.mean_pace)
        self.call_overhead_s = overhead_s / self.decode_rate_margin
        self.decode_tokens_per_s = tokens_per_s * self.decode_rate_margin

    def new_stage(self, prompt_tokens: int, output_tokens: int, now: float, from_streams: bool = False) -> GrowingStage:
        """A stage starting now. Once streamed calls measured it (with `use_progress`, or `from_streams`): its first
        token after the node's measured delay (× margin: early) at the measured per-stage pace (× margin: slow), as
        if that progress had been streamed; before: the fitted call time (the overhead as if after decoding, the
        rate from whole calls)."""
        if not (self.use_progress or from_streams) or self.num_streams_observed < MIN_STREAMS:
            return GrowingStage(prompt_tokens, output_tokens, now)
        return GrowingStage(prompt_tokens, output_tokens, now, tokens_done=0,
                            progress_s=now + self.first_token_delay_s * self.decode_rate_margin,
                            tokens_per_s=self.stage_tokens_per_s * self.decode_rate_margin)

    def observe_stream(self, first_token_delay_s: float, output_tokens: int, decode_s: float) -> None:
        """A finished streamed call: dispatch → first token, and its own pace after (medians of the last 32: under CPU
        starvation a stream is sometimes read in one go, and one such pace, 10⁵ tokens/s, would swamp a mean)."""
        if output_tokens < MIN_PROGRESS_TOKENS or decode_s < MIN_PROGRESS_S or first_token_delay_s < 0:
            return  # a stream read in one go (the gateway or vLLM's frontend starved): no pace in it
        self.recent_streams.append((first_token_delay_s, (output_tokens - 1) / decode_s))
        self.first_token_delay_s = statistics.median(d for d, _ in self.recent_streams)
        self.stage_tokens_per_s = statistics.median(r for _, r in self.recent_streams)
        self.num_streams_observed += 1

    def observe_progress(self, reservation: Reservation | None, tokens_done: int, first_token_s: float | None,
                         max_tokens: int, now: float | None = None) -> None:
        """A running stage's streamed progress (vLLM's completion_tokens so far): projected from it from now on."""
        stage = self.active.get(reservation.handle) if reservation is not None else None
        if stage is None or not self.use_progress:
            return
        now = time.monotonic() if now is None else now
        rate = None
        if first_token_s is not None and tokens_done >= MIN_PROGRESS_TOKENS and now - first_token_s >= MIN_PROGRESS_S:
            rate = (tokens_done - 1) / (now - first_token_s) * self.decode_rate_margin
        # Past its reserve (the prediction was short), it may go on to max_tokens: project that.
        output = stage.output_tokens if tokens_done < stage.output_tokens else max(tokens_done, max_tokens)
        self.active[reservation.handle] = replace(stage, output_tokens=output, tokens_done=tokens_done,
                                                  progress_s=now, tokens_per_s=rate)

    def can_ever_fit(self, num_tokens: int) -> bool:
        return self.allocator is not None and self.blocks_for(num_tokens) <= self.num_blocks

    def reserve(self, prompt_tokens: int, output_tokens: int) -> Reservation | None:
        start_s = self._admit(prompt_tokens, output_tokens)
        if start_s is None:
            return None
        num_tokens = prompt_tokens + output_tokens
        reservation = self.allocator.reserve(num_tokens, num_tokens, 1)
        if reservation is not None:
            now = time.monotonic()
            self.num_ahead += start_s > now
            self.active[reservation.handle] = self.new_stage(prompt_tokens, output_tokens, max(now, start_s))
        return reservation

    def release(self, reservation: Reservation | None) -> None:
        if reservation is None or self.allocator is None or reservation.virtual_pages < 0:
            return
        num_blocks = reservation.mapped_pages
        self.active.pop(reservation.handle, None)
        self.allocator.release(reservation)
        # vLLM frees a finished request's blocks at once; its last /metrics (up to metrics_period_s old) still
        # counts them, and would hold the next stage back until the next poll. Take them off until then.
        self.kv_usage = max(0.0, self.kv_usage - num_blocks / max(1, self.num_blocks))

    def snapshot(self) -> dict:
        return {"name": self.name, "url": self.url, "healthy": self.is_healthy, "num_blocks": self.num_blocks,
                "num_free_blocks": self.num_free_blocks, "kv_usage": round(self.kv_usage, 4),
                "running": self.num_running, "waiting": self.num_waiting, "inflight": self.num_inflight,
                "preemptions": self.num_preemptions, "refused": dict(self.num_refused),
                "call_overhead_s": round(self.call_overhead_s, 3), "decode_tokens_per_s": round(self.decode_tokens_per_s, 1),
                "first_token_delay_s": round(self.first_token_delay_s, 3),
                "stage_tokens_per_s": round(self.stage_tokens_per_s, 1), "streams_observed": self.num_streams_observed,
                "sent_ahead": self.num_ahead, "failed_polls": self.num_failed_polls, "max_model_len": self.max_model_len,
                "slow_polls": self.num_slow_polls, "held_blocks": sum(self.held.values())}
