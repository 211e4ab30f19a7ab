"""`maestro serve`: the predictor service (BentoML); `maestro deploy`: hot-reload serving nodes with a registered
predictor, then move its MLflow alias; `maestro retrain`: new traces → the DVC pipeline → the guard → deploy."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SERVICE = "predictor_service.service:PredictorService"
REPO = Path(__file__).resolve().parent.parent


def register(subparsers) -> None:
    register_serve(subparsers)
    register_deploy(subparsers)
    register_retrain(subparsers)


def register_serve(subparsers) -> None:
    from predictor_service.config import DEFAULT_MODEL, DEFAULT_TRACKING_URI

    parser = subparsers.add_parser(
        "serve",
        help="serve the stage-length predictor (the BentoML service: /predict, /observe, /stats, ...)",
        description=f"`bentoml serve {SERVICE}` with its configuration from these options; the service reads the "
        "rest from MAESTRO_* variables (predictor_service/README.md).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 exposes it to the network")
    parser.add_argument("--port", type=int, default=3000, help="port to listen on")
    parser.add_argument(
        "--model",
        default=None,
        help=f"the predictor to serve: a registry URI or a predictor directory (default: $MAESTRO_MODEL "
        f"or {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--tracking-uri", default=None, help=f"MLflow store (default: $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI})"
    )
    parser.set_defaults(func=serve)


def serve_command(args: argparse.Namespace, environ: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The `bentoml serve` command line and its environment: the options over the caller's MAESTRO_MODEL and
    MLFLOW_TRACKING_URI; one OpenMP thread unless OMP_NUM_THREADS says otherwise (predictor_service/README.md)."""
    bentoml = Path(sys.executable).with_name("bentoml")
    argv = [str(bentoml), "serve", SERVICE, "--host", args.host, "--port", str(args.port), "--working-dir", str(REPO)]
    env = {"OMP_NUM_THREADS": "1", **environ}
    if args.model:
        env["MAESTRO_MODEL"] = args.model
    if args.tracking_uri:
        env["MLFLOW_TRACKING_URI"] = args.tracking_uri
    return argv, env


def serve(args: argparse.Namespace) -> int:
    """Become `bentoml serve` (exec): its signals and exit status are the command's."""
    argv, env = serve_command(args, dict(os.environ))
    os.execve(argv[0], argv, env)
    return 0  # (not reached)


def register_deploy(subparsers) -> None:
    parser = subparsers.add_parser(
        "deploy",
        help="deploy a registered predictor version to running service nodes",
        description="hot-reload serving nodes with a registered predictor, then move its MLflow alias",
    )
    parser.add_argument("--nodes", required=True, help="comma-separated service URLs, e.g. http://10.0.0.5:3000")
    parser.add_argument("--alias", default="champion", help="registry alias to move (default: champion)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--model-version", default=None, help="version to point the alias at (default: keep it)")
    which.add_argument("--rollback", action="store_true", help="point the alias back at its previous version")
    parser.add_argument("--model-name", default="stage-length", help="registered model name")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlruns/mlflow.db)",
    )
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per-node reload timeout")
    parser.add_argument(
        "--admin-token",
        default=None,
        help="the nodes' MAESTRO_ADMIN_TOKEN, sent as `Authorization: Bearer` to /admin/reload "
        "(default: $MAESTRO_ADMIN_TOKEN)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from predictor_service.config import DEFAULT_TRACKING_URI
    from predictor_service.deploy import DeployConfig, deploy

    config = DeployConfig(
        nodes=tuple(n.strip().rstrip("/") for n in args.nodes.split(",") if n.strip()),
        alias=args.alias,
        model_name=args.model_name,
        model_version=args.model_version,
        rollback=args.rollback,
        timeout_s=args.timeout_s,
        admin_token=args.admin_token or os.environ.get("MAESTRO_ADMIN_TOKEN") or None,
        tracking_uri=args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI),
    )
    try:
        result = deploy(config)
    except Exception as error:  # registry or argument trouble: say what, before any node was touched
        print(
            f"deploy failed before reloading any node: {type(error).__name__}: {error}\n"
            "check that --model-version exists in the registry at --tracking-uri"
        )
        return 2
    print(
        json.dumps(
            {
                "alias": result.alias,
                "previous_version": result.previous_version,
                "version": result.version,
                "nodes": result.nodes,
                "failure": result.failure,
                "restored": result.restored,
            },
            indent=1,
        )
    )
    if not result.is_ok:
        print(failure_message(result))
    return 0 if result.is_ok else 1


