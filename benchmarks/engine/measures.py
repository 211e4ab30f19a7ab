"""The engine referee's measures: how each figure of its JSON is built from one run's per-workflow arrays
(`benchmarks.engine.report.run_figures`) and which statistic of the referee's paired bootstrap reads it, with units."""

from __future__ import annotations

import numpy as np

from benchmarks.referee.stats import Outcomes


def mean_of(values: np.ndarray, clusters: np.ndarray) -> Outcomes:
    """A per-workflow quantity as `Outcomes`: summarize's attainment is the weighted mean of `met`, so fed the
    quantity it gives its mean with the same paired intervals."""
    return Outcomes(values, np.zeros(len(values)), clusters, {})


# Each figure of the JSON: (the Outcomes built from one run's figures and step_s, the summarize statistic to read).
MEASURES = {
    "slo_attainment": (
        lambda f, step_s: Outcomes(f["met"], f["latency_steps"] * step_s, f["clusters"], {}),
        "slo_attainment",
    ),
    "e2e_p95_s": (lambda f, step_s: Outcomes(f["met"], f["latency_steps"] * step_s, f["clusters"], {}), "e2e_p95_s"),
    "workflow_p95_steps": (lambda f, _: Outcomes(f["met"], f["latency_steps"], f["clusters"], {}), "e2e_p95_s"),
    "served_workflow_p95_steps": (
        lambda f, _: Outcomes(f["met"], f["latency_steps"], f["clusters"], {}),
        "served_p95_s",
    ),
    "share_turned_away": (lambda f, _: mean_of(f["rejected"], f["clusters"]), "slo_attainment"),
    "preemptions": (lambda f, _: mean_of(f["preemptions"], f["clusters"]), "slo_attainment"),
    "tokens_per_step": (
        lambda f, _: mean_of(f["window_tokens"] * len(f["window_tokens"]) / f["window_steps"], f["all_clusters"]),
        "slo_attainment",
    ),
    "goodput_tokens_per_step": (
        lambda f, _: mean_of(
            f["window_good_tokens"] * len(f["window_good_tokens"]) / f["window_steps"], f["all_clusters"]
        ),
        "slo_attainment",
    ),
    "recomputed_prompt_tokens": (lambda f, _: mean_of(f["recomputed"], f["clusters"]), "slo_attainment"),
    "context_prompt_tokens": (lambda f, _: mean_of(f["contexts"], f["clusters"]), "slo_attainment"),
}
UNITS = {
    "slo_attainment": "share of measured workflows",
    "e2e_p95_s": "seconds at step_s a step",
    "workflow_p95_steps": "replay clock units (--clock step: engine steps)",
    "served_workflow_p95_steps": "replay clock units, over the measured workflows that finished (one turned away "
    "has no finish; workflow_p95_steps counts it as unfinished)",
    "share_turned_away": "share of measured workflows the gateway turned away (0 without a gateway)",
    "preemptions": "per measured workflow",
    "tokens_per_step": "output tokens per replay step in the steady window",
    "goodput_tokens_per_step": "output tokens per replay step in the steady window, of the workflows that met "
    "their SLO (finished by their deadline; one still running when the run stopped, and not past its deadline then, "
    "counts)",
    "recomputed_prompt_tokens": "per measured workflow: prompt tokens of its next turns (stages that continue "
    "a session) that the previous turn had computed (its prompt and output) and "
    "vLLM's prefix cache did not serve",
    "context_prompt_tokens": "per measured workflow: those next turns' prompt tokens from the previous turn "
    "(the most that a cache can serve)",
}
