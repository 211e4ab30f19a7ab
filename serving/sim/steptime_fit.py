r"""The parametric form of a layer's linear operators, fitted to measured profiles, and its held-out check.

One layer's linear operators for T tokens, split over TP GPUs (`LayerShape` gives weights and FLOPs):

    layer_s = fixed_s + (mem^p + compute^p)^(1/p) + act
    mem     = params_read(T) × bytes_per_param / TP / (hbm_bw × memory_efficiency)
    compute = 2 × active_params × T / TP / (peak_flops × compute_efficiency)
    act     = T × (12·hidden + 6·ffn·k / TP) / (hbm_bw × activation_efficiency)

a roofline whose corner is smoothed by p (p → ∞ is the max); `fixed_s` is what a layer costs whatever it carries
(kernel launches, tiny GEMMs); `act` is the bytes of the element-wise operators (two layer norms, the residual add,
rope; the gated activation reads two ffn-wide rows and writes one), 2-byte activations.
Fitted by least squares on log(predicted / measured) over every row of the profiles given.

    python -m serving.sim.steptime_fit --profiles ../shared/data/gpu-profiles --out serving/sim/steptime_table.json

writes the table the simulator ships (the fit on every profile, and each profile thinned to the token counts
nearest a 10 % geometric grid); it needs the profiles, the simulator at run time does not.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from serving.sim.steptime_profiles import LayerShape, LinearProfile, read_vidur_dir

# The datasheet figures of the profiled GPUs, dense BF16 (the simulator's `GPUProfile` keeps the same numbers).
PROFILED_GPUS = {"a100": (2.039e12, 312e12), "h100": (3.35e12, 989e12)}  # (HBM bytes/s, peak FLOP/s)
THIN_RATIO = 1.1  # the shipped table keeps the measured token counts nearest a geometric grid of this ratio


@dataclass(frozen=True)
class LinearFit:
    """Fitted efficiencies of the parametric layer time (see the module docstring)."""

    memory_efficiency: float
    compute_efficiency: float
    fixed_s: float
    activation_efficiency: float
    roofline_power: float

    def to_vector(self) -> np.ndarray:
        return np.array(list(asdict(self).values()), dtype=float)


INITIAL = LinearFit(0.7, 0.6, 2e-5, 0.5, 3.0)
LOWER = LinearFit(0.05, 0.05, 0.0, 0.01, 1.0)
UPPER = LinearFit(1.5, 1.5, 5e-4, 2.0, 20.0)


def layer_s(
    fit: LinearFit,
    shape: LayerShape,
    gpu: tuple[float, float],
    tensor_parallel_size: int,
    num_tokens: np.ndarray,
    bytes_per_param: float = 2.0,
) -> np.ndarray:
    """One layer's linear operators for each entry of `num_tokens`, seconds, on `gpu` = (HBM bytes/s, FLOP/s)."""
    bandwidth, peak = gpu
    tokens = np.asarray(num_tokens, dtype=float)
    mem = shape.params_read(tokens) * bytes_per_param / tensor_parallel_size / (bandwidth * fit.memory_efficiency)
    compute = 2.0 * shape.active_params * tokens / tensor_parallel_size / (peak * fit.compute_efficiency)
    p = fit.roofline_power
    act_bytes = tokens * (
        12.0 * shape.hidden_size + 6.0 * shape.ffn_dim * shape.num_experts_per_token / tensor_parallel_size
    )
    return fit.fixed_s + (mem**p + compute**p) ** (1.0 / p) + act_bytes / (bandwidth * fit.activation_efficiency)


def matmul_s(
    fit: LinearFit, params: float, gpu: tuple[float, float], num_tokens: float, bytes_per_param: float
) -> float:
    """One weight matrix of `params` applied to `num_tokens` rows (the LM head): the same roofline, no fixed term."""
    bandwidth, peak = gpu
    mem = params * bytes_per_param / (bandwidth * fit.memory_efficiency)
    compute = 2.0 * params * num_tokens / (peak * fit.compute_efficiency)
    p = fit.roofline_power
    return float((mem**p + compute**p) ** (1.0 / p))


