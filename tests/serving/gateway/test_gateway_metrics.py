"""GET /metrics through prometheus_client: the series the gateway always had, and histograms of each stage's times
(TTFT, queue, prediction, e2e) that count exactly the stages traced with that time."""

from __future__ import annotations

import asyncio
import json

from prometheus_client.parser import text_string_to_metric_families

from .conftest import run_app

STAGE = {"X-Maestro-Workflow": "wf-metrics", "X-Maestro-Role": "planner"}
HISTOGRAMS = {
    "ttft_s": "maestro_gateway_stage_ttft_seconds",
    "queue_s": "maestro_gateway_stage_queue_seconds",
    "predict_s": "maestro_gateway_stage_predict_seconds",
    "e2e_s": "maestro_gateway_stage_e2e_seconds",
}


def scrape(tmp_path, bodies: list[dict]) -> tuple[str, str, list[dict]]:
    """`bodies` sent as stages s0, s1, …; /metrics after them, its content type, and the trace lines."""

    async def calls(client, gateway):
        for i, body in enumerate(bodies):
            await client.post("/v1/chat/completions", json=body, headers={**STAGE, "X-Maestro-Stage": f"s{i}"})
        response = await client.get("/metrics")
        return response.text, response.headers["content-type"]

    text, content_type = asyncio.run(run_app(tmp_path, {"a": True}, calls))
    lines = [json.loads(line) for path in sorted(tmp_path.glob("*.jsonl")) for line in path.read_text().splitlines()]
    return text, content_type, lines


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) → value, as a Prometheus server parses the text."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_keep_their_names_and_add_stage_time_histograms(tmp_path):
    user = [{"role": "user", "content": "hi"}]
    bodies = [
        {"messages": user, "max_tokens": 5},
        {"messages": user, "max_tokens": 6, "stream": True},
        {"messages": user, "max_tokens": 3},
        {"messages": []},
    ]  # the last one: refused as invalid
    text, content_type, lines = scrape(tmp_path, bodies)
    assert content_type.startswith("text/plain") and len(lines) == 4
    values = samples(text)
    assert values[("maestro_gateway_calls_total", (("kind", "requests"),))] == 4
    assert values[("maestro_gateway_calls_total", (("kind", "rejected_invalid"),))] == 1
    assert values[("maestro_gateway_stage_predictions_total", (("source", "no_model"),))] == 3
    assert values[("maestro_gateway_predictor_ready", ())] == 1
    # the README's and the local-predictor tests' way of reading them still works
    assert 'maestro_gateway_stage_predictions_total{source="model"} 0' in text
    for field, name in HISTOGRAMS.items():
        observed = [line[field] for line in lines if line.get(field) is not None]
        assert observed, field
        assert values[(f"{name}_count", ())] == len(observed), name
        assert abs(values[(f"{name}_sum", ())] - sum(observed)) < 1e-3 * len(observed), name
        buckets = sorted(
            ((float(dict(labels)["le"]), v) for (sample, labels), v in values.items() if sample == f"{name}_bucket")
        )
        assert buckets[-1] == (float("inf"), len(observed))
        assert all(v == sum(x <= le for x in observed) for le, v in buckets[:-1]), (name, buckets, observed)
    assert values[("maestro_gateway_stage_ttft_seconds_count", ())] == 3  # the completed stages; not the refused one
