"""GPU cost model: what an engine step, a prefill and a lone decode cost on a simulated GPU.

`step_model="fitted"` (the default) prices every step with `serving.sim.steptime.StepTimeModel`: linear operators
from measured per-layer GPU profiles (or the roofline fitted to them), attention from KV bytes and FLOPs, a per-step
overhead (docs/cost.md). `step_model="datasheet"` keeps the datasheet model below:

prefill_s = (2·N_active·P + 4·L·d_attn·(P·c + P²/2)) / (peak_flops · mfu)   for P new tokens after c cached
(d_attn = query heads × head_dim: QKᵀ and AV each cost 2·d_attn FLOPs per token pair per layer)
step_s    = overhead + Σ_models weight_bytes / (hbm_bw · mbu) + Σ_seqs kv_bytes(ctx) / (hbm_bw · mbu)
Every running sequence gains one token per step (continuous batching). GPU figures are the public
datasheet numbers (dense BF16); model shapes are from the models' configs. See serving/README.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from serving.sim.steptime import StepTimeModel
from serving.sim.steptime_profiles import LayerShape

GB = 1e9
STEP_MODELS = ("fitted", "datasheet")


@dataclass
class StepLoad:
    """What one engine step carries for one model: the unit every step price is computed from."""

    num_decodes: int = 0  # sequences that decode one token in this step
    decode_context_tokens: int = 0  # the KV tokens those decodes read (their contexts summed)
    prefill_tokens: int = 0  # new prompt tokens in this step's prefill chunks
    prefill_pair_tokens: float = 0.0  # attention query-key pairs of those chunks: sum of chunk x (cached + chunk / 2)
    num_prefills: int = 0  # requests those chunks belong to (0 with prefill tokens: counted as one)

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
    profiled_as: str = ""  # the GPU's name in the measured profiles (steptime_table.json); "" if none


GPU_PROFILES = {
    "a100-80gb": GPUProfile("a100-80gb", 80 * GB, 2.039e12, 312e12, "a100"),  # A100 SXM4 80GB datasheet
    "h100": GPUProfile("h100", 80 * GB, 3.35e12, 989e12, "h100"),  # H100 SXM5 datasheet
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
    ffn_dim: int = 0  # the MLP's inner width (one expert's); 0: shape unknown, priced from active_params alone
    vocab_size: int = 0  # the LM head's rows; 0: no LM head priced
    num_experts: int = 0  # 0: dense
    num_active_experts: int = 0

    @property
    def attention_dim(self) -> int:
        return self.num_q_heads * self.head_dim if self.num_q_heads else self.hidden_size

    @property
    def layer_shape(self) -> LayerShape:
        """One layer's linear shape; without `ffn_dim`, one dense MLP holding active_params / num_layers."""
        if self.ffn_dim:
            heads = self.attention_dim // self.head_dim
            return LayerShape(
                self.hidden_size,
                heads,
                self.num_kv_heads,
                self.head_dim,
                self.ffn_dim,
                num_experts=self.num_experts,
                num_active_experts=self.num_active_experts,
            )
        per_layer = self.active_params / max(self.num_layers, 1)
        return LayerShape(self.hidden_size, 0, 0, 0, max(1, round(per_layer / (3 * self.hidden_size))))

    @property
    def weight_bytes(self) -> int:
        return int(self.params * self.weight_bytes_per_param)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2  # K and V, bf16


