r"""How far the simulator's prices are from measurements: one function per section, one JSON.

    .venv/bin/python -m benchmarks.sim.fidelity --json OUT.json [--profiles DIR] [--steps CSV ...] [--plot PNG] \
        [--engine ENGINE_REPORT.json --run RATE-SEED]

`profile_fit`: the parametric step-time roofline (`serving.sim.steptime_fit`) fitted on some of Vidur's measured
per-layer profiles (microsoft/vidur, MIT; Agrawal et al., MLSys 2024) and checked on the others: each model left
out in turn, then each GPU (fit on A100, check H100, and back). Per split: the median absolute % error of the
predicted per-layer linear time over every row (TP degree × token count, 1..the profile's max) of what was left
out, and the in-sample error of the same fit beside it; `median_abs_pct_err` pools every split's held-out rows.
`--steps` adds whole-step CSVs measured on a GPU (`benchmarks/sim/gpu_profile.py`): the step fit
(`serving.sim.steptime_steps`) and its error are reported under `profile_fit.steps`.
The plot: predicted against measured per profile, the prediction from the fit that left that model out.
`prices`: what the simulator charges, fitted beside datasheet, for each of its models and GPUs (`PRICED_LOADS`),
and how each model's linear operators are priced there (a measured profile, or the fit).
`engine_vs_sim` (with `--engine`): one run of the engine referee (`python -m benchmarks.referee --engine --json
ENGINE_REPORT.json`, its plans and step records beside it) replayed through the simulator on the run's own clock, arm
by arm (`benchmarks.engine.vs_sim.engine_vs_sim`; docs/engine_clock.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from serving.sim.costmodel import GPU_PROFILES, CostModel, CostModelConfig, StepLoad
from serving.sim.steptime_fit import abs_pct_errors, fit_linear, held_out, predict, thin
from serving.sim.steptime_profiles import LinearProfile, read_step_csv, read_vidur_dir

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO.parent / "shared" / "data" / "gpu-profiles"
TOKEN_BANDS = ((1, 64), (65, 512), (513, 1 << 20))  # decode-only steps, mixed steps, prefill-heavy steps
PRICED_LOADS = {  # step shapes (each decode at 2,000 tokens of context) the prices section shows
    "1_decode": StepLoad(1, 2000),
    "64_decodes": StepLoad(64, 64 * 2000),
    "64_decodes_512_prefill": StepLoad(64, 64 * 2000, 512, 512 * 256, 1),
    "256_decodes": StepLoad(256, 256 * 2000),
}


def errors_summary(errors: np.ndarray) -> dict:
    return {
        "median_abs_pct_err": float(np.median(errors)),
        "p90_abs_pct_err": float(np.percentile(errors, 90)),
        "num_rows": int(errors.size),
    }


def band_errors(profiles: list[LinearProfile], errors: np.ndarray) -> dict:
    """The median error by how many tokens the row carried."""
    tokens = np.concatenate([np.array(p.num_tokens) for p in profiles])
    return {
        f"{lo}-{min(hi, int(tokens.max()))}": float(np.median(errors[(tokens >= lo) & (tokens <= hi)]))
        for lo, hi in TOKEN_BANDS
        if ((tokens >= lo) & (tokens <= hi)).any()
    }


def thinning_error(profiles: list[LinearProfile]) -> dict:
    """What interpolating the shipped (thinned) table costs against every measured row."""
    errors = np.concatenate(
        [
            np.abs(np.interp(p.num_tokens, t.num_tokens, t.layer_s) / np.array(p.layer_s) - 1.0) * 100.0
            for p, t in ((p, thin(p)) for p in profiles)
        ]
    )
    return errors_summary(errors)


def profile_fit(profiles: list[LinearProfile], steps: list[Path] = ()) -> tuple[dict, dict]:
    """The held-out check of the parametric fit; returns the JSON section and the per-model held-out fits."""
    splits = held_out(profiles)
    section: dict = {"held_out": {}}
    for name, split in splits.items():
        section["held_out"][name] = errors_summary(split["errors"]) | {
            "in_sample_median_abs_pct_err": float(np.median(split["in_sample"]))
        }
    pooled = np.concatenate([s["errors"] for s in splits.values()])
    section |= errors_summary(pooled)
    model_splits = {name: s for name, s in splits.items() if name.startswith("model:")}
    by_model = [p for name in model_splits for p in profiles if f"model:{p.model}" == name]
    section["held_out_models_by_tokens"] = band_errors(
        by_model, np.concatenate([s["errors"] for s in model_splits.values()])
    )
    full = fit_linear(profiles)
    section["in_sample_median_abs_pct_err"] = float(np.median(abs_pct_errors(full, profiles)))
    section["fit"] = vars(full)
    section["table_thinning"] = thinning_error(profiles)
    if steps:
        section["steps"] = step_section(steps, profiles)
    return section, {name.removeprefix("model:"): s["fit"] for name, s in model_splits.items()}


def step_section(paths: list[Path], profiles: list[LinearProfile]) -> dict:
    """Whole steps measured on a GPU: the step fit on them and the per-layer profiles together, its error on them."""
    from serving.sim.steptime_steps import fit_steps, step_errors

    samples = [s for path in paths for s in read_step_csv(path)]
    fit = fit_steps(samples, profiles)
    return {"num_samples": len(samples), "fit": fit.to_json()} | errors_summary(step_errors(fit, samples))


def prices() -> dict:
    """Step times in ms, fitted and datasheet, per simulated GPU and model, and each model's pricing source."""
    out = {}
    for gpu in GPU_PROFILES:
        fitted, datasheet = (CostModel(CostModelConfig(gpu=gpu, step_model=m)) for m in ("fitted", "datasheet"))
        out[gpu] = {}
        for name in fitted.config.models:
            row = {"pricing": fitted.pricing()[name]}
            for label, load in PRICED_LOADS.items():
                for cost in (fitted, datasheet):
                    row[f"{label}.{cost.config.step_model}_ms"] = 1e3 * cost.step_time_s({name: load})
            model = fitted.model(name)
            row |= {
                f"prefill_4096.{c.config.step_model}_ms": 1e3 * c.prefill_s(model, 4096) for c in (fitted, datasheet)
            }
            out[gpu][name] = row
    return out


