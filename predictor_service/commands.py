"""`maestro deploy`: hot-reload serving nodes with a registered predictor, then move its MLflow alias."""
from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    parser = subparsers.add_parser("deploy", help="deploy a registered predictor version to running service nodes",
                                   description=__doc__)
    parser.add_argument("--nodes", required=True, help="comma-separated service URLs, e.g. http://10.0.0.5:3000")
    parser.add_argument("--alias", default="champion", help="registry alias to move (default: champion)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--model-version", default=None, help="version to point the alias at (default: keep it)")
    which.add_argument("--rollback", action="store_true", help="point the alias back at its previous version")
    parser.add_argument("--model-name", default="stage-length")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlruns/mlflow.db)")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per-node reload timeout")
    parser.add_argument("--admin-token", default=None,
                        help="the nodes' MAESTRO_ADMIN_TOKEN, sent as `Authorization: Bearer` to /admin/reload "
                             "(default: $MAESTRO_ADMIN_TOKEN)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    from predictor_service.config import DEFAULT_TRACKING_URI
    from predictor_service.deploy import DeployConfig, deploy

    config = DeployConfig(nodes=tuple(n.strip().rstrip("/") for n in args.nodes.split(",") if n.strip()),
                          alias=args.alias, model_name=args.model_name, model_version=args.model_version,
                          rollback=args.rollback, timeout_s=args.timeout_s,
                          admin_token=args.admin_token or os.environ.get("MAESTRO_ADMIN_TOKEN") or None,
                          tracking_uri=args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI))
    try:
        result = deploy(config)
    except Exception as error:  # registry or argument trouble: say what, before any node was touched
        print(f"deploy failed before reloading any node: {type(error).__name__}: {error}\n"
              "check that --model-version exists in the registry at --tracking-uri")
        return 2
    print(json.dumps({"alias": result.alias, "previous_version": result.previous_version, "version": result.version,
                      "nodes": result.nodes, "failure": result.failure, "restored": result.restored}, indent=1))
    if not result.is_ok:
        print(failure_message(result))
    return 0 if result.is_ok else 1


def failure_message(result) -> str:
    """What failed, what was put back, and what is left for the operator."""
    lines = [f"deploy of version {result.version} failed: {result.failure}"]
    if result.unrestored:
        lines += ["undo incomplete; put these back by hand:",
                  *(f"  {where}: {why}" for where, why in result.unrestored.items())]
    else:
        lines.append(f"undone: the nodes it had switched serve their previous model again; alias {result.alias!r} "
                     f"is at version {result.previous_version}")
    lines.append("fix the failed part and rerun, or `maestro deploy --rollback --nodes ...`")
    return "\n".join(lines)
