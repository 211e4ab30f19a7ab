"""What to do with a session's KV while its tool runs: keep it, evict it, or pin it for a TTL.

Every policy answers `ttl_s(...)`: 0 evicts at once, math.inf keeps until the tool returns,
anything between pins for that long and then evicts. Definitions follow PAPERS.md.

Maestro's rule (`mars-batch`) is MARS's with the re-prefill priced at the batch it joins: an evicted context is
prefilled again in the steps the node's running stages share, so each of them waits for its chunks too. MARS weighs
the session's own re-prefill time against the tool's; Maestro adds what those chunks add to the stages running beside
it (`ToolCallContext.others_stall_s`, each caller's estimate of it). A kept context is not lost memory: it is idle
KV that goes back before any running stage is preempted or a stage is refused (the simulator's `kv_plan` and `grow`,
the vLLM plugin's hold release), so keeping costs little until memory binds.
"""

from __future__ import annotations

import bisect
import enum
import math
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass


class ToolKVPolicy(enum.Enum):
    MARS = "mars"  # keep iff re-prefill time > predicted tool time
    MARS_BATCH = "mars-batch"  # Maestro: keep iff the re-prefill, with what it adds to the running stages, > tool time
    KEEP_ALWAYS = "keep-always"
    EVICT_ALWAYS = "evict-always"
    CONTINUUM = "continuum"  # public code: fixed TTL unless the tool's moving average exceeds it
    CONTINUUM_DY = "continuum-dy"  # paper: TTL from the empirical CDF of tool durations
    INFERCEPT = "infercept"


@dataclass
class ToolKVConfig:
    policy: str = "mars"
    fixed_ttl_s: float = 2.0  # Continuum's pin
    ema_alpha: float = 0.2  # moving average of tool durations (Continuum's "tool moving average")
    cold_start_samples: int = 100  # Continuum-Dy: exponential prior (mean 1 s, η = 1) until then
    max_samples: int = 2000  # Continuum-Dy: CDF window per tool

    def __post_init__(self):
        if isinstance(self.policy, ToolKVPolicy):
            self.policy = self.policy.value
        if self.policy not in {p.value for p in ToolKVPolicy}:
            raise ValueError(
                f"unknown tool-KV policy '{self.policy}'; known: {', '.join(p.value for p in ToolKVPolicy)}"
            )
        if self.fixed_ttl_s < 0 or not 0 < self.ema_alpha <= 1:
            raise ValueError("fixed_ttl_s must be >= 0 and ema_alpha in (0, 1]")


@dataclass(frozen=True)
class ToolCallContext:
    """What is known when a stage ends in a tool call."""

    tool: str
    context_tokens: int
    reprefill_s: float  # time to prefill the context again if evicted
    predicted_tool_s: float
    other_context_tokens: int = 0  # KV of the other running sequences (InferCept)
    mean_evicted_wait_s: float = 0.0  # Continuum-Dy's T
    others_stall_s: float = 0.0  # what re-prefilling the context adds to the stages running beside it, summed


class ToolTimes:
    """A moving average of each tool's measured time: what a tool is predicted to take next."""

    def __init__(self, alpha: float = 0.2):
        self.alpha = alpha
        self.ema_s: dict[str, float] = {}

    def observe(self, tool: str, duration_s: float) -> None:
        old = self.ema_s.get(tool)
        self.ema_s[tool] = duration_s if old is None else self.alpha * duration_s + (1 - self.alpha) * old

    def get(self, tool: str, default: float) -> float:
        return self.ema_s.get(tool, default)


class ToolKV(ABC):
    def __init__(self, config: ToolKVConfig):
        self.config = config

    @abstractmethod
    def ttl_s(self, call: ToolCallContext) -> float: ...

    def observe(self, tool: str, duration_s: float) -> None:  # noqa: B027 (a hook: most policies ignore it)
        """Learn from a finished tool call (most policies ignore it)."""


