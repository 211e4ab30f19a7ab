"""A step-time model fitted to measured engine steps: the rows of a step profile's CSV in, coefficients out, and a
`CostModel` that prices a step by them.

The form (per model; every term is a quantity `serving.sim.costmodel.StepLoad` carries):

    step_s = overhead_s + decode_s × num_decodes + prefill_token_s × prefill_tokens
             + context_token_s × decode_context_tokens + pair_token_s × prefill_pair_tokens

overhead_s is the step's fixed cost (scheduling, input preparation, launches); decode_s what a decoding sequence adds
besides its attention (its row in the linear layers, its logits and sampling); prefill_token_s a prompt token's row in
the linear layers; context_token_s the attention of a decode over one token of KV; pair_token_s the attention of a
prefill chunk per query-key pair. Fitted by non-negative least squares on relative residuals (every row counts by
its % error, the measure reported), so no coefficient goes negative and small steps are not drowned by large ones.

CSV (one row per distinct step content, aggregated over repeats): the columns of the GPU step profile
(`benchmarks/sim/gpu_profile.py`, `serving.sim.steptime_profiles.STEP_CSV_COLUMNS`: the device and its nominal
bandwidth and peak, the model's shape, what the step carried, `step_s`), here `step_s` the median of the clock
fitted (the process's CPU time on vLLM-CPU), then `EXTRA_COLUMNS`: family (decode: decodes only; prefill: chunks, no
decode, nothing cached; mixed: decodes beside chunks; cached: a chunk whose prompt starts with tokens already in the KV
cache), prefill_cached_tokens, num_samples, step_p25_s and step_p75_s (quartiles of the same clock), wall_s (the
median wall time).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from serving.sim.costmodel import CostModel, CostModelConfig, StepLoad

STEP_COLUMNS = (  # the GPU step profile's, in its order (serving.sim.steptime_profiles.StepSample)
    "gpu",
    "hbm_bytes_per_s",
    "peak_flops",
    "model",
    "tensor_parallel_size",
    "num_layers",
    "hidden_size",
    "num_q_heads",
    "num_kv_heads",
    "head_dim",
    "ffn_dim",
    "vocab_size",
    "weight_bytes_per_param",
    "num_decodes",
    "decode_context_tokens",
    "prefill_tokens",
    "prefill_pair_tokens",
    "num_prefills",
    "step_s",
)
EXTRA_COLUMNS = ("family", "prefill_cached_tokens", "num_samples", "step_p25_s", "step_p75_s", "wall_s")
CSV_COLUMNS = STEP_COLUMNS + EXTRA_COLUMNS
TEXT_COLUMNS = ("gpu", "model", "family")
FAMILIES = ("decode", "prefill", "mixed", "cached")


def family(num_decodes: int, prefill_tokens: int, prefill_cached_tokens: int) -> str:
    if not prefill_tokens:
        return "decode"
    if prefill_cached_tokens:
        return "cached"
    return "mixed" if num_decodes else "prefill"


def aggregate(device: dict, samples) -> list[dict]:
    """(ScheduledStep, wall s, CPU s) samples as CSV rows, one per distinct content (medians and quartiles); `device`
    holds the columns every row shares (device, model shape)."""
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for step, wall_s, cpu_s in samples:
        load = step.load
        key = (load.num_decodes, load.decode_context_tokens, load.prefill_tokens, step.prefill_cached_tokens)
        groups.setdefault(key + (step.num_prefills, load.prefill_pair_tokens), []).append((wall_s, cpu_s))
    rows = []
    for (decodes, context, prefill, cached, num_prefills, pairs), times in sorted(groups.items()):
        wall, cpu = np.array([t[0] for t in times]), np.array([t[1] for t in times])
        content = dict(num_decodes=decodes, decode_context_tokens=context, prefill_tokens=prefill)
        rows.append(
            {
                **device,
                **content,
                "prefill_pair_tokens": pairs,
                "num_prefills": num_prefills,
                "step_s": float(np.median(cpu)),
                "family": family(decodes, prefill, cached),
                "prefill_cached_tokens": cached,
                "num_samples": len(times),
                "step_p25_s": float(np.percentile(cpu, 25)),
                "step_p75_s": float(np.percentile(cpu, 75)),
                "wall_s": float(np.median(wall)),
            }
        )
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    """The rows of a step profile CSV, numbers parsed; a missing column is named."""
    with open(path, newline="") as source:
        reader = csv.DictReader(source)
        missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: columns {missing} missing; a step profile CSV has {list(CSV_COLUMNS)}")
        return [{k: v if k in TEXT_COLUMNS else float(v) for k, v in row.items()} for row in reader]


@dataclass(frozen=True)
class LinearStepModel:
    """One model's step time from what the step carries (the module docstring's form); seconds."""

    overhead_s: float
    decode_s: float
    prefill_token_s: float
    context_token_s: float
    pair_token_s: float

    def time_s(self, load: StepLoad) -> float:
        return self.overhead_s + self.added_s(load)

    def added_s(self, load: StepLoad) -> float:
        """The step time `load` adds to the fixed overhead."""
        return (
            self.decode_s * load.num_decodes
            + self.prefill_token_s * load.prefill_tokens
            + self.context_token_s * load.decode_context_tokens
            + self.pair_token_s * load.prefill_pair_tokens
        )

    def scaled(self, factor: float) -> LinearStepModel:
        return LinearStepModel(*(factor * v for v in asdict(self).values()))


def features(rows: list[dict]) -> np.ndarray:
    keys = ("num_decodes", "prefill_tokens", "decode_context_tokens", "prefill_pair_tokens")
    return np.array([[1.0] + [float(row[k]) for k in keys] for row in rows])


def fit(rows: list[dict]) -> LinearStepModel:
    """Least-squares coefficients (non-negative) of `rows`' `step_s`, each row weighted by 1 / its time."""
    from scipy.optimize import nnls

    if len(rows) < 5:
        raise ValueError(f"{len(rows)} rows: the step model has 5 coefficients; profile more step shapes")
    times = np.array([row["step_s"] for row in rows])
    scale = features(rows).max(axis=0)
    scale[scale == 0] = 1.0
    coefficients, _ = nnls(features(rows) / scale / times[:, None], np.ones(len(rows)))
    return LinearStepModel(*(coefficients / scale))