MODEL_PROFILES = {
    m.name: m
    for m in [
        # shapes from each model's config.json (intermediate_size, vocab_size, experts)
        ModelProfile("llama-3-8b", 8.0e9, 8.0e9, 32, 4096, 8, 128, ffn_dim=14336, vocab_size=128256),
        ModelProfile("qwen2-7b", 7.6e9, 7.6e9, 28, 3584, 4, 128, ffn_dim=18944, vocab_size=152064),
        ModelProfile("mistral-7b", 7.2e9, 7.2e9, 32, 4096, 8, 128, ffn_dim=14336, vocab_size=32768),
        # fp8 weights to fit one A100
        ModelProfile("qwen2.5-coder-32b", 32.8e9, 32.8e9, 64, 5120, 8, 128, 1.0, ffn_dim=27648, vocab_size=152064),
        # AWQ int4 to fit one A100
        ModelProfile("qwen2-72b", 72.7e9, 72.7e9, 80, 8192, 8, 128, 0.5, ffn_dim=29568, vocab_size=152064),
        # MoE, 3.3B active (8 of 128 experts of width 768); hidden 2048 but 32 query heads × 128: attention 4096 wide
        ModelProfile(
            "qwen3-coder-30b-a3b",
            30.5e9,
            3.3e9,
            48,
            2048,
            4,
            128,
            num_q_heads=32,
            ffn_dim=768,
            vocab_size=151936,
            num_experts=128,
            num_active_experts=8,
        ),
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
    step_model: str = "fitted"  # "fitted": StepTimeModel (serving/sim/steptime.py); "datasheet": the formulas above
    attention_mbu: float = 0.7  # fitted model: decode attention's share of HBM bandwidth (docs/cost.md)
    attention_mfu: float = 0.5  # fitted model: prefill attention's share of peak FLOPs (FlashAttention-2, A100)
    tensor_parallel_size: int = 1  # GPUs a model's weights are split over (fitted model only)
    # vLLM's token budget a step (a lone prefill runs in chunks of it); 0: vLLM 0.32's default for its OpenAI
    # server on this GPU (engine/arg_utils.py: 8192 on H100/H200 and other >= 70 GiB GPUs, 2048 on an A100)
    max_num_batched_tokens: int = 0

    def __post_init__(self):
        if self.gpu not in self.gpus:
            raise ValueError(f"unknown GPU profile '{self.gpu}'; known: {', '.join(self.gpus)}")
        if self.step_model not in STEP_MODELS:
            raise ValueError(f"step_model must be one of {', '.join(STEP_MODELS)}, got '{self.step_model}'")
        if not (0 < self.prefill_mfu <= 1 and 0 < self.decode_mbu <= 1) or self.step_overhead_s < 0:
            raise ValueError("prefill_mfu and decode_mbu must be in (0, 1]; step_overhead_s >= 0")
        if not (0 < self.attention_mbu <= 1 and 0 < self.attention_mfu <= 1):
            raise ValueError("attention_mbu and attention_mfu must be in (0, 1]")
        if self.tensor_parallel_size < 1 or self.max_num_batched_tokens < 0:
            raise ValueError("tensor_parallel_size must be >= 1 and max_num_batched_tokens >= 0 (0: vLLM's default)")

    @property
    def token_budget(self) -> int:
        if self.max_num_batched_tokens:
            return self.max_num_batched_tokens
        gpu = self.gpus[self.gpu]
        return 2048 if gpu.profiled_as == "a100" or gpu.hbm_bytes < 70 * 2**30 else 8192


class CostModel:
    def __init__(self, config: CostModelConfig):
        self.config = config
        self.gpu = config.gpus[config.gpu]
        self._flops = self.gpu.peak_flops * config.prefill_mfu
        self._bw = self.gpu.hbm_bytes_per_s * config.decode_mbu
        self.steps = None
        if config.step_model == "fitted":
            self.steps = StepTimeModel(
                self.gpu, config.tensor_parallel_size, config.attention_mbu, config.attention_mfu
            )

    def model(self, name: str) -> ModelProfile:
        try:
            return self.config.models[name]
        except KeyError:
            raise ValueError(f"no cost profile for model '{name}'; known: {', '.join(self.config.models)}") from None

    def pricing(self) -> dict[str, str]:
        """How each known model's steps are priced on this GPU: what a reader of any figure should see first."""
        if self.steps is None:
            return {name: "datasheet" for name in self.config.models}
        return {name: self.steps.source(model).note for name, model in self.config.models.items()}

    def prefill_s(self, model: ModelProfile, new_tokens: int, cached_tokens: int = 0) -> float:
        """A lone prefill of `new_tokens` after `cached_tokens` (fitted: steps of the token budget's chunks)."""
        p = max(0, new_tokens)
        if self.steps is not None:
            return self.lone_prefill_s(model, p, cached_tokens)
        linear = 2.0 * model.active_params * p
        attention = 4.0 * model.num_layers * model.attention_dim * (p * cached_tokens + 0.5 * p * p)
        return (linear + attention) / self._flops

    def lone_prefill_s(self, model: ModelProfile, new_tokens: int, cached_tokens: int) -> float:
        """The steps of one prefill chunked at the token budget, each with its per-step overhead."""
        budget, total, done = self.config.token_budget, 0.0, 0
        while done < new_tokens:
            chunk = min(budget, new_tokens - done)
            pairs = chunk * (cached_tokens + done + chunk / 2)
            load = StepLoad(prefill_tokens=chunk, prefill_pair_tokens=pairs)
            total += self.config.step_overhead_s + self.steps.model_step_s(model, load)
            done += chunk
        return total

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
        """One engine step carrying `loads` (model name -> what it carries for that model): the host overhead plus
        each model's share (fitted: `StepTimeModel.model_step_s`; datasheet: weights read once per model, the
        decodes' KV read, the prefill chunks' FLOPs)."""
        total = self.config.step_overhead_s * host_slowdown
        for name, load in loads.items():
            total += self.model_step_s(self.model(name), load)
        return total

    def model_step_s(self, model: ModelProfile, load: StepLoad) -> float:
        if self.steps is not None:
            return self.steps.model_step_s(model, load)
        total = self.weight_read_s(model) + self.kv_read_s(load.decode_context_tokens * model.kv_bytes_per_token)
        pairs = 4.0 * model.num_layers * model.attention_dim * load.prefill_pair_tokens
        return total + (2.0 * model.active_params * load.prefill_tokens + pairs) / self._flops

    def decode_s(self, model: ModelProfile, tokens: int, context_tokens: int) -> float:
        """A lone sequence's decode time: what the predictor's tokens turn into for SRTF keys and the SLO table.
        Attention is linear in context, so `tokens` steps cost `tokens` steps at the mean context."""
        if tokens <= 0:
            return 0.0
        mean_context = context_tokens + tokens / 2
        if self.steps is not None:
            load = StepLoad(num_decodes=1, decode_context_tokens=round(mean_context))
            return tokens * (self.config.step_overhead_s + self.steps.model_step_s(model, load))
        return tokens * self.step_s(self.weight_read_s(model), mean_context * model.kv_bytes_per_token)
