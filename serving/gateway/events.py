"""What `maestro gateway` says as it runs, on the `maestro.gateway` logger: one line when it starts (its address,
nodes, system, predictor and the model's version) and one each time a node goes down or comes back up.
`commands.run_gateway` sends the logger to stderr; embedded (tests, benchmarks), it goes wherever logging does."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("maestro.gateway")


def show_on_stderr() -> None:
    """The gateway's own lines on stderr at INFO, `maestro gateway: ` before each (uvicorn's logs are its own)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("maestro gateway: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def start_line(gateway) -> str:
    """One line: where the gateway listens, its nodes (up or down now), its system and its predictor."""
    config, predictor = gateway.config, gateway.predictor.snapshot()
    nodes = ", ".join(f"{n.name} {n.url} ({'up' if n.is_healthy else 'down'})" for n in gateway.nodes)
    system = config.system.name + (f", slo_s {config.system.slo_s:g}" if config.system.slo_s else "")
    model = config.predictor.model or "priors"
    if config.predictor.source != "local":
        model = f"{config.predictor.source} ({config.predictor.model or 'its priors'} where it cannot answer)"
    version = f" version {predictor['version']}" if predictor.get("version") else ""
    ready = "ready" if predictor.get("ready") else "not ready"
    return (
        f"listening on http://{config.server.host}:{config.server.port}; nodes: {nodes}; system: {system}; "
        f"predictor: {predictor.get('kind', '?')} {model}{version} ({ready}, timeout_s {config.predictor.timeout_s:g});"
        f" traces: {config.traces.dir}"
    )


def node_changed(name: str, url: str, is_healthy: bool, why: str) -> None:
    log.warning("node %s %s is %s (%s)", name, url, "up" if is_healthy else "down", why)
