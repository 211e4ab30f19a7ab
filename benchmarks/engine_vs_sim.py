r"""The simulator checked against the real engine: the engine replay's workload through `serving.sim`, side by side.

    .venv/bin/python -m benchmarks.engine_vs_sim [--engine benchmarks/results/engine_replay.json]

Reads the engine replay's report and the plans it ran (the same workflows, arrivals, tool gaps, SLOs and each arm's
predictions), and runs them on one simulated node whose cost profile is fitted to the engine's step clock: a decode
step costs one step whatever the batch, a prefill costs its tokens over the engine's prefill chunk, the KV pool and
block are the engine's. Each engine arm runs as the simulator's system of the same kind: vLLM fcfs as `vllm`
(on-demand KV, preempt on overflow), Maestro's arms as `maestro` fed the same predictions. vLLM `priority` has no
simulated counterpart. Figures are in engine steps. Writes JSON and a Markdown table next to `--out`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.engine_replay import BLOCK_SIZE, KV_BYTES_PER_TOKEN
from serving.residency import ResidencyConfig
from serving.sim.costmodel import CostModelConfig, GPUProfile, ModelProfile
from serving.sim.engine import ClusterConfig, Simulator
from serving.systems import get_system
from serving.sim.workload import SimStage, SimWorkflow

REPO = Path(__file__).resolve().parent.parent
SIM_SYSTEM = {"fcfs": "vllm", "maestro": "maestro", "maestro-oracle": "maestro", "maestro-prior": "maestro",
              "maestro-none": "maestro"}
MODEL = "engine-tiny"
LINEAR_PARAMS = 1e6  # the fitted profile's FLOPs per prefill token are 2 × this; only their ratio to the GPU's counts


def fitted_cluster(config: dict) -> ClusterConfig:
    """One node whose step takes `step_s` and whose prefill runs `max_num_batched_tokens` a step (the engine's)."""
    step_s, chunk = config["step_s"], config["max_num_batched_tokens"]
    # KV bytes a token as the tiny model's (2 × 1 layer × 1 head × head_dim × 2 B); attention width 1, so prefill
    # is the linear part alone.
    model = ModelProfile(MODEL, LINEAR_PARAMS, LINEAR_PARAMS, num_layers=1, hidden_size=1, num_kv_heads=1,
                         head_dim=KV_BYTES_PER_TOKEN // 4, weight_bytes_per_param=1e-9)
    gpu = GPUProfile("engine-steps", hbm_bytes=64e9, hbm_bytes_per_s=1e18, peak_flops=2 * LINEAR_PARAMS * chunk / step_s)
    cost = CostModelConfig(gpu="engine-steps", prefill_mfu=1.0, decode_mbu=1.0, step_overhead_s=step_s,
                           models={MODEL: model}, gpus={"engine-steps": gpu})
    block_bytes = BLOCK_SIZE * KV_BYTES_PER_TOKEN  # vLLM pages with no virtual range per request: overcommit is moot
    return ClusterConfig(num_nodes=1, cost=cost, kv_pool_bytes=config["kv_tokens"] * KV_BYTES_PER_TOKEN - block_bytes,
                         page_bytes=block_bytes, overcommit=1000.0, placement=[(MODEL,)],
                         max_batch_seqs=config["max_num_seqs"], residency=ResidencyConfig(gpu_weight_budget_bytes=1 << 30),
                         grow_chunk_tokens=BLOCK_SIZE, num_tool_workers=4096, show_progress=False)  # the replay gives every tool call its own time


def sim_workflows(plan: dict, step_s: float) -> list[SimWorkflow]:
    """The plan's workflows as the simulator's, times in seconds of `step_s` a step."""
    workflows = []
    for wf in plan["workflows"]:
        workflow = SimWorkflow(wf["id"], wf["app"], wf["interactive"], wf["slo_steps"] * step_s,
                               arrival_s=wf["arrival_step"] * step_s)
        for spec in wf["stages"]:
            hints = spec.get("hints") or {}
            workflow.stages.append(SimStage(
                workflow, spec["index"], spec["id"], "stage", MODEL, list(spec["parents"]), spec["output_tokens"],
                spec["is_tool_call"], tool_exec_s=spec["tool_gap_steps"] * step_s, prompt_tokens=spec["prompt_tokens"],
                session_parent=spec["session_parent"], max_tokens=spec["max_tokens"], children=list(spec["children"]),
                tokens_pred=hints.get("tokens_pred", spec["max_tokens"]),
                tokens_reserve=hints.get("tokens_reserve", spec["max_tokens"])))
        workflow.num_stages_left = len(workflow.stages)
        workflows.append(workflow)
    return workflows


def simulate(plan: dict, config: dict) -> dict:
    step_s = config["step_s"]
    system = SIM_SYSTEM[plan["arm"]["name"]]
    summary = Simulator(fitted_cluster(config), get_system(system), sim_workflows(plan, step_s)).run().summary
    return {"system": system, "preemptions": summary["num_preemptions"], "slo_attainment": summary["slo_attainment"],
            "workflow_latency_steps": {"mean": summary["e2e_s"]["mean"] / step_s,
                                       "p95": summary["e2e_s"]["p95"] / step_s},
            "makespan_steps": summary["makespan_s"] / step_s}


def rank(rows: dict, key: str) -> list[str]:
    return sorted(rows, key=lambda arm: rows[arm][key])


def compare(report: dict, work: Path) -> dict:
    engine, sim = {}, {}
    for arm, figures in report["arms"].items():
        if arm not in SIM_SYSTEM:
            continue
        plan = json.loads((work / f"plan_{arm}.json").read_text())
        sim[arm] = simulate(plan, report["config"])
        engine[arm] = {"preemptions": figures["preemptions"], "slo_attainment": figures["slo_attainment"],
                       "workflow_latency_steps": figures["workflow_latency_steps"]}
    p95 = {a: {"p95": r["workflow_latency_steps"]["p95"]} for a, r in engine.items()}
    sim_p95 = {a: {"p95": r["workflow_latency_steps"]["p95"]} for a, r in sim.items()}
    return {"engine": engine, "sim": sim, "ranking_by_workflow_p95": {"engine": rank(p95, "p95"),
                                                                       "sim": rank(sim_p95, "p95")}}


def table(result: dict) -> str:
    lines = ["| arm (sim system) | preemptions engine / sim | workflow p95 steps engine / sim | "
             "workflow mean steps engine / sim | SLO engine / sim |", "|---|---|---|---|---|"]
    for arm, sim in result["sim"].items():
        eng = result["engine"][arm]
        lines.append(f"| {arm} ({sim['system']}) | {eng['preemptions']} / {sim['preemptions']} | "
                     f"{eng['workflow_latency_steps']['p95']:.0f} / {sim['workflow_latency_steps']['p95']:.0f} | "
                     f"{eng['workflow_latency_steps']['mean']:.0f} / {sim['workflow_latency_steps']['mean']:.0f} | "
                     f"{eng['slo_attainment']:.3f} / {sim['slo_attainment']:.3f} |")
    ranking = result["ranking_by_workflow_p95"]
    lines.append(f"\nRanked by workflow p95, best first: engine {', '.join(ranking['engine'])}; "
                 f"simulator {', '.join(ranking['sim'])}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", type=Path, default=REPO / "benchmarks" / "results" / "engine_replay.json",
                        help="the engine replay's report; its plans are in the folder of the same name (default: "
                             "%(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="(default: next to --engine, *_vs_sim.json)")
    args = parser.parse_args(argv)
    if not args.engine.exists():
        parser.error(f"--engine {args.engine} not found: run `python -m benchmarks.engine_replay` first")
    report = json.loads(args.engine.read_text())
    result = compare(report, args.engine.with_suffix(""))
    out = args.out or args.engine.with_name(args.engine.stem + "_vs_sim.json")
    out.write_text(json.dumps(result, indent=2))
    text = table(result)
    out.with_suffix(".md").write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
