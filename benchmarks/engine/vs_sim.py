r"""The simulator checked against the real engine: the engine replay's workload through `serving.sim`, side by side.

    .venv/bin/python -m benchmarks.engine.vs_sim --engine OUT.json --run RATE-SEED

Reads one run of the referee's engine mode (`python -m benchmarks.referee --engine --json OUT.json`: the plans and step
records in OUT/RATE-SEED/, the same workflows, arrivals, tool gaps, deadlines and each arm's predictions), and runs the
plans on one simulated node priced by the run's own clock (`plan_cost` of the plan's clock): under `--clock fitted`,
vLLM-CPU's fitted step time (`benchmarks/engine/step_fit.py`), so that the engine's steps and the simulator's are priced
by one model and only what each puts in a step differs; under `--clock step`, `step_cost` (a decode step costs one step
whatever the batch, a prefill its tokens over the engine's prefill chunk). The KV pool and block are the engine's. Each
engine arm runs as the simulator's system of the same kind: `vllm-fcfs` as `vllm` (on-demand KV, preempt on overflow),
Maestro's arms as `maestro` fed the same predictions, in the engine's MaestroScheduler order (`--policy`) and turning
nothing away (`sim_system`). vLLM's priority arms have no simulated counterpart. Figures are in the run's clock units
(engine steps under `--clock step`), over the measured workflows of the run; preemptions over the whole run (the
engine's stops once the measured workflows ended, the simulator's runs every workflow to its end). Writes JSON and a
Markdown table next to `--out`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.engine.config import BLOCK_SIZE, KV_BYTES_PER_TOKEN, MODEL, EngineConfig, plan_cost
from benchmarks.engine.report import run_figures
from maestro.prediction import OutputSize
from serving.core.residency import ResidencyConfig
from serving.core.scheduler.base import Policy
from serving.core.systems import System, get_system
from serving.sim.engine import ClusterConfig, Simulator
from serving.sim.workload import SimStage, SimWorkflow

REPO = Path(__file__).resolve().parents[2]


def sim_system(arm: str, policy: str) -> System | None:
    """The simulator's system for an engine arm: `vllm` for vllm-fcfs; for a Maestro arm, Maestro with the order the
    engine's MaestroScheduler keeps (`policy`) and nothing turned away, as the plugin turns nothing away."""
    if arm == "vllm-fcfs":
        return get_system("vllm")
    if arm.startswith("maestro["):
        return get_system("maestro").with_overrides(scheduler=Policy(policy), triage_rejects=False)
    return None


def fitted_cluster(config: dict, clock: dict | None = None) -> ClusterConfig:
    """One node on the engine run's clock (`plan_cost` of the plan's `clock`), with the engine's KV pool, block and
    batch limit."""
    engine = EngineConfig(**config)
    block_bytes = BLOCK_SIZE * KV_BYTES_PER_TOKEN  # vLLM pages with no virtual range per request: overcommit is moot
    return ClusterConfig(
        num_nodes=1,
        cost=plan_cost(engine, clock),
        kv_pool_bytes=engine.kv_tokens * KV_BYTES_PER_TOKEN - block_bytes,
        page_bytes=block_bytes,
        overcommit=1000.0,
        placement=[(MODEL,)],
        max_batch_seqs=engine.max_num_seqs,
        residency=ResidencyConfig(gpu_weight_budget_bytes=1 << 30),
        grow_chunk_tokens=BLOCK_SIZE,
        num_tool_workers=4096,
        show_progress=False,
    )  # the replay gives every tool call its own time


