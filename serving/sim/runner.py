"""Run a scenario under several policies on the same workload, and write JSON + plots."""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from serving.core.systems import get_system
from serving.sim.arrivals import arrival_times
from serving.sim.costmodel import CostModel
from serving.sim.engine import Simulator
from serving.sim.predictions import PredictionConfig, annotate
from serving.sim.scenarios import Regime, Scenario
from serving.sim.slo import SLOConfig, apply_slo
from serving.sim.workload import SimWorkflow, add_context, catalog_workflows, map_models, reset, trace_workflows


@dataclass
class RunConfig:
    policies: tuple[str, ...]
    seed: int = 0
    arrivals: str = "poisson"  # poisson | bursty | path to an arrival trace
    num_workflows: int | None = None  # default: scenario's workflows_per_node × nodes (traces: the file's)
    rate_per_s: float | None = None  # default: scenario's rate_per_node_s × nodes
    traces: str | None = None
    model_map: dict[str, str] | None = None  # trace model name -> cost profile (others: the scenario's default)
    predictions: PredictionConfig = None
    regimes: tuple[str, ...] | None = None
    slo: SLOConfig = None  # default: 5 × each workflow's unloaded critical path (serving/sim/slo.py)

    def __post_init__(self):
        for name in self.policies:
            get_system(name)
        self.predictions = self.predictions or PredictionConfig(seed=self.seed)
        self.slo = self.slo or SLOConfig()


def default_model(scenario: Scenario) -> str:
    """The cost profile of a stage whose model the scenario does not know: its one model, or the first placed."""
    return scenario.model_override or scenario.cluster.placement[0][0]


def build_workload(scenario: Scenario, run: RunConfig, regime: Regime) -> list[SimWorkflow]:
    nodes = scenario.cluster.num_nodes
    if run.traces:
        from maestro.contract import read_traces

        trace = read_traces(run.traces)
        if trace.errors:
            warnings.warn(trace.report(limit=5), stacklevel=2)
        workflows = trace_workflows(trace.stages, default_model(scenario), run.num_workflows, run.seed)
        if not workflows:
            raise ValueError(f"{run.traces}: no stage with output_tokens to replay ({trace.report(limit=5)})")
    else:
        num = run.num_workflows or scenario.workflows_per_node * nodes
        workflows = catalog_workflows(num, run.seed, scenario.apps, scenario.model_override)
    known = {scenario.model_override} if scenario.model_override else scenario.cluster.cost.models
    map_models(workflows, known, default_model(scenario), None if scenario.model_override else run.model_map)
    if regime.context_tokens or regime.tool_result_tokens:
        add_context(workflows, regime.context_tokens, regime.tool_result_tokens, run.seed)
    apply_slo(workflows, CostModel(scenario.cluster.cost), run.slo)  # after add_context: prompts set latency
    rate = run.rate_per_s or scenario.rate_per_node_s * nodes
    for workflow, at in zip(workflows, arrival_times(run.arrivals, len(workflows), rate, run.seed)):
        workflow.arrival_s = float(at)
    annotate(workflows, run.predictions)
    return workflows


def run_scenario(scenario: Scenario, run: RunConfig) -> dict:
    results = {}
    regimes = [r for r in scenario.regimes if not run.regimes or r.name in run.regimes]
    for regime in regimes:
        workflows = build_workload(scenario, run, regime)
        per_policy = {}
        for name in run.policies:
            reset(workflows)
            started = time.perf_counter()
            recorder = Simulator(scenario.cluster, get_system(name), workflows).run()
            per_policy[name] = dict(recorder.summary, wall_s=time.perf_counter() - started)
        results[regime.name] = per_policy
    return {
        "scenario": scenario.name,
        "nodes": scenario.cluster.num_nodes,
        "gpu": scenario.cluster.cost.gpu,
        "seed": run.seed,
        "arrivals": run.arrivals,
        "predictions": run.predictions.source,
        "traces": run.traces,
        "default_model": default_model(scenario),
        "model_map": run.model_map or {},
        "slo": {"mode": run.slo.mode, "slo_scale": run.slo.slo_scale},
        "host_cpu": scenario.cluster.host_cpu,
        "results": results,
        "comparisons": compare(results),
    }


def _ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def compare(results: dict) -> dict:
    """The headline comparisons of the issue, where both sides ran."""
    out = {}
    for regime, by_policy in results.items():
        row = {}
        if "maestro" in by_policy and "edf" in by_policy:
            m, e = by_policy["maestro"], by_policy["edf"]
            row["maestro_vs_edf"] = {
                "slo_attainment_pp": 100 * (m["slo_attainment"] - e["slo_attainment"]),
                "kv_reserved_frac_vs_maxlen": m["kv_reserved_frac_vs_maxlen"],
                "interactive_queue_delay_ratio": _ratio(
                    m["interactive_queue_delay_s"]["mean"], e["interactive_queue_delay_s"]["mean"]
                ),
                "oom_rate": m["oom_rate"],
            }
        baselines = {k: v for k, v in by_policy.items() if k.startswith("continuum")}
        if "mars" in by_policy and baselines:
            best = min(baselines, key=lambda k: baselines[k]["e2e_s"]["mean"] or float("inf"))
            row["mars_vs_best_continuum"] = {
                "baseline": best,
                "mean_e2e_speedup": _ratio(baselines[best]["e2e_s"]["mean"], by_policy["mars"]["e2e_s"]["mean"]),
            }
        out[regime] = row
    return out


def write_outputs(report: dict, out: str | Path) -> list[Path]:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    from serving.sim.plots import plot_report

    return [out, *plot_report(report, out)]
