"""GPU cost model: prefill is compute-bound, a decode step is memory-bound (weights + KV read).

prefill_s = (2·N_active·P + 4·L·d_attn·(P·c + P²/2)) / (peak_flops · mfu)   for P new tokens after c cached
(d_attn = query heads × head_dim: QKᵀ and AV each cost 2·d_attn FLOPs per token pair per layer)
step_s    = overhead + Σ_models weight_bytes / (hbm_bw · mbu) + Σ_seqs kv_bytes(ctx) / (hbm_bw · mbu)
Every running sequence gains one token per step (continuous batching). GPU figures are the public
datasheet numbers (dense BF16); model shapes are from the models' configs. See serving/README.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

GB = 1e9


@dataclass
class StepLoad:
    """What one engine step carries for one model: the unit every step price is computed from."""

    num_decodes: int = 0  # sequences that decode one token in this step
    decode_context_tokens: int = 0  # the KV tokens those decodes read (their contexts summed)
    prefill_tokens: int = 0  # new prompt tokens in this step's prefill chunks
    prefill_pair_tokens: float = 0.0  # attention query-key pairs of those chunks: sum of chunk x (cached + chunk / 2)

    @property
    def num_tokens(self) -> int:
        """Tokens the linear layers process in this step (vLLM's scheduled tokens)."""
        return self.num_decodes + self.prefill_tokens


@dataclass(frozen=True)
class GPUProfile:
    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    peak_flops: float  # dense BF16


GPU_PROFILES = {
    "a100-80gb": GPUProfile("a100-80gb", 80 * GB, 2.039e12, 312e12),  # A100 SXM4 80GB datasheet
    "h200": GPUProfile("h200", 141 * GB, 4.8e12, 989e12),  # H200 SXM datasheet
}


@dataclass(frozen=True)
class ModelProfile:
    name: str
    params: float
    active_params: float
    num_layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    weight_bytes_per_param: float = 2.0  # bf16; 1.0 = fp8, 0.5 = int4
    num_q_heads: int = 0  # attention width = num_q_heads × head_dim; 0 means hidden_size (true for the dense ones)

    @property
    def attention_dim(self) -> int:
        return self.num_q_heads * self.head_dim if self.num_q_heads else self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return int(self.params * self.weight_bytes_per_param)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2  # K and V, bf16


MODEL_PROFILES = {
    m.name: m
    for m in [
        ModelProfile("llama-3-8b", 8.0e9, 8.0e9, 32, 4096, 8, 128),
        ModelProfile("qwen2-7b", 7.6e9, 7.6e9, 28, 3584, 4, 128),
        ModelProfile("mistral-7b", 7.2e9, 7.2e9, 32, 4096, 8, 128),
        ModelProfile("qwen2.5-coder-32b", 32.8e9, 32.8e9, 64, 5120, 8, 128, 1.0),  # fp8 weights to fit one A100
        ModelProfile("qwen2-72b", 72.7e9, 72.7e9, 80, 8192, 8, 128, 0.5),  # AWQ int4 to fit one A100
        # MoE, 3.3B active; config.json: hidden 2048 but 32 query heads × 128, so attention is 4096 wide
        ModelProfile("qwen3-coder-30b-a3b", 30.5e9, 3.3e9, 48, 2048, 4, 128, num_q_heads=32),
    ]
}


@dataclass
class CostModelConfig:
    gpu: str = "a100-80gb"
    prefill_mfu: float = 0.5
    decode_mbu: float = 0.7
    step_overhead_s: float = 0.003  # engine scheduling + kernel launch per step
    models: dict[str, ModelProfile] = field(default_factory=lambda: dict(MODEL_PROFILES))
    gpus: dict[str, GPUProfile] = field(default_factory=lambda: dict(GPU_PROFILES))

    def __post_init__(self):
        if self.gpu not in self.gpus:
            raise ValueError(f"unknown GPU profile '{self.gpu}'; known: {', '.join(self.gpus)}")
        if not (0 < self.prefill_mfu <= 1 and 0 < self.decode_mbu <= 1) or self.step_overhead_s < 0:
            raise ValueError("prefill_mfu and decode_mbu must be in (0, 1]; step_overhead_s >= 0")


class CostModel:
    def __init__(self, config: CostModelConfig):
        self.config = config
        self.gpu = config.gpus[config.gpu]
        self._flops = self.gpu.peak_flops * config.prefill_mfu
        self._bw = self.gpu.hbm_bytes_per_s * config.decode_mbu

    def model(self, name: str) -> ModelProfile:
        try:
            return self.config.models[name]
        except KeyError:
            raise ValueError(f"no cost profile for model '{name}'; known: {', '.join(self.config.models)}") from None

    def prefill_s(self, model: ModelProfile, new_tokens: int, cached_tokens: int = 0) -> float:
        p = max(0, new_tokens)
        linear = 2.0 * model.active_params * p
        attention = 4.0 * model.num_layers * model.attention_dim * (p * cached_tokens + 0.5 * p * p)
        return (linear + attention) / self._flops

    def weight_read_s(self, model: ModelProfile) -> float:
        # MoE: a batch touches most experts, so a step reads (nearly) all weights.
        return model.weight_bytes / self._bw

    def kv_read_s(self, kv_bytes: float) -> float:
        return kv_bytes / self._bw

    def step_s(self, weight_read_s: float, kv_bytes: float, host_slowdown: float = 1.0) -> float:
        # The per-step overhead is host-side work (scheduling, input prep, sampling, launches), so it
        # is what stretches when tools take the engine's CPU (serving/sim/hostcpu.py, `shared`).
        return self.config.step_overhead_s * host_slowdown + weight_read_s + self.kv_read_s(kv_bytes)

    def step_time_s(self, loads: Mapping[str, StepLoad], host_slowdown: float = 1.0) -> float:
        """One engine step carrying `loads` (model name -> what it carries for that model), datasheet-priced: the
        weights read once per model, the decodes' KV read, the prefill chunks' FLOPs."""
        total = self.config.step_overhead_s * host_slowdown
        for name, load in loads.items():
            model = self.model(name)
            total += self.weight_read_s(model) + self.kv_read_s(load.decode_context_tokens * model.kv_bytes_per_token)
            pairs = 4.0 * model.num_layers * model.attention_dim * load.prefill_pair_tokens
            total += (2.0 * model.active_params * load.prefill_tokens + pairs) / self._flops
        return total

    def decode_s(self, model: ModelProfile, tokens: int, context_tokens: int) -> float:
        """A lone sequence's decode time: what the predictor's tokens turn into for SRTF keys."""
        kv = (context_tokens + tokens / 2) * model.kv_bytes_per_token
        return tokens * self.step_s(self.weight_read_s(model), kv)