def sim_workflows(plan: dict, step_s: float) -> list[SimWorkflow]:
    """The plan's workflows as the simulator's, times in seconds of `step_s` a step."""
    workflows = []
    for wf in plan["workflows"]:
        workflow = SimWorkflow(
            wf["id"], wf["app"], wf["interactive"], wf["slo_steps"] * step_s, arrival_s=wf["arrival_step"] * step_s
        )
        for spec in wf["stages"]:
            hints = spec.get("hints") or {}
            workflow.stages.append(
                SimStage(
                    workflow,
                    spec["index"],
                    spec["id"],
                    "stage",
                    MODEL,
                    list(spec["parents"]),
                    spec["output_tokens"],
                    spec["is_tool_call"],
                    tool_exec_s=spec["tool_gap_steps"] * step_s,
                    prompt_tokens=spec["prompt_tokens"],
                    session_parent=spec["session_parent"],
                    max_tokens=spec["max_tokens"],
                    children=list(spec["children"]),
                    size=OutputSize(
                        tokens_pred=hints.get("tokens_pred", spec["max_tokens"]),
                        tokens_reserve=hints.get("tokens_reserve", spec["max_tokens"]),
                    ),
                )
            )
        workflow.num_stages_left = len(workflow.stages)
        workflows.append(workflow)
    return workflows


def latency_figures(met, latency_steps, preemptions: int) -> dict:
    return {
        "preemptions": preemptions,
        "slo_attainment": float(np.mean(met)),
        "workflow_latency_steps": {
            "mean": float(np.mean(latency_steps)),
            "p95": float(np.percentile(latency_steps, 95)),
        },
    }


def simulate(plan: dict, config: dict) -> dict:
    """The plan on the fitted node; figures over the plan's measured workflows, as the engine's."""
    step_s, system = config["step_s"], sim_system(plan["arm"]["name"], config.get("policy", "least-slack"))
    workflows = sim_workflows(plan, step_s)
    summary = Simulator(fitted_cluster(config, plan.get("clock")), system, workflows).run().summary
    first, last = plan["measured"]
    measured = workflows[first:last]
    latency = [(w.done_s - w.arrival_s) / step_s if w.done_s >= 0 else np.inf for w in measured]
    met = [w.done_s >= 0 and w.done_s - w.arrival_s <= w.slo_s for w in measured]
    name = system.name if system.name == "vllm" else f"maestro, {system.scheduler.value}"
    return {"system": name, **latency_figures(met, latency, summary["num_preemptions"])}


def rank(rows: dict) -> list[str]:
    return sorted(rows, key=lambda arm: rows[arm]["workflow_latency_steps"]["p95"])


def compare(config: dict, run: Path) -> dict:
    engine, sim = {}, {}
    for plan_path in sorted(run.glob("plan_*.json")):
        plan = json.loads(plan_path.read_text())
        arm = plan["arm"]["name"]
        if sim_system(arm, config.get("policy", "least-slack")) is None:
            continue
        steps = json.loads((run / f"steps_{arm}.json").read_text())
        figures = run_figures(plan, steps)
        preemptions = sum(r["num_preemptions"] for records in steps["stages"] for r in records)
        engine[arm] = latency_figures(figures["met"], figures["latency_steps"], preemptions)
        sim[arm] = simulate(plan, config)
    return {"engine": engine, "sim": sim, "ranking_by_workflow_p95": {"engine": rank(engine), "sim": rank(sim)}}


def discordant_pairs(engine: dict, sim: dict) -> list[tuple[str, str]]:
    """Pairs of arms that the engine and the simulator order oppositely by SLO attainment (a tie on either side is no
    disagreement)."""
    arms = sorted(engine)
    return [
        (a, b) for i, a in enumerate(arms) for b in arms[i + 1 :] if (engine[a] - engine[b]) * (sim[a] - sim[b]) < 0
    ]


def engine_vs_sim(report_path: Path, run: str) -> dict:
    """The fidelity section `engine_vs_sim` of one engine run (RATE-SEED of the referee's engine report at
    `report_path`; `python -m benchmarks.sim.fidelity` calls it)."""
    report = json.loads(report_path.read_text())
    return section(compare(report["engine"]["engine"], report_path.with_suffix("") / run), run, report.get("clock"))


