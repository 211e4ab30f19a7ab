"""`maestro simulate`: run a serving scenario under several policies and write JSON + plots."""

from __future__ import annotations

import argparse
import json

from serving.core.systems import SYSTEMS


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate", help="simulate a cluster serving agent workflows under several policies", description=__doc__
    )
    parser.add_argument(
        "--scenario",
        required=True,
        choices=["maestro-paper", "mars-swe"],
        help="the cluster and workload (serving/sim/scenarios.py)",
    )
    parser.add_argument("--nodes", type=int, default=None, help="simulated GPU nodes (default: 64 / 1)")
    parser.add_argument(
        "--policies",
        type=policy_names,
        default=None,
        metavar="NAME[,NAME...]",
        help=f"comma-separated policies, from: {', '.join(SYSTEMS)} (default: the scenario's)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_out", default="simulate.json", help="output JSON; PNGs go next to it")
    parser.add_argument("--traces", default=None, help="replay workflows from a stage-trace file (contract JSONL)")
    parser.add_argument(
        "--model-map",
        action="append",
        default=[],
        metavar="NAME=PROFILE",
        help="simulate a trace's model NAME with cost profile PROFILE (repeatable); other unknown "
        "names run as the scenario's first placed model, with a warning (mars-swe runs its "
        "one model for every stage)",
    )
    parser.add_argument("--model", default=None, help="trained predictor directory (Predictor.load)")
    parser.add_argument(
        "--predictions",
        default=None,
        choices=["noise", "oracle", "model", "prior", "none"],
        help="where predictions come from: true × lognormal noise, true lengths, the trained model, "
        "its per-role priors (needs --model), or none (one constant); default: model if --model, "
        "else noise",
    )
    parser.add_argument("--noise-sigma", type=float, default=0.5, help="noise model: σ of log-token error")
    parser.add_argument("--arrivals", default="poisson", help="poisson, bursty, or an arrival trace file to replay")
    parser.add_argument("--rate", type=float, default=None, help="total workflow arrivals per second")
    parser.add_argument(
        "--workflows",
        type=int,
        default=None,
        help="number of workflows (default: per-node × nodes; with --traces: the file's, cycled if more)",
    )
    parser.add_argument("--gpu", default=None, help="GPU profile: a100-80gb or h200")
    parser.add_argument("--regimes", default=None, help="mars-swe: comma-separated regimes (short,medium,long)")
    parser.add_argument(
        "--slo",
        default="scaled",
        choices=["scaled", "scaled-app", "catalog"],
        help="SLO: slo-scale × the workflow's unloaded critical path (default), × its app's median "
        "unloaded latency, or the catalog's fixed slo_s",
    )
    parser.add_argument("--slo-scale", type=float, default=5.0, help="multiple of the unloaded latency (default 5)")
    parser.add_argument(
        "--host-cpu",
        default=None,
        choices=["workers", "time-sliced", "shared"],
        help="tool execution on the host CPU (default: the scenario's; see serving/README.md)",
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=run)


def policy_names(value: str) -> tuple[str, ...]:
    """--policies: comma-separated names, each one of SYSTEMS (argparse's `choices`, for a list)."""
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in SYSTEMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(map(repr, unknown)) or '(none given)'}; choose from {', '.join(SYSTEMS)}"
        )
    return names


def parse_model_map(pairs: list[str], known: dict) -> dict[str, str]:
    """--model-map NAME=PROFILE entries as a dict (the last '=' splits: model names may contain one)."""
    from serving.sim.workload import check_model_map

    mapping = {}
    for pair in pairs:
        name, sep, profile = pair.rpartition("=")
        if not sep or not name or not profile:
            raise SystemExit(f"maestro simulate: --model-map '{pair}': expected NAME=PROFILE, e.g. gpt-4o=llama-3-8b")
        mapping[name] = profile
    try:
        check_model_map(mapping, known)
    except ValueError as exc:
        raise SystemExit(f"maestro simulate: {exc}") from None
    return mapping


def run(args: argparse.Namespace) -> int:
    from serving.sim.predictions import PredictionConfig
    from serving.sim.runner import RunConfig, run_scenario, write_outputs
    from serving.sim.scenarios import get_scenario
    from serving.sim.slo import SLOConfig

    nodes = args.nodes or (64 if args.scenario == "maestro-paper" else 1)
    scenario = get_scenario(args.scenario, nodes, args.gpu)
    scenario.cluster.show_progress = not args.no_progress
    if args.host_cpu:
        scenario.cluster.host_cpu = args.host_cpu
    source = args.predictions or ("model" if args.model else "noise")
    try:
        predictions = PredictionConfig(source=source, sigma=args.noise_sigma, model_dir=args.model, seed=args.seed)
    except ValueError as exc:
        raise SystemExit(f"maestro simulate: {exc}") from None
    policies = args.policies or scenario.default_policies
    run_config = RunConfig(
        policies=policies,
        seed=args.seed,
        arrivals=args.arrivals,
        num_workflows=args.workflows,
        rate_per_s=args.rate,
        traces=args.traces,
        model_map=parse_model_map(args.model_map, scenario.cluster.cost.models),
        predictions=predictions,
        regimes=tuple(args.regimes.split(",")) if args.regimes else None,
        slo=SLOConfig(mode=args.slo, slo_scale=args.slo_scale),
    )
    report = run_scenario(scenario, run_config)
    paths = write_outputs(report, args.json_out)
    print(json.dumps(report["comparisons"], indent=2))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