def plot_profile_fit(profiles: list[LinearProfile], fits: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({p.model for p in profiles})
    fig, axes = plt.subplots(2, (len(models) + 1) // 2, figsize=(4 * ((len(models) + 1) // 2), 8), squeeze=False)
    for ax, model in zip(axes.flat, models):
        for p in (p for p in profiles if p.model == model):
            ax.loglog(p.num_tokens, np.array(p.layer_s) * 1e3, ".", ms=2, label=f"{p.gpu} TP{p.tensor_parallel_size}")
            ax.loglog(p.num_tokens, predict(fits[model], p) * 1e3, "-", lw=0.8, color=ax.lines[-1].get_color())
        ax.set(title=f"{model} (held out)", xlabel="tokens in the step", ylabel="one layer, ms")
        ax.legend(fontsize=6)
    fig.suptitle("Linear operators per layer: measured (dots, Vidur) vs the fit without that model (lines)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True, help="where the figures go")
    parser.add_argument("--profiles", type=Path, default=PROFILES, help="Vidur's <gpu>__<model>__mlp.csv folder")
    parser.add_argument("--steps", type=Path, nargs="*", default=[], help="step CSVs from gpu_profile.py")
    parser.add_argument("--plot", type=Path, default=None, help="(default: next to --json, .png)")
    parser.add_argument("--engine", type=Path, default=None, help="an engine referee report (section engine_vs_sim)")
    parser.add_argument("--run", default=None, help="with --engine: its run, RATE-SEED (e.g. 150-0)")
    args = parser.parse_args(argv)
    if bool(args.engine) != bool(args.run):
        parser.error("--engine and --run go together: an engine referee report and one of its runs (RATE-SEED)")
    profiles = read_vidur_dir(args.profiles)
    section, fits = profile_fit(profiles, args.steps)
    result = {"profile_fit": section, "prices": prices()}
    if args.engine:
        from benchmarks.engine.vs_sim import engine_vs_sim

        result["engine_vs_sim"] = engine_vs_sim(args.engine, args.run)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    plot_profile_fit(profiles, fits, args.plot or args.json.with_suffix(".png"))
    return result


if __name__ == "__main__":
    main()
