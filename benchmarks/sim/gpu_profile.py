r"""Time a real vLLM engine's steps on an NVIDIA GPU against what they carry; write the step-profile CSV.

    python -m benchmarks.sim.gpu_profile --model meta-llama/Meta-Llama-3-8B --out steps.csv [--gpu a100-80gb]
    python -m benchmarks.sim.gpu_profile --model M --out X --dry-run     # print the plan, touch no GPU

For every planned batch (decodes × their context × a prefill chunk beside them) it starts `num_decodes` requests
with prompts of `context_tokens` random token ids, steps the engine until all of them decode, then times
`--repeats` steps, each with a fresh request of `prefill_tokens` prompt tokens added just before (0: pure decode).
What each timed step carried is read from the scheduler's requests (computed tokens before and after the step), not
assumed: `num_decodes`, their summed context, the prefill tokens, their query-key pairs and requests. Each timed
step is one row of the CSV (`serving.sim.steptime_profiles.STEP_CSV_COLUMNS`, docs/cost.md):
gpu, hbm_bytes_per_s, peak_flops (the datasheet figures of `--gpu`), the model's shape from its config, what the
step carried, and `step_s` (wall time of `LLMEngine.step()`, the engine core in this process). Prefix caching is
off so a chunk is computed, not found. `benchmarks.sim.fidelity --steps CSV` fits and checks the step model on it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serving.sim.costmodel import GPU_PROFILES, StepLoad
from serving.sim.steptime_profiles import StepSample, write_step_csv

DECODES = (1, 4, 16, 64, 128)
CONTEXTS = (128, 1024, 4096)
PREFILLS = (0, 128, 512, 2048)


@dataclass(frozen=True)
class Batch:
    """One planned step shape: `num_decodes` sequences at `context_tokens` each, a `prefill_tokens` chunk beside."""

    num_decodes: int
    context_tokens: int
    prefill_tokens: int


def plan_batches(
    decodes=DECODES, contexts=CONTEXTS, prefills=PREFILLS, budget_tokens: int = 8192, max_model_len: int = 8192
) -> list[Batch]:
    """Every combination that fits one step's token budget and the context limit (with room to decode)."""
    return [
        Batch(n, c, p)
        for n, c, p in itertools.product(decodes, contexts, prefills)
        if n + p <= budget_tokens and c + 64 <= max_model_len and p <= max_model_len
    ]


def step_load(before: dict[str, tuple[int, int]], after: dict[str, int]) -> StepLoad:
    """What one step carried, from each request's (computed tokens, prompt tokens) before it and computed after.
    A request gone after the step finished in it: vLLM ends a request only on a sampled token, so it computed the
    rest of its prompt (a prefill) or one token (a decode)."""
    load = StepLoad()
    for request_id, (computed, prompt) in before.items():
        done = after.get(request_id, max(computed + 1, prompt)) - computed
        if done <= 0:
            continue
        if computed >= prompt and done == 1:
            load.num_decodes += 1
            load.decode_context_tokens += computed
        else:
            load.prefill_tokens += done
            load.prefill_pair_tokens += done * (computed + done / 2)
            load.num_prefills += 1
    return load


def sample_of(load: StepLoad, step_s: float, gpu: str, model: dict) -> StepSample:
    profile = GPU_PROFILES[gpu]
    return StepSample(
        gpu=gpu,
        hbm_bytes_per_s=profile.hbm_bytes_per_s,
        peak_flops=profile.peak_flops,
        **model,
        num_decodes=load.num_decodes,
        decode_context_tokens=load.decode_context_tokens,
        prefill_tokens=load.prefill_tokens,
        prefill_pair_tokens=load.prefill_pair_tokens,
        num_prefills=load.num_prefills,
        step_s=step_s,
    )


def model_shape(hf_config, name: str, tensor_parallel_size: int, weight_bytes_per_param: float) -> dict:
    heads = hf_config.num_attention_heads
    return {
        "model": name,
        "tensor_parallel_size": tensor_parallel_size,
        "num_layers": hf_config.num_hidden_layers,
        "hidden_size": hf_config.hidden_size,
        "num_q_heads": heads,
        "num_kv_heads": getattr(hf_config, "num_key_value_heads", heads),
        "head_dim": getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
        "ffn_dim": hf_config.intermediate_size,
        "vocab_size": hf_config.vocab_size,
        "weight_bytes_per_param": weight_bytes_per_param,
    }


