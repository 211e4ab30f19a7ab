"""vLLM 0.32's Scheduler, or MaestroScheduler, driven step by step in process: no model, no engine process.

A KV pool of `num_blocks` blocks of 16 tokens and a runner that samples token 7 for every request that finished its
prefill (vLLM's own scheduler tests work this way). A request arrives at its step, which is its `arrival_time`, and
MaestroScheduler runs on the step clock (a decode step per predicted token), so every run of a scenario is the same.

Run by .venv-vllm's python with the repository on PYTHONPATH: `python -m tests.gateway.vllm_scheduler_steps
SCENARIOS.json` prints, for each scenario of the list, per step the requests scheduled (with their token counts) and
those preempted, and the order in which requests finished.

SCENARIO: {"scheduler": "vllm" | "maestro", "policy": "fcfs" | "priority", "num_blocks": N, "max_num_seqs": N,
"model_dir": DIR, "maestro_config": {...} (over STEP_CLOCK), "requests": [{"id", "step", "prompt_tokens",
"max_tokens", "priority", "hints": {...} | null}]}
"""
from __future__ import annotations

import json
import sys

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from serving.vllm_plugin.scheduler import MaestroScheduler

BLOCK_SIZE = 16
TOKEN = 7
MAX_MODEL_LEN = 1024
STEP_CLOCK = {"clock": "step", "decode_s_per_token": 1.0}


def make_scheduler(scenario: dict) -> Scheduler:
    model = ModelConfig(model=scenario["model_dir"], max_model_len=MAX_MODEL_LEN, skip_tokenizer_init=True)
    scheduler_config = SchedulerConfig(max_num_seqs=scenario["max_num_seqs"], max_num_batched_tokens=MAX_MODEL_LEN,
                                       max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False,
                                       policy=scenario["policy"], enable_chunked_prefill=True)
    cache = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
    maestro = STEP_CLOCK | scenario.get("maestro_config", {})
    vllm_config = VllmConfig(model_config=model, scheduler_config=scheduler_config, cache_config=cache,
                             additional_config={"maestro_scheduler": maestro})
    cache.num_gpu_blocks = scenario["num_blocks"]
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_config = KVCacheConfig(num_blocks=scenario["num_blocks"], kv_cache_tensors=[],
                              kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    cls = MaestroScheduler if scenario["scheduler"] == "maestro" else Scheduler
    return cls(vllm_config=vllm_config, kv_cache_config=kv_config, block_size=BLOCK_SIZE,
               structured_output_manager=StructuredOutputManager(vllm_config), log_stats=True)


def make_request(spec: dict) -> Request:
    extra = {"maestro": spec["hints"]} if spec.get("hints") else None
    params = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True, extra_args=extra)
    # Distinct prompts (no prefix-cache hits between requests).
    prompt = [100 + sum(map(ord, spec["id"])) % 1000] + [1] * (spec["prompt_tokens"] - 1)
    return Request(spec["id"], prompt, params, None, arrival_time=float(spec["step"]), priority=spec.get("priority", 0),
                   block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256))


def runner_output(scheduler: Scheduler, output) -> ModelRunnerOutput:
    ids = list(output.num_scheduled_tokens)
    sampled = [[TOKEN] if scheduler.requests[i].num_computed_tokens >= scheduler.requests[i].num_tokens else []
               for i in ids]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)}, sampled_token_ids=sampled)


def run(scenario: dict) -> dict:
    init_none_hash(sha256)
    scheduler = make_scheduler(scenario)
    pending = sorted(scenario["requests"], key=lambda r: r["step"])
    steps, finished = [], []
    for step in range(100_000):
        while pending and pending[0]["step"] <= step:
            scheduler.add_request(make_request(pending.pop(0)))
        if not pending and not scheduler.has_requests():
            break
        output = scheduler.schedule()
        steps.append({"scheduled": dict(output.num_scheduled_tokens), "preempted": sorted(output.preempted_req_ids)})
        engine_outputs = scheduler.update_from_output(output, runner_output(scheduler, output))
        finished += [o.request_id for outs in engine_outputs.values() for o in outs.outputs if o.finish_reason]
    result = {"steps": steps, "finished": finished}
    if isinstance(scheduler, MaestroScheduler):
        result["decisions"] = scheduler.decisions.snapshot()
    return result


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps([run(scenario) for scenario in json.load(f)]))
