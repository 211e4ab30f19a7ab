"""The step-time model fitted to whole engine steps timed on a GPU (`benchmarks/sim/gpu_profile.py`'s CSV).

A measured step is overhead + layers × linear + LM head + attention, priced by the same `StepTimeModel` the
simulator uses (parametric linear operators); `fit_steps` fits the roofline's efficiencies together with the
per-step overhead and the two attention efficiencies, on the steps and, when given, Vidur's per-layer rows beside
them (so a handful of steps cannot pull the linear fit off the profiles).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from serving.sim.costmodel import GPUProfile, ModelProfile, StepLoad
from serving.sim.steptime import StepTable, StepTimeModel
from serving.sim.steptime_fit import INITIAL, LOWER, UPPER, LinearFit, predict
from serving.sim.steptime_profiles import LinearProfile, StepSample

STEP_INITIAL, STEP_LOWER, STEP_UPPER = (3e-3, 0.7, 0.5), (0.0, 0.05, 0.05), (0.1, 1.0, 1.0)


@dataclass(frozen=True)
class StepFit:
    """The fitted linear roofline plus what only whole steps show: overhead and attention efficiencies."""

    linear: LinearFit
    step_overhead_s: float
    attention_mbu: float
    attention_mfu: float

    def to_json(self) -> dict:
        return {"linear": asdict(self.linear)} | {k: v for k, v in asdict(self).items() if k != "linear"}


def sample_model(sample: StepSample) -> tuple[GPUProfile, ModelProfile]:
    gpu = GPUProfile(sample.gpu, 0.0, sample.hbm_bytes_per_s, sample.peak_flops)
    params = sample.num_layers * sample.shape.active_params
    model = ModelProfile(
        sample.model,
        params,
        params,
        sample.num_layers,
        sample.hidden_size,
        sample.num_kv_heads,
        sample.head_dim,
        sample.weight_bytes_per_param,
        num_q_heads=sample.num_q_heads,
        ffn_dim=sample.ffn_dim,
        vocab_size=sample.vocab_size,
    )
    return gpu, model


def predict_step_s(fit: StepFit, sample: StepSample) -> float:
    gpu, model = sample_model(sample)
    steps = StepTimeModel(
        gpu, sample.tensor_parallel_size, fit.attention_mbu, fit.attention_mfu, StepTable(fit.linear, ())
    )
    load = StepLoad(
        sample.num_decodes,
        sample.decode_context_tokens,
        sample.prefill_tokens,
        sample.prefill_pair_tokens,
        sample.num_prefills,
    )
    return fit.step_overhead_s + steps.model_step_s(model, load)


def step_errors(fit: StepFit, samples: list[StepSample]) -> np.ndarray:
    return np.array([abs(predict_step_s(fit, s) / s.step_s - 1.0) * 100.0 for s in samples])


def fit_steps(samples: list[StepSample], profiles: list[LinearProfile] = ()) -> StepFit:
    """Least squares on log(predicted / measured) over the steps and the per-layer profile rows together."""
    from scipy.optimize import least_squares  # fitting only: the profiling script runs where scipy may not be

    if not samples:
        raise ValueError("fit_steps: no step samples; write some with benchmarks/sim/gpu_profile.py")
    measured = np.log([s.step_s for s in samples])
    layer_rows = [np.log(np.array(p.layer_s)) for p in profiles]

    def residuals(x: np.ndarray) -> np.ndarray:
        fit = StepFit(LinearFit(*x[:5]), *x[5:])
        steps = np.log([predict_step_s(fit, s) for s in samples]) - measured
        rows = [np.log(predict(fit.linear, p)) - m for p, m in zip(profiles, layer_rows)]
        return np.concatenate([steps, *rows])

    start = np.concatenate([INITIAL.to_vector(), STEP_INITIAL])
    bounds = (np.concatenate([LOWER.to_vector(), STEP_LOWER]), np.concatenate([UPPER.to_vector(), STEP_UPPER]))
    x = least_squares(residuals, start, bounds=bounds).x
    return StepFit(LinearFit(*(float(v) for v in x[:5])), *(float(v) for v in x[5:]))