class Profiler:
    """A vLLM engine stepped by hand (imported only here: it needs vLLM and a GPU)."""

    def __init__(self, args: argparse.Namespace):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        engine_args = EngineArgs(
            model=args.model,
            tensor_parallel_size=args.tp,
            max_model_len=args.max_model_len,
            max_num_seqs=max(args.decodes) + 2,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_prefix_caching=False,
            skip_tokenizer_init=True,
            load_format=args.load_format,
            **({"kv_cache_memory_bytes": args.kv_cache_bytes} if args.kv_cache_bytes else {}),
        )
        self.engine = LLMEngine.from_engine_args(engine_args)
        self.scheduler = self.engine.engine_core.engine_core.scheduler
        hf = self.engine.model_config.hf_config
        self.model = model_shape(hf, args.model, args.tp, args.weight_bytes_per_param)
        self.rng, self.vocab, self.count = np.random.default_rng(0), hf.vocab_size, itertools.count()

    def add(self, prompt_tokens: int, max_tokens: int) -> str:
        from vllm import SamplingParams

        ids = self.rng.integers(100, self.vocab - 100, prompt_tokens).tolist()
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False, temperature=0.0)
        return self.engine.add_request(f"r{next(self.count)}", {"prompt_token_ids": ids}, params)

    def computed(self) -> dict[str, tuple[int, int]]:
        return {rid: (r.num_computed_tokens, r.num_prompt_tokens) for rid, r in self.scheduler.requests.items()}

    def run(self, batch: Batch, repeats: int, gpu: str) -> list[StepSample]:
        ids = [self.add(batch.context_tokens, 10 * repeats + 64) for _ in range(batch.num_decodes)]
        while any(self.scheduler.requests[r].num_computed_tokens < batch.context_tokens for r in ids):
            self.engine.step()
        samples = []
        for _ in range(repeats):
            if batch.prefill_tokens:
                ids.append(self.add(batch.prefill_tokens, 1))
            before = self.computed()
            started = time.perf_counter()
            self.engine.step()
            step_s = time.perf_counter() - started
            after = {rid: r.num_computed_tokens for rid, r in self.scheduler.requests.items()}
            samples.append(sample_of(step_load(before, after), step_s, gpu, self.model))
        self.engine.abort_request([r for r in ids if r in self.scheduler.requests], internal=True)
        while self.engine.has_unfinished_requests():
            self.engine.step()
        return samples


def int_list(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def detect_gpu() -> str:
    import torch

    name = torch.cuda.get_device_name(0).lower()
    for key in ("h200", "h100", "a100"):
        if key in name:
            return "a100-80gb" if key == "a100" else key
    raise ValueError(
        f"GPU '{name}' has no datasheet entry in GPU_PROFILES: pass --gpu with one of {list(GPU_PROFILES)}"
    )


def main(argv: list[str] | None = None) -> list[StepSample]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a Hugging Face model name or folder vLLM can load")
    parser.add_argument("--out", type=Path, required=True, help="the step-profile CSV to write")
    parser.add_argument("--gpu", default=None, help=f"datasheet entry, one of {list(GPU_PROFILES)} (default: detect)")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--weight-bytes-per-param", type=float, default=2.0, help="1 for fp8, 0.5 for int4")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per batch")
    parser.add_argument("--kv-cache-bytes", type=int, default=0, help="KV pool size (default: vLLM sizes it)")
    parser.add_argument("--load-format", default="dummy", help="dummy: random weights (step time is the same)")
    parser.add_argument("--decodes", type=int_list, default=DECODES, help="decodes a step, comma-separated")
    parser.add_argument("--contexts", type=int_list, default=CONTEXTS, help="each decode's context, comma-separated")
    parser.add_argument("--prefills", type=int_list, default=PREFILLS, help="prefill chunk tokens, comma-separated")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = parser.parse_args(argv)
    plan = plan_batches(args.decodes, args.contexts, args.prefills, args.max_num_batched_tokens, args.max_model_len)
    if args.dry_run:
        print("\n".join(f"{b.num_decodes} decodes @ {b.context_tokens} + prefill {b.prefill_tokens}" for b in plan))
        return []
    gpu = args.gpu or detect_gpu()
    if gpu not in GPU_PROFILES:
        raise ValueError(f"--gpu '{gpu}' has no datasheet entry; known: {', '.join(GPU_PROFILES)}")
    profiler = Profiler(args)
    samples = [s for batch in plan for s in profiler.run(batch, args.repeats, gpu)]
    write_step_csv(args.out, samples)
    print(f"{len(samples)} steps -> {args.out}")
    return samples


if __name__ == "__main__":
    main()
