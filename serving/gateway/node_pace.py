"""A node's pace, learnt from its calls: how a stage's KV will grow there over time (admission/projection.py).

Finished calls give the call time as a fixed overhead plus output / decode rate (`CallTimeFit`; one mean pace until
the fit can tell the two apart); streamed calls give the delay to the first token and one stage's own pace after it
(medians of the last 32: under CPU starvation a stream is sometimes read in one go, and one such pace, 10⁵ tokens/s,
would swamp a mean). Both are projected `decode_rate_margin` slower than measured: a stage slower than projected
risks a preemption, one faster only leaves blocks idle a little longer.
"""

from __future__ import annotations

import statistics
from collections import deque

from serving.core.admission.projection import CallTimeFit, GrowingStage

INITIAL_DECODE_TOKENS_PER_S = 10.0  # slow on purpose: until measured, projections assume stages overlap long
DECODE_RATE_WEIGHT = 0.2  # EWMA weight of each finished call's pace (the first one is taken as it is)
MIN_PACE_TOKENS = 8  # a call or stream shorter than this says nothing of the pace
MIN_STREAM_S = 0.05  # a pace is taken from a stream only over at least this long (chunks read in one go: none)
MIN_STREAMS = 8  # streamed calls measured before new stages are projected from those measures
DECODE_RATE_MARGIN = 0.8  # default: project 20 % slower than measured


class NodePace:
    """One node's measured pace (see the module docstring)."""

    def __init__(self, decode_rate_margin: float = DECODE_RATE_MARGIN):
        self.decode_rate_margin = decode_rate_margin
        self.decode_tokens_per_s = INITIAL_DECODE_TOKENS_PER_S  # projected, per stage
        self.call_overhead_s = 0.0  # projected fixed time of a call besides its decoding
        self.mean_pace = 0.0  # output tokens / call time, EWMA
        self.recent_paces: deque[float] = deque(maxlen=64)  # output tokens / call time of the last calls
        self.num_paces_observed = 0
        self.call_fit = CallTimeFit()
        self.recent_streams: deque[tuple[float, float]] = deque(maxlen=32)  # (first token delay, pace) of streams
        self.first_token_delay_s = 0.0  # dispatch → first streamed token, median of recent streams
        self.stage_tokens_per_s = 0.0  # one stage's pace while streaming, median of recent streams
        self.num_streams_observed = 0

    def observe_decode(self, output_tokens: int, seconds: float) -> None:
        """A finished call's time: the fitted overhead + rate once there is a fit, else the mean pace."""
        if output_tokens < MIN_PACE_TOKENS or seconds <= 0:
            return
        weight = DECODE_RATE_WEIGHT if self.num_paces_observed else 1.0
        self.mean_pace += weight * (output_tokens / seconds - self.mean_pace)
        self.recent_paces.append(output_tokens / seconds)
        self.num_paces_observed += 1
        self.call_fit.observe(output_tokens, seconds)
        overhead_s, tokens_per_s = self.call_fit.solve() or (0.0, self.mean_pace)
        self.call_overhead_s = overhead_s / self.decode_rate_margin
        self.decode_tokens_per_s = tokens_per_s * self.decode_rate_margin

    def observe_stream(self, first_token_delay_s: float, output_tokens: int, decode_s: float) -> None:
        """A finished streamed call: dispatch → first token, and its own pace after."""
        if output_tokens < MIN_PACE_TOKENS or decode_s < MIN_STREAM_S or first_token_delay_s < 0:
            return  # a stream read in one go (the gateway or vLLM's frontend starved): no pace in it
        self.recent_streams.append((first_token_delay_s, (output_tokens - 1) / decode_s))
        self.first_token_delay_s = statistics.median(d for d, _ in self.recent_streams)
        self.stage_tokens_per_s = statistics.median(r for _, r in self.recent_streams)
        self.num_streams_observed += 1

    def project(self, prompt_tokens: int, output_tokens: int, now: float, from_streams: bool = False) -> GrowingStage:
        """A stage starting now. From streams (asked for, and once enough were measured): its first token after the
        measured delay (× margin: early) at the measured per-stage pace (× margin: slow); else the fitted call time
        (the overhead as if after decoding, the rate from whole calls)."""
        if not from_streams or self.num_streams_observed < MIN_STREAMS:
            return GrowingStage(prompt_tokens, output_tokens, now)
        return GrowingStage(
            prompt_tokens,
            output_tokens,
            now,
            first_token_s=now + self.first_token_delay_s * self.decode_rate_margin,
            tokens_per_s=self.stage_tokens_per_s * self.decode_rate_margin,
        )

    def snapshot(self) -> dict:
        return {
            "call_overhead_s": round(self.call_overhead_s, 3),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 1),
            "first_token_delay_s": round(self.first_token_delay_s, 3),
            "stage_tokens_per_s": round(self.stage_tokens_per_s, 1),
            "streams_observed": self.num_streams_observed,
        }
