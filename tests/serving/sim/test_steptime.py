"""The fitted step-time model: held-out error on a measured profile, monotone in what a step carries, unprofiled
models flagged, config validation, and where it parts from the datasheet model."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from serving.sim.costmodel import MODEL_PROFILES, CostModel, CostModelConfig, StepLoad
from serving.sim.steptime import StepTable
from serving.sim.steptime_fit import abs_pct_errors, fit_linear, thin
from serving.sim.steptime_profiles import read_vidur_dir

PROFILES = Path(__file__).resolve().parents[4] / "shared" / "data" / "gpu-profiles"
needs_profiles = pytest.mark.skipif(not PROFILES.exists(), reason="../shared/data/gpu-profiles is missing")
FITTED, DATASHEET = CostModel(CostModelConfig()), CostModel(CostModelConfig(step_model="datasheet"))
LLAMA = MODEL_PROFILES["llama-3-8b"]


@pytest.fixture(scope="module")
def profiles():
    if not PROFILES.exists():
        pytest.skip("../shared/data/gpu-profiles is missing")
    return read_vidur_dir(PROFILES)


@needs_profiles
def test_a_model_left_out_of_the_fit_is_priced_within_ten_percent(profiles):
    fit = fit_linear([p for p in profiles if p.model != "Meta-Llama-3-8B"])
    held = [p for p in profiles if p.model == "Meta-Llama-3-8B"]
    assert np.median(abs_pct_errors(fit, held)) <= 10.0
    assert np.median(abs_pct_errors(fit, held)) > 0  # a real check, not the data itself


@needs_profiles
def test_the_shipped_table_is_the_fit_and_the_profiles_it_says(profiles):
    shipped = StepTable.load()
    fit = fit_linear(profiles)
    assert np.allclose(list(vars(shipped.fit).values()), list(vars(fit).values()), rtol=1e-3)
    assert [p.name for p in shipped.profiles] == [p.name for p in profiles]
    assert shipped.profiles[0] == thin(profiles[0])


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100", "h200"])
@pytest.mark.parametrize("name", sorted(MODEL_PROFILES))
def test_a_step_costs_more_with_more_tokens_and_more_context(gpu, name):
    cost = CostModel(CostModelConfig(gpu=gpu))
    step = lambda **load: cost.step_time_s({name: StepLoad(**load)})
    decodes = [step(num_decodes=n, decode_context_tokens=n * 1000) for n in (1, 8, 64, 256)]
    prefills = [step(num_decodes=16, decode_context_tokens=16000, prefill_tokens=p) for p in (0, 64, 512, 4096, 16384)]
    contexts = [step(num_decodes=16, decode_context_tokens=c) for c in (0, 1000, 64000)]
    assert all(np.diff(decodes) > 0) and all(np.diff(prefills) > 0) and all(np.diff(contexts) > 0)
    tokens = np.arange(1, 20000, 7)
    linear = [cost.steps.linear_s(cost.model(name), int(t)) for t in tokens]
    assert all(np.diff(linear) >= 0)


def test_each_model_says_how_it_is_priced_and_unprofiled_ones_are_flagged():
    a100, h200 = FITTED.steps, CostModel(CostModelConfig(gpu="h200")).steps
    assert a100.source(LLAMA).is_profiled and a100.source(LLAMA).profile == "a100/Meta-Llama-3-8B/tp1"
    mistral = a100.source(MODEL_PROFILES["mistral-7b"])
    assert mistral.is_profiled and "layer shape of mistral-7b" in mistral.note
    for name in ("qwen2-7b", "qwen2.5-coder-32b", "qwen2-72b", "qwen3-coder-30b-a3b"):
        assert not a100.source(MODEL_PROFILES[name]).is_profiled
    assert not any(h200.source(m).is_profiled for m in MODEL_PROFILES.values())  # no H200 profile at all
    assert set(FITTED.pricing()) == set(MODEL_PROFILES) and "no measured profile" in FITTED.pricing()["qwen2-7b"]
    assert set(DATASHEET.pricing().values()) == {"datasheet"}


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("step_model", "measured", "step_model must be one of fitted, datasheet"),
        ("attention_mbu", 0.0, "attention_mbu"),
        ("attention_mfu", 1.5, "attention_mfu"),
        ("tensor_parallel_size", 0, "tensor_parallel_size"),
        ("max_num_batched_tokens", -1, "max_num_batched_tokens"),
    ],
)
def test_config_rejects_bad_values_by_name(field, value, words):
    with pytest.raises(ValueError, match=words):
        CostModelConfig(**{field: value})


def test_fitted_and_datasheet_agree_on_a_lone_decode_but_only_the_fit_charges_for_batch_size():
    lone = FITTED.decode_s(LLAMA, 1, 1000), DATASHEET.decode_s(LLAMA, 1, 1000)
    assert lone[0] == pytest.approx(lone[1], rel=0.25)
    for cost, grows in ((FITTED, True), (DATASHEET, False)):
        one = cost.step_time_s({"llama-3-8b": StepLoad(1, 64000)})
        many = cost.step_time_s({"llama-3-8b": StepLoad(256, 64000)})  # same KV read, 256 tokens through the layers
        assert (many > one * 1.2) is grows
    # the measured profile's own ratio: 64 decodes beside a 512-token chunk vs 64 decodes alone, in the linear ops
    ratio = FITTED.steps.linear_s(LLAMA, 576) / FITTED.steps.linear_s(LLAMA, 64)
    assert 3.0 < ratio < 4.5


def test_a_lone_prefill_runs_in_chunks_of_the_token_budget_and_a_decode_at_its_mean_context():
    cost = CostModel(CostModelConfig(max_num_batched_tokens=1024))
    chunks = [StepLoad(prefill_tokens=1024, prefill_pair_tokens=1024 * (c + 512)) for c in (0, 1024)]
    steps = sum(cost.step_time_s({"llama-3-8b": s}) for s in chunks)
    assert cost.prefill_s(LLAMA, 2048) == pytest.approx(steps)
    assert CostModelConfig().token_budget == 2048 and CostModelConfig(gpu="h200").token_budget == 8192
    assert cost.prefill_s(LLAMA, 0) == 0.0 and cost.decode_s(LLAMA, 0, 500) == 0.0
    step = cost.step_time_s({"llama-3-8b": StepLoad(1, 550)})
    assert cost.decode_s(LLAMA, 100, 500) == pytest.approx(100 * step)


def test_moe_reads_more_experts_as_its_batch_grows_and_quantized_weights_read_fewer_bytes():
    moe = MODEL_PROFILES["qwen3-coder-30b-a3b"].layer_shape
    assert moe.experts_read(np.array([1]))[0] == pytest.approx(8) and moe.experts_read(np.array([64]))[0] > 100
    steps = FITTED.steps
    int4 = replace(MODEL_PROFILES["qwen2-72b"], name="qwen2-72b-int4")
    bf16 = replace(int4, name="qwen2-72b-bf16", weight_bytes_per_param=2.0)
    assert steps.parametric_layer_s(int4, 1) < 0.5 * steps.parametric_layer_s(bf16, 1)  # memory-bound: bytes
    assert steps.parametric_layer_s(int4, 8192) > 0.8 * steps.parametric_layer_s(bf16, 8192)  # compute-bound
