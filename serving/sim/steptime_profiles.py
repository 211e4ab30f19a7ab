"""Measured times the step-time model is fitted to: per-layer linear-operator profiles and whole engine steps.

Two kinds of rows, read from CSV:
- `LinearProfile`: one transformer layer's linear operators (every profiled operator but the embedding, summed),
  seconds against the tokens in the batch, for one (model shape, GPU, tensor-parallel degree). Vidur's public
  profiles (microsoft/vidur, MIT; Agrawal et al., MLSys 2024), `<gpu>__<model>__mlp.csv`, are read by
  `read_vidur_csv`; the medians of duplicated token counts are taken.
- `StepSample`: one whole engine step's wall time against what it carried, as `benchmarks/sim/gpu_profile.py`
  writes it (`STEP_CSV_COLUMNS`, documented in docs/cost.md); `read_step_csv` / `write_step_csv`.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

VIDUR_LINEAR_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)  # every operator of Vidur's mlp.csv but `emb`, which runs once a step, not once a layer


@dataclass(frozen=True)
class LayerShape:
    """The linear shape of one transformer layer: what its weights and FLOPs per token follow from."""

    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_dim: int  # the MLP's inner width (one expert's, for a mixture of experts)
    is_gated_mlp: bool = True
    num_experts: int = 0  # 0: a dense MLP
    num_active_experts: int = 0  # experts each token is routed to

    @property
    def attention_params(self) -> int:
        q_dim, kv_dim = self.num_q_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.hidden_size * (q_dim + 2 * kv_dim) + q_dim * self.hidden_size

    @property
    def expert_params(self) -> int:
        return (3 if self.is_gated_mlp else 2) * self.hidden_size * self.ffn_dim

    @property
    def num_experts_per_token(self) -> int:
        return self.num_active_experts if self.num_experts else 1

    def experts_read(self, num_tokens: np.ndarray) -> np.ndarray:
        """Distinct experts a batch of `num_tokens` touches (uniform routing): k of E per token, so a decode batch
        of a few dozen tokens reads nearly every expert's weights while its FLOPs stay those of k."""
        if not self.num_experts:
            return np.ones_like(num_tokens, dtype=float)
        miss = 1.0 - self.num_active_experts / self.num_experts
        return self.num_experts * (1.0 - miss ** np.maximum(num_tokens, 1))

    def params_read(self, num_tokens: np.ndarray) -> np.ndarray:
        return self.attention_params + self.expert_params * self.experts_read(num_tokens)

    @property
    def active_params(self) -> int:
        return self.attention_params + self.expert_params * self.num_experts_per_token


@dataclass(frozen=True)
class LinearProfile:
    """One layer's linear operators measured at each token count (seconds), for a shape on a GPU at a TP degree."""

    model: str
    gpu: str  # a `GPUProfile.profiled_as` name: "a100", "h100"
    tensor_parallel_size: int
    shape: LayerShape
    num_tokens: tuple[int, ...]
    layer_s: tuple[float, ...]

    @property
    def name(self) -> str:
        return f"{self.gpu}/{self.model}/tp{self.tensor_parallel_size}"


def read_vidur_csv(path: Path) -> list[LinearProfile]:
    """One Vidur `<gpu>__<model>__mlp.csv`: one `LinearProfile` per tensor-parallel degree in it."""
    gpu, model, _ = Path(path).name.split("__")
    by_tp: dict[int, dict[int, list[float]]] = {}
    shape = None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            ms = sum(float(row[f"time_stats.{op}.median"]) for op in VIDUR_LINEAR_OPS)
            by_tp.setdefault(int(row["num_tensor_parallel_workers"]), {}).setdefault(int(row["num_tokens"]), [])
            by_tp[int(row["num_tensor_parallel_workers"])][int(row["num_tokens"])].append(ms * 1e-3)
            shape = shape or vidur_shape(row)
    if shape is None:
        raise ValueError(f"{path}: no rows; expected Vidur's mlp.csv columns (time_stats.<op>.median, num_tokens)")
    return [
        LinearProfile(
            model, gpu, tp, shape, tuple(sorted(times)), tuple(float(np.median(times[n])) for n in sorted(times))
        )
        for tp, times in sorted(by_tp.items())
    ]


def vidur_shape(row: dict) -> LayerShape:
    n_head, n_embd = int(row["n_head"]), int(row["n_embd"])
    return LayerShape(
        n_embd,
        n_head,
        int(row["n_kv_head"]),
        n_embd // n_head,
        int(row["n_expanded_embd"]),
        row["use_gated_mlp"] == "True",
    )


def read_vidur_dir(folder: Path) -> list[LinearProfile]:
    paths = sorted(Path(folder).glob("*__*__mlp.csv"))
    if not paths:
        raise FileNotFoundError(f"no Vidur profiles (<gpu>__<model>__mlp.csv) in {folder}")
    return [profile for path in paths for profile in read_vidur_csv(path)]


@dataclass(frozen=True)
class StepSample:
    """One engine step timed on a real GPU: what it carried and its median wall time."""

    gpu: str
    hbm_bytes_per_s: float  # the GPU's datasheet figures the roofline divides by
    peak_flops: float
    model: str
    tensor_parallel_size: int
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    weight_bytes_per_param: float
    num_decodes: int
    decode_context_tokens: int
    prefill_tokens: int
    prefill_pair_tokens: float
    num_prefills: int
    step_s: float

    @property
    def shape(self) -> LayerShape:
        return LayerShape(self.hidden_size, self.num_q_heads, self.num_kv_heads, self.head_dim, self.ffn_dim)

    @property
    def num_tokens(self) -> int:
        return self.num_decodes + self.prefill_tokens


STEP_CSV_COLUMNS = tuple(f.name for f in fields(StepSample))


def write_step_csv(path: Path, samples: Iterable[StepSample]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=STEP_CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(asdict(s) for s in samples)


def read_step_csv(path: Path) -> list[StepSample]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = set(STEP_CSV_COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing step-profile columns {sorted(missing)}; write it with gpu_profile.py")
        types = {f.name: f.type for f in fields(StepSample)}
        cast = {"str": str, "int": int, "float": float}
        return [StepSample(**{k: cast[types[k]](row[k]) for k in STEP_CSV_COLUMNS}) for row in reader]