def predict(model: LinearStepModel, rows: list[dict]) -> np.ndarray:
    return features(rows) @ np.array(list(asdict(model).values()))


def median_abs_pct_err(model: LinearStepModel, rows: list[dict]) -> float:
    times = np.array([row["step_s"] for row in rows])
    return float(np.median(np.abs(predict(model, rows) - times) / times) * 100)


def held_out(rows: list[dict]) -> dict[str, float]:
    """Per batch-shape family: the median abs % error on its rows of a fit on the other families' rows."""
    out = {}
    for name in FAMILIES:
        kept, left = [r for r in rows if r["family"] != name], [r for r in rows if r["family"] == name]
        if left and len(kept) >= 5:
            out[name] = round(median_abs_pct_err(fit(kept), left), 2)
    return out


class FittedStepCost(CostModel):
    """A `CostModel` whose steps are priced by fitted `LinearStepModel`s (model name -> fit): one home for the price of
    a step, a lone prefill (`prefill_s`: chunks of the config's token budget, one step each) and a lone decode
    (`decode_s`). `config` gives the models' KV shapes and the engine's token budget."""

    def __init__(self, config: CostModelConfig, fits: Mapping[str, LinearStepModel]):
        super().__init__(config)
        unknown = [name for name in fits if name not in config.models]
        if unknown:
            raise ValueError(f"fits for models {unknown} not in the cost config")
        self.fits, self.chunk_tokens = dict(fits), config.token_budget
        self.overhead_s = max(fit.overhead_s for fit in self.fits.values())

    def fit_of(self, name: str) -> LinearStepModel:
        if name not in self.fits:
            raise ValueError(f"no fitted step model for model '{name}'; fitted: {', '.join(self.fits)}")
        return self.fits[name]

    def pricing(self) -> dict[str, str]:
        return {name: "fitted to measured engine steps (benchmarks/engine/step_fit.py)" for name in self.fits}

    def step_time_s(self, loads: Mapping[str, StepLoad], host_slowdown: float = 1.0) -> float:
        return self.overhead_s * host_slowdown + sum(self.fit_of(name).added_s(load) for name, load in loads.items())

    def prefill_s(self, model, new_tokens: int, cached_tokens: int = 0) -> float:
        seconds, done = 0.0, cached_tokens
        while done < cached_tokens + new_tokens:
            chunk = min(self.chunk_tokens, cached_tokens + new_tokens - done)
            load = StepLoad(prefill_tokens=chunk, prefill_pair_tokens=chunk * (done + chunk / 2))
            seconds, done = seconds + self.step_time_s({model.name: load}), done + chunk
        return seconds

    def decode_s(self, model, tokens: int, context_tokens: int) -> float:
        load = StepLoad(num_decodes=1, decode_context_tokens=round(context_tokens + tokens / 2))
        return tokens * self.step_time_s({model.name: load})