class MarsToolKV(ToolKV):
    """Keep iff re-prefilling the context would take longer than the tool is predicted to run."""

    def ttl_s(self, call: ToolCallContext) -> float:
        return math.inf if self.reprefill_cost_s(call) > call.predicted_tool_s else 0.0

    def reprefill_cost_s(self, call: ToolCallContext) -> float:
        return call.reprefill_s


class BatchPricedToolKV(MarsToolKV):
    """MARS's rule at the batch's price: the re-prefill's own time plus what it adds to the running stages (the
    module docstring)."""

    def reprefill_cost_s(self, call: ToolCallContext) -> float:
        return call.reprefill_s + call.others_stall_s


class KeepAlways(ToolKV):
    def ttl_s(self, call: ToolCallContext) -> float:
        return math.inf


class EvictAlways(ToolKV):
    def ttl_s(self, call: ToolCallContext) -> float:
        return 0.0


class ContinuumToolKV(ToolKV):
    """Pin `fixed_ttl_s` unless this tool's moving-average duration exceeds it (then do not pin)."""

    def __init__(self, config: ToolKVConfig):
        super().__init__(config)
        self.times = ToolTimes(config.ema_alpha)

    def observe(self, tool: str, duration_s: float) -> None:
        self.times.observe(tool, duration_s)

    def ttl_s(self, call: ToolCallContext) -> float:
        return 0.0 if self.times.get(call.tool, 0.0) > self.config.fixed_ttl_s else self.config.fixed_ttl_s


class ContinuumDyToolKV(ToolKV):
    """τ* = argmax over τ ∈ {0} ∪ observed durations of P(τ)·(T·η + reload) − τ (PAPERS.md).

    η = −corr(turns done, turns left) is taken as 1 (its cold-start value): a session's turn count
    is not known to the serving layer. Cold start uses the exponential prior: τ = ln(B) if B > 1 s.
    """

    def __init__(self, config: ToolKVConfig):
        super().__init__(config)
        self.samples: dict[str, list[float]] = defaultdict(list)

    def observe(self, tool: str, duration_s: float) -> None:
        samples = self.samples[tool]
        bisect.insort(samples, duration_s)
        if len(samples) > self.config.max_samples:
            del samples[len(samples) // 2]  # thin the middle, keep the tails

    def ttl_s(self, call: ToolCallContext) -> float:
        benefit = call.mean_evicted_wait_s + call.reprefill_s
        samples = self.samples.get(call.tool, [])
        if len(samples) <= self.config.cold_start_samples:
            return math.log(benefit) if benefit > 1.0 else 0.0
        best_tau, best_value, n = 0.0, 0.0, len(samples)
        step = max(1, n // 200)  # candidate τs: a thinned set of observed durations
        for index in range(0, n, step):
            tau = samples[index]
            value = (index + 1) / n * benefit - tau
            if value > best_value:
                best_tau, best_value = tau, value
        return best_tau


class InferCeptToolKV(ToolKV):
    """Keep for Tfwd(C)·(C + C_other)/(2C): the time after which holding costs more than recomputing."""

    def ttl_s(self, call: ToolCallContext) -> float:
        c = max(1, call.context_tokens)
        return call.reprefill_s * (c + call.other_context_tokens) / (2 * c)


def create_tool_kv(config: ToolKVConfig | ToolKVPolicy | str) -> ToolKV:
    config = config if isinstance(config, ToolKVConfig) else ToolKVConfig(policy=config)
    classes = {
        ToolKVPolicy.MARS: MarsToolKV,
        ToolKVPolicy.MARS_BATCH: BatchPricedToolKV,
        ToolKVPolicy.KEEP_ALWAYS: KeepAlways,
        ToolKVPolicy.EVICT_ALWAYS: EvictAlways,
        ToolKVPolicy.CONTINUUM: ContinuumToolKV,
        ToolKVPolicy.CONTINUUM_DY: ContinuumDyToolKV,
        ToolKVPolicy.INFERCEPT: InferCeptToolKV,
    }
    return classes[ToolKVPolicy(config.policy)](config)
