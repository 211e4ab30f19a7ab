"""The gateway's counters in Prometheus' text format (GET /metrics): who answered each stage's prediction,
readiness, and the call counters of /maestro/status."""
from __future__ import annotations

from serving.gateway.predict import Source

PREFIX = "maestro_gateway"


def _family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> list[str]:
    return [f"# HELP {PREFIX}_{name} {help_text}", f"# TYPE {PREFIX}_{name} {kind}",
            *(f"{PREFIX}_{name}{labels} {value:g}" for labels, value in samples)]


def prometheus_text(gateway) -> str:
    """/metrics of a `core.Gateway`."""
    counts = gateway.predictor.counts.counts
    lines = _family("stage_predictions_total", "counter",
                    "Stages predicted, by who answered: the model, or the prior and why (timeout, error, ...)",
                    [(f'{{source="{s.value}"}}', counts[s]) for s in Source])
    lines += _family("predictor_ready", "gauge", "1 once the predictor is warmed up (local) or answering (service)",
                     [("", float(gateway.predictor.is_ready))])
    lines += _family("calls_total", "counter", "Calls by what became of them (/maestro/status counters)",
                     [(f'{{kind="{name}"}}', value) for name, value in gateway.counters.items()])
    return "\n".join(lines) + "\n"
