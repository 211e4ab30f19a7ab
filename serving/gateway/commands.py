"""`maestro gateway` (serve the OpenAI-compatible gateway) and `maestro drive` (the load driver)."""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    gateway = subparsers.add_parser(
        "gateway",
        help="serve the OpenAI-compatible gateway in front of vLLM nodes",
        description="Serve the gateway; see serving/gateway/README.md.",
    )
    gateway.add_argument("--config", required=True, help="gateway config file (YAML or JSON)")
    gateway.add_argument("--host", default=None, help="override the config's host")
    gateway.add_argument("--port", type=int, default=None, help="override the config's port")
    gateway.add_argument("--log-level", default="warning")
    gateway.set_defaults(func=run_gateway)


def run_gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from serving.gateway import events
    from serving.gateway.app import create_app
    from serving.gateway.config import GatewayConfig
    from serving.gateway.model_source import ModelNotFound
    from serving.gateway.priority import apply_cpu_nice

    config = GatewayConfig.from_file(args.config)
    server = config.server
    server.host = args.host or server.host
    server.port = args.port or server.port
    for warning in apply_cpu_nice(server.cpu_nice):
        print(f"maestro gateway: {warning}", file=sys.stderr, flush=True)
    events.show_on_stderr()  # its start line, and each node going down or up
    try:
        app = create_app(config)
    except ModelNotFound as error:
        print(f"maestro gateway: {error}", file=sys.stderr, flush=True)
        return 2
    uvicorn.run(
        app,
        host=server.host,
        port=server.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0
