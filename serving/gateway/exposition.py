"""The gateway's GET /metrics through prometheus_client: who answered each stage's prediction, readiness, the call
counters of /maestro/status (read from the gateway at each scrape), and histograms of each stage's times, observed
from its trace line (traces.trace_record) as it is written.

Each Gateway has its own registry (several run in one test process); the series names are those the gateway
has always exposed (`maestro_gateway_stage_predictions_total{source=…}`, `…_predictor_ready`,
`…_calls_total{kind=…}`), and with the triage order `…_workflows_shed_total` and `…_workflows_rejected_total`.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from maestro.prediction import Source
from serving.gateway.answers import FALLBACKS

PREFIX = "maestro_gateway"
MEDIA_TYPE = CONTENT_TYPE_LATEST
# Seconds, from a few milliseconds (a queue that is empty, a short TTFT) to a long answer of a slow CPU engine.
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# The prediction: the priors answer in well under a millisecond, the model within predictor.timeout_s.
PREDICT_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# trace field → (histogram name, help, buckets); a stage's line without the field is not observed there.
HISTOGRAMS = {
    "ttft_s": (
        "stage_ttft_seconds",
        "A completed stage's time to its first token, from the call's arrival (prediction and queue included)",
        SECONDS,
    ),
    "queue_s": ("stage_queue_seconds", "A stage's time in the gateway's queue, every attempt's wait included", SECONDS),
    "predict_s": (
        "stage_predict_seconds",
        "A stage's output-length prediction, the wait for the model included",
        PREDICT_SECONDS,
    ),
    "e2e_s": (
        "stage_e2e_seconds",
        "A completed stage's time from the call's arrival to its answer's end",
        SECONDS,
    ),
}


class GatewayMetrics:
    """One gateway's registry: `observe(record)` for each trace line, `text()` for a scrape."""

    def __init__(self, gateway):
        self.registry = CollectorRegistry()
        self.registry.register(_GatewayCounters(gateway))
        self.histograms = {
            field: Histogram(f"{PREFIX}_{name}", help_text, buckets=buckets, registry=self.registry)
            for field, (name, help_text, buckets) in HISTOGRAMS.items()
        }

    def observe(self, record: dict) -> None:
        for field, histogram in self.histograms.items():
            if record.get(field) is not None:
                histogram.observe(record[field])

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _GatewayCounters(Collector):
    """The gateway's own counts, read at each scrape (they have one home: the gateway and its predictor)."""

    def __init__(self, gateway):
        self.gateway = gateway

    def collect(self):
        counts = self.gateway.predictor.counts.counts
        predictions = CounterMetricFamily(
            f"{PREFIX}_stage_predictions",
            "Stages predicted, by who answered: the model, or the prior and why (timeout, error, ...)",
            labels=["source"],
        )
        for source in (Source.MODEL, *FALLBACKS):
            predictions.add_metric([source.value], counts[source])
        yield predictions
        yield GaugeMetricFamily(
            f"{PREFIX}_predictor_ready",
            "1 once the predictor is warmed up (local) or answering (service)",
            value=float(self.gateway.predictor.is_ready),
        )
        calls = CounterMetricFamily(
            f"{PREFIX}_calls", "Calls by what became of them (/maestro/status counters)", labels=["kind"]
        )
        for name, value in self.gateway.counters.items():
            calls.add_metric([name], value)
        yield calls
        if (triage := self.gateway.triage) is not None:
            yield CounterMetricFamily(
                f"{PREFIX}_workflows_shed",
                "Workflows the triage shed: beside the admitted ones they could not meet their deadline",
                value=triage.num_shed_workflows,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_workflows_rejected",
                "Workflows turned away (503) because the triage "
                "shed them; their stages count as calls of kind rejected_shed",
                value=triage.num_rejected_workflows,
            )
