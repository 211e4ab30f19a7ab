"""Arrival processes and trace replay (the shared data is read only here, never by the package)."""

from pathlib import Path

import numpy as np
import pytest

from serving.sim.arrivals import arrival_times, replay
from serving.sim.workload import trace_workflows

SHARED = Path(__file__).resolve().parents[4] / "shared" / "data"


def test_poisson_and_bursty_keep_the_mean_rate():
    for kind in ("poisson", "bursty"):
        times = arrival_times(kind, 20000, rate_per_s=5.0, seed=1)
        assert np.all(np.diff(times) >= 0)
        assert 20000 / times[-1] == pytest.approx(5.0, rel=0.15)


def test_unknown_arrival_process():
    with pytest.raises(ValueError, match="poisson, bursty"):
        arrival_times("uniform", 10, 1.0, 0)


@pytest.mark.parametrize("name", ["azure2023_conv.csv", "mooncake_conversation.jsonl"])
def test_replay_real_arrival_traces(name):
    path = SHARED / "arrival-traces" / name
    if not path.exists():
        pytest.skip("shared arrival traces not available")
    times = replay(path, 500, rate_per_s=2.0)
    assert len(times) == 500 and np.all(np.diff(times) >= 0)
    assert 500 / times[-1] == pytest.approx(2.0, rel=1e-6)


def test_trace_workflows_from_dev_traces():
    path = SHARED / "dev-traces" / "dev_traces.jsonl"
    if not path.exists():
        pytest.skip("shared dev traces not available")
    from maestro.contract import read_traces

    workflows = trace_workflows(read_traces(path).stages, "llama-3-8b")
    assert workflows and all(w.stages for w in workflows)
    assert all(s.output_tokens >= 0 and s.prompt_tokens > 0 for w in workflows for s in w.stages)