def predict(fit: LinearFit, profile: LinearProfile) -> np.ndarray:
    gpu = profiled_gpu(profile.gpu)
    return layer_s(fit, profile.shape, gpu, profile.tensor_parallel_size, np.array(profile.num_tokens))


def profiled_gpu(name: str) -> tuple[float, float]:
    try:
        return PROFILED_GPUS[name]
    except KeyError:
        raise ValueError(f"profile GPU '{name}' has no datasheet entry; known: {', '.join(PROFILED_GPUS)}") from None


def fit_linear(profiles: list[LinearProfile]) -> LinearFit:
    """Least squares on log(predicted / measured) over every row of `profiles`."""
    from scipy.optimize import least_squares  # fitting only: the simulator prices steps without scipy

    if not profiles:
        raise ValueError("fit_linear: no profiles to fit")
    measured = [np.log(np.array(p.layer_s)) for p in profiles]

    def residuals(x: np.ndarray) -> np.ndarray:
        fit = LinearFit(*x)
        return np.concatenate([np.log(predict(fit, p)) - m for p, m in zip(profiles, measured)])

    result = least_squares(residuals, INITIAL.to_vector(), bounds=(LOWER.to_vector(), UPPER.to_vector()))
    return LinearFit(*(float(v) for v in result.x))


def abs_pct_errors(fit: LinearFit, profiles: list[LinearProfile]) -> np.ndarray:
    """|predicted / measured - 1| × 100 for every row of `profiles`."""
    return np.concatenate([np.abs(predict(fit, p) / np.array(p.layer_s) - 1.0) * 100.0 for p in profiles])


def held_out(profiles: list[LinearProfile]) -> dict[str, dict]:
    """Leave one model out (each in turn) and leave one GPU out: fit on the rest, errors on the one left out."""
    splits = {f"model:{m}": (lambda p, m=m: p.model == m) for m in sorted({p.model for p in profiles})}
    splits |= {f"gpu:{g}": (lambda p, g=g: p.gpu == g) for g in sorted({p.gpu for p in profiles})}
    out = {}
    for name, is_out in splits.items():
        train = [p for p in profiles if not is_out(p)]
        test = [p for p in profiles if is_out(p)]
        fit = fit_linear(train)
        out[name] = {"fit": fit, "errors": abs_pct_errors(fit, test), "in_sample": abs_pct_errors(fit, train)}
    return out


def thin(profile: LinearProfile, ratio: float = THIN_RATIO) -> LinearProfile:
    """The profile at the measured token counts nearest a geometric grid (always the first and the last), made
    non-decreasing (a running max): a step that carries more tokens never costs less in the simulator, where the
    measurements dip by a few % past some tile sizes."""
    tokens = np.array(profile.num_tokens)
    grid = np.unique(np.round(ratio ** np.arange(0, np.log(tokens[-1]) / np.log(ratio) + 1)))
    keep = sorted({int(np.abs(tokens - g).argmin()) for g in grid} | {0, len(tokens) - 1})
    return LinearProfile(
        profile.model,
        profile.gpu,
        profile.tensor_parallel_size,
        profile.shape,
        tuple(profile.num_tokens[i] for i in keep),
        tuple(float(v) for v in np.maximum.accumulate([profile.layer_s[i] for i in keep])),
    )


def table_json(profiles: list[LinearProfile], fit: LinearFit) -> dict:
    return {
        "source": "microsoft/vidur data/profiling/compute (MIT), commit 7d47513; Agrawal et al., MLSys 2024",
        "linear_fit": asdict(fit),
        "profiles": [asdict(thin(p)) for p in profiles],
    }


def profile_from_json(entry: dict) -> LinearProfile:
    fields = {**entry, "shape": LayerShape(**entry["shape"])}
    return LinearProfile(**{**fields, "num_tokens": tuple(entry["num_tokens"]), "layer_s": tuple(entry["layer_s"])})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", type=Path, required=True, help="folder of Vidur <gpu>__<model>__mlp.csv")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    profiles = read_vidur_dir(args.profiles)
    args.out.write_text(json.dumps(table_json(profiles, fit_linear(profiles)), indent=1) + "\n")


if __name__ == "__main__":
    main()