def failure_message(result) -> str:
    """What failed, what was put back, and what is left for the operator."""
    lines = [f"deploy of version {result.version} failed: {result.failure}"]
    if result.unrestored:
        lines += [
            "undo incomplete; put these back by hand:",
            *(f"  {where}: {why}" for where, why in result.unrestored.items()),
        ]
    else:
        lines.append(
            f"undone: the nodes it had switched serve their previous model again; alias {result.alias!r} "
            f"is at version {result.previous_version}"
        )
    lines.append("fix the failed part and rerun, or `maestro deploy --rollback --nodes ...`")
    return "\n".join(lines)


def register_retrain(subparsers) -> None:
    from maestro.cli import DefaultsFormatter
    from predictor_service.retrain import __doc__ as steps

    class StepsFormatter(argparse.RawDescriptionHelpFormatter, DefaultsFormatter):
        """The numbered steps as written, the defaults in each option's help."""

    parser = subparsers.add_parser(
        "retrain",
        help="retrain on the traces since the champion and deploy the result if it "
        "passes the guard (by schedule or on coverage drift)",
        description=steps,
        formatter_class=StepsFormatter,
    )
    parser.add_argument("--traces", required=True, help="the gateway's trace directory (its trace_dir)")
    parser.add_argument(
        "--nodes",
        required=True,
        help="comma-separated service URLs to deploy to and read coverage from, e.g. http://10.0.0.5:3000",
    )
    parser.add_argument(
        "--resolve-nodes",
        action="store_true",
        help="each --nodes host names every node (a headless Service): one URL per address",
    )
    parser.add_argument("--repo", default=".", help="checkout of this repository where `dvc exp run` runs")
    parser.add_argument(
        "--on-drift",
        action="store_true",
        help="retrain only when a node's coverage drifts past its bound (or, with --max-age-h, the champion is old)",
    )
    parser.add_argument(
        "--max-age-h",
        type=float,
        default=None,
        help="retrain only when the champion is at least this many hours old (or coverage drifts, with --on-drift)",
    )
    parser.add_argument(
        "--min-stages", type=int, default=1000, help="finished stages since the champion needed to retrain"
    )
    parser.add_argument(
        "--tracking-uri", default=None, help="MLflow store (default: $MLFLOW_TRACKING_URI or REPO/mlruns/mlflow.db)"
    )
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per-node reload timeout")
    parser.add_argument(
        "--admin-token", default=None, help="the nodes' MAESTRO_ADMIN_TOKEN (default: $MAESTRO_ADMIN_TOKEN)"
    )
    parser.set_defaults(func=retrain)


def retrain(args: argparse.Namespace) -> int:
    """Exit 0 when the run did what was due (nothing, or kept the champion, or deployed), 1 when a deploy failed
    and was undone, 2 when the configuration or the pipeline failed."""
    from predictor_service.deploy import DeployConfig
    from predictor_service.retrain import RetrainConfig, resolve_nodes
    from predictor_service.retrain import retrain as run_retrain

    repo = Path(args.repo).resolve()
    try:
        nodes = tuple(n.strip().rstrip("/") for n in args.nodes.split(",") if n.strip())
        target = DeployConfig(
            nodes=resolve_nodes(nodes) if args.resolve_nodes else nodes,
            timeout_s=args.timeout_s,
            admin_token=args.admin_token or os.environ.get("MAESTRO_ADMIN_TOKEN") or None,
            tracking_uri=args.tracking_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{repo}/mlruns/mlflow.db",
        )
        result = run_retrain(
            RetrainConfig(args.traces, target, str(repo), args.min_stages, args.on_drift, args.max_age_h)
        )
    except (ValueError, OSError, RuntimeError) as error:
        print(f"maestro retrain: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=1))
    if result.deployed is not None and not result.deployed.is_ok:
        print(failure_message(result.deployed))
    return 1 if result.status == "deploy-failed" else 0