def section(result: dict, run: str, clock: str | None) -> dict:
    """Per arm that has a simulated counterpart, SLO attainment and workflow p95 (clock units) on the engine and in
    the simulator; whether they rank the arms alike by SLO (`rank_agree`: no pair ordered oppositely), the largest SLO
    gap (pp) and p95 gap (% of the engine's), and whether the issue's bar is met (`done`: ranks agree, every SLO
    within 2 pp, every p95 within 10 %)."""
    sides = ("engine", "sim")
    arms = {
        arm: {
            side: {
                "slo_attainment": result[side][arm]["slo_attainment"],
                "workflow_p95_steps": result[side][arm]["workflow_latency_steps"]["p95"],
                "preemptions": result[side][arm]["preemptions"],
            }
            for side in sides
        }
        for arm in result["sim"]
    }
    slo = {side: {arm: arms[arm][side]["slo_attainment"] for arm in arms} for side in sides}
    p95 = [abs(a["sim"]["workflow_p95_steps"] / a["engine"]["workflow_p95_steps"] - 1) * 100 for a in arms.values()]
    discordant = discordant_pairs(slo["engine"], slo["sim"])
    gap_pp = max(abs(slo["engine"][arm] - slo["sim"][arm]) * 100 for arm in arms)
    return {
        "run": run,
        "clock": clock or "step",
        "arms": arms,
        "rank_agree": not discordant,
        "discordant_pairs": discordant,
        "max_slo_gap_pp": round(gap_pp, 2),
        "max_p95_gap_pct": round(max(p95), 2),
        "done": not discordant and gap_pp <= 2.0 and max(p95) <= 10.0,
    }


def table(result: dict) -> str:
    lines = [
        "| arm (sim system) | preemptions engine / sim | workflow p95 steps engine / sim | "
        "workflow mean steps engine / sim | SLO engine / sim |",
        "|---|---|---|---|---|",
    ]
    for arm, sim in result["sim"].items():
        eng = result["engine"][arm]
        lines.append(
            f"| {arm} ({sim['system']}) | {eng['preemptions']} / {sim['preemptions']} | "
            f"{eng['workflow_latency_steps']['p95']:.0f} / {sim['workflow_latency_steps']['p95']:.0f} | "
            f"{eng['workflow_latency_steps']['mean']:.0f} / {sim['workflow_latency_steps']['mean']:.0f} | "
            f"{eng['slo_attainment']:.3f} / {sim['slo_attainment']:.3f} |"
        )
    ranking = result["ranking_by_workflow_p95"]
    lines.append(
        f"\nRanked by workflow p95, best first: engine {', '.join(ranking['engine'])}; "
        f"simulator {', '.join(ranking['sim'])}."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--engine",
        type=Path,
        default=REPO / "benchmarks" / "results" / "referee_engine.json",
        help="the referee's engine report; its runs are in the folder of the same name (default: %(default)s)",
    )
    parser.add_argument("--run", required=True, help="which run: RATE-SEED (a folder under the report's)")
    parser.add_argument("--out", type=Path, default=None, help="(default: next to --engine, *_vs_sim_RUN.json)")
    args = parser.parse_args(argv)
    run = args.engine.with_suffix("") / args.run
    if not args.engine.exists() or not run.is_dir():
        parser.error(
            f"--engine {args.engine} / --run {args.run}: not found; run `python -m benchmarks.referee "
            f"--engine --json {args.engine}` first"
        )
    report = json.loads(args.engine.read_text())
    result = compare(report["engine"]["engine"], run)
    result["engine_vs_sim"] = section(result, args.run, report.get("clock"))
    out = args.out or args.engine.with_name(f"{args.engine.stem}_vs_sim_{args.run}.json")
    out.write_text(json.dumps(result, indent=2))
    text = table(result)
    out.with_suffix(".md").write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
