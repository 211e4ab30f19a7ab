"""One engine step's time from what it carries, for a model on a GPU at a tensor-parallel degree.

    step_s = overhead × host_slowdown + Σ_models [ num_layers × linear_layer_s(tokens) + lm_head_s(sequences)
                                                  + decode_kv_bytes / (hbm_bw × attention_mbu)
                                                  + prefill_attention_flops / (peak_flops × attention_mfu) ]

- Linear operators (QKV, O, MLP, norms, rope, add) per layer: interpolated in tokens from a measured profile when
  one of the same layer shape exists for the GPU and TP degree (Vidur's profiles, `steptime_table.json`); else the
  parametric roofline fitted to all of them (`steptime_fit`). `source(model)` says which, for every model.
- LM head: vocab × hidden weights read once a step, FLOPs for one row per sequence (vLLM computes logits only for
  each request's last scheduled token); the same fitted roofline. The embedding lookup is left out (a gather).
- Attention (not in the profiles): at decode the KV bytes read over HBM bandwidth × `attention_mbu`; at prefill
  4 × layers × attention width × query-key pairs FLOPs over peak × `attention_mfu` (CostModelConfig; docs/cost.md).
- Quantized weights (fp8, int4): the memory terms scale with bytes per parameter; FLOPs run at the BF16 peak
  (weight-only kernels dequantize to 16 bit), so only the memory-bound side of the roofline gets faster.
- Tensor parallelism divides weights, FLOPs and KV per GPU by TP; the all-reduce is not priced.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from serving.sim.steptime_fit import LinearFit, layer_s, matmul_s, profile_from_json
from serving.sim.steptime_profiles import LinearProfile

if TYPE_CHECKING:
    from serving.sim.costmodel import GPUProfile, ModelProfile, StepLoad

TABLE_PATH = Path(__file__).with_name("steptime_table.json")


@dataclass(frozen=True)
class StepTable:
    """What the step-time model was fitted to: the parametric fit and the measured per-layer profiles."""

    fit: LinearFit
    profiles: tuple[LinearProfile, ...]

    @classmethod
    def load(cls, path: Path = TABLE_PATH) -> StepTable:
        data = json.loads(Path(path).read_text())
        return cls(LinearFit(**data["linear_fit"]), tuple(profile_from_json(p) for p in data["profiles"]))


@functools.lru_cache(maxsize=1)
def shipped_table() -> StepTable:
    return StepTable.load()


@dataclass(frozen=True)
class LinearSource:
    """How a model's linear operators are priced on this GPU: `kind` "profile" (interpolated from a measured
    profile of the same layer shape, named in `profile`) or "parametric" (the fitted roofline); `note` says why."""

    kind: str
    profile: str
    note: str

    @property
    def is_profiled(self) -> bool:
        return self.kind == "profile"


class StepTimeModel:
    """Prices engine steps on one GPU type at one tensor-parallel degree (see the module docstring)."""

    def __init__(
        self,
        gpu: GPUProfile,
        tensor_parallel_size: int = 1,
        attention_mbu: float = 0.7,
        attention_mfu: float = 0.5,
        table: StepTable | None = None,
    ):
        self.gpu, self.tensor_parallel_size = gpu, tensor_parallel_size
        self.attention_mbu, self.attention_mfu = attention_mbu, attention_mfu
        self.table = table or shipped_table()
        self.roofline = (gpu.hbm_bytes_per_s, gpu.peak_flops)
        self.sources: dict[str, tuple[LinearSource, LinearProfile | None]] = {}
        self.linear_cache: dict[tuple[str, int], float] = {}  # (model, tokens) -> seconds
        self.lm_head_cache: dict[tuple[str, int], float] = {}  # (model, sequences) -> seconds

    def source(self, model: ModelProfile) -> LinearSource:
        return self.resolve(model)[0]

    def resolve(self, model: ModelProfile) -> tuple[LinearSource, LinearProfile | None]:
        if model.name not in self.sources:
            self.sources[model.name] = self.find_profile(model)
        return self.sources[model.name]

    def find_profile(self, model: ModelProfile) -> tuple[LinearSource, LinearProfile | None]:
        if model.weight_bytes_per_param != 2.0:
            width = f"{model.weight_bytes_per_param:g}-byte weights, no quantized profile"
            return LinearSource("parametric", "", f"parametric fit: {width}"), None
        key = (model.layer_shape, self.gpu.profiled_as, self.tensor_parallel_size)
        for profile in self.table.profiles:
            if (profile.shape, profile.gpu, profile.tensor_parallel_size) == key:
                same = "" if is_same_model(profile.model, model.name) else f", the layer shape of {model.name}"
                return LinearSource("profile", profile.name, f"measured profile {profile.name}{same}"), profile
        where = f"{self.gpu.name} at TP {self.tensor_parallel_size}"
        return LinearSource(
            "parametric", "", f"parametric fit: no measured profile of this layer shape on {where}"
        ), None

    def linear_s(self, model: ModelProfile, num_tokens: int) -> float:
        """All layers' linear operators for `num_tokens` tokens (0 tokens: nothing runs); memoized per model and
        token count, since the simulator asks for the same few thousand counts at every step."""
        key = (model.name, num_tokens)
        if key not in self.linear_cache:
            self.linear_cache[key] = self.compute_linear_s(model, num_tokens) if num_tokens > 0 else 0.0
        return self.linear_cache[key]

    def compute_linear_s(self, model: ModelProfile, num_tokens: int) -> float:
        _, profile = self.resolve(model)
        if profile is None or num_tokens > profile.num_tokens[-1]:
            per_layer = self.parametric_layer_s(model, num_tokens)
            if profile is not None:  # past the profile's end: its last measured point, grown as the fit grows
                last = profile.num_tokens[-1]
                per_layer *= profile.layer_s[-1] / self.parametric_layer_s(model, last)
        else:
            per_layer = float(np.interp(num_tokens, profile.num_tokens, profile.layer_s))
        return model.num_layers * per_layer

    def parametric_layer_s(self, model: ModelProfile, num_tokens: int) -> float:
        tokens = np.array([num_tokens])
        seconds = layer_s(
            self.table.fit,
            model.layer_shape,
            self.roofline,
            self.tensor_parallel_size,
            tokens,
            model.weight_bytes_per_param,
        )
        return float(seconds[0])

    def lm_head_s(self, model: ModelProfile, num_sequences: int) -> float:
        key = (model.name, num_sequences)
        if key not in self.lm_head_cache:
            params = model.vocab_size * model.hidden_size / self.tensor_parallel_size
            seconds = matmul_s(self.table.fit, params, self.roofline, num_sequences, model.weight_bytes_per_param)
            self.lm_head_cache[key] = seconds if num_sequences > 0 and model.vocab_size else 0.0
        return self.lm_head_cache[key]

    def attention_s(self, model: ModelProfile, load: StepLoad) -> float:
        kv_bytes = load.decode_context_tokens * model.kv_bytes_per_token / self.tensor_parallel_size
        flops = 4.0 * model.num_layers * model.attention_dim * load.prefill_pair_tokens / self.tensor_parallel_size
        return kv_bytes / (self.gpu.hbm_bytes_per_s * self.attention_mbu) + flops / (
            self.gpu.peak_flops * self.attention_mfu
        )

    def model_step_s(self, model: ModelProfile, load: StepLoad) -> float:
        """What `load` adds to a step for `model` (the step's overhead is the caller's)."""
        if load.num_tokens <= 0:
            return 0.0
        num_sequences = load.num_decodes + max(load.num_prefills, 1 if load.prefill_tokens else 0)
        return (
            self.linear_s(model, load.num_tokens) + self.lm_head_s(model, num_sequences) + self.attention_s(model, load)
        )


def is_same_model(profile_model: str, name: str) -> bool:
    return profile_model.lower().removeprefix("meta-") == name.lower()
