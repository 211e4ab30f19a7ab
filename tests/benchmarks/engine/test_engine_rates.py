"""`--rates auto` on the engine: the search's logic against known attainment curves (no engine), and the CLI."""

from __future__ import annotations

import math
import sys

import pytest

from benchmarks.engine.rates import RateSearchConfig, find_rates, parse_rates
from benchmarks.referee.grid import RATE_TARGETS, TARGETS


def logistic(knee: float, width: float = 0.3, ceiling: float = 1.0):
    """A monotone attainment curve: ceiling at light load, falling through ceiling / 2 at `knee`."""
    return lambda rate: ceiling / (1 + math.exp((math.log(rate) - math.log(knee)) / width))


def inverse(knee: float, target: float, width: float = 0.3) -> float:
    """The rate where `logistic(knee, width)` attains `target` of its ceiling."""
    return knee * math.exp(width * math.log(1 / target - 1))


@pytest.mark.parametrize("knee", [40.0, 150.0, 600.0])
def test_the_search_finds_each_target_within_a_probe_budget(knee):
    calls = []

    def probe(rate):
        calls.append(rate)
        return logistic(knee)(rate)

    search = find_rates(probe, 1.0, RateSearchConfig(max_probes=8, min_rate=5, max_rate=5000))
    assert len(calls) == len(set(calls)) <= 8  # every probe a new rate, within the budget
    assert search.unbracketed() == []
    for found, target in zip(search.rates(), RATE_TARGETS.values()):
        assert found == pytest.approx(inverse(knee, target), rel=0.25), target
    assert search.rates() == sorted(search.rates())
    assert set(search.describe()["probes"]) == {f"{r:g}" for r in calls}


def test_the_ceiling_scales_the_targets():
    ceiling = 0.8
    search = find_rates(logistic(150.0, ceiling=ceiling), ceiling, RateSearchConfig(min_rate=5, max_rate=5000))
    assert search.rates()[1] == pytest.approx(inverse(150.0, 0.9), rel=0.25)


def test_a_noisy_rise_is_read_as_flat_and_a_target_past_the_bounds_is_named():
    # the arm never falls below half the ceiling within max_rate: the heavy target stays at the bound
    search = find_rates(lambda r: 1.0 if r < 100 else 0.6, 1.0, RateSearchConfig(max_probes=4, max_rate=400))
    assert 0.5 in search.unbracketed() and search.rates()[-1] == 400
    search.probes = {50.0: 1.0, 100.0: 0.8, 200.0: 0.85, 400.0: 0.4}  # 200 rises by noise: pooled with 100
    pooled = (0.8 * 100 + 0.85 * 200) / 300  # weighted by rate: a run measures workflows in proportion to it
    assert search.curve()[1] == pytest.approx([1.0, pooled, pooled, 0.4])
    assert search.rate_for(0.6) == pytest.approx(200 * 2 ** ((pooled - 0.6) / (pooled - 0.4)))


def test_every_bracketed_target_is_refined_before_any_is_refined_twice():
    calls = []
    curve = logistic(150.0)
    find_rates(lambda r: calls.append(r) or curve(r), 1.0, RateSearchConfig(max_probes=8, min_rate=5, max_rate=5000))
    sweep, refinements = calls[:4], calls[4:]  # up to 200 (below half), down to 25 (above 0.99)
    assert sweep == [100, 200, 50, 25]
    nearest = [min(TARGETS, key=lambda t: abs(curve(r) - t)) for r in refinements]
    assert sorted(nearest) == sorted(TARGETS)  # one probe near each target


def test_the_search_stops_at_its_budget_and_its_floor():
    calls = []
    find_rates(lambda r: calls.append(r) or 0.0, 1.0, RateSearchConfig(start_rate=100, min_rate=20, max_probes=8))
    assert calls == [100, 50, 25]  # below the lowest target everywhere: down to the floor, never below it
    calls.clear()
    find_rates(lambda r: calls.append(r) or 1.0, 1.0, RateSearchConfig(max_probes=3, max_rate=1e6))
    assert calls == [100, 200, 400]


def test_rates_parse_auto_or_numbers_and_refuse_the_rest():
    assert parse_rates("auto") is None and parse_rates("100,150") == [100.0, 150.0]
    for bad in ("fast", "100,-5", "", "100,,150", "nan"):
        with pytest.raises(ValueError, match="--rates"):
            parse_rates(bad)
    with pytest.raises(ValueError, match="max_probes"):
        RateSearchConfig(max_probes=1)


def test_the_engine_referee_takes_rates_auto_and_refuses_bad_rates(capsys):
    from benchmarks.referee.engine import parse_args

    base = ["--vllm-python", sys.executable, "--arms", "vllm-fcfs"]
    args = parse_args(base + ["--rates", "auto", "--arrival-steps", "500", "--rate-probes", "5"])
    assert args.rate_list is None and args.search.max_probes == 5
    assert args.search.min_rate == 20  # the search's floor: 10 workflows a run
    assert parse_args(base + ["--rates", "100,150"]).rate_list == [100.0, 150.0]
    with pytest.raises(SystemExit):
        parse_args(base + ["--rates", "fast"])
    assert "--rates 'fast': give 'auto' or positive" in capsys.readouterr().err


def test_the_engine_referee_refuses_a_search_it_cannot_run(capsys):
    from benchmarks.referee.engine import parse_args

    base = ["--vllm-python", sys.executable, "--arms", "vllm-fcfs"]
    with pytest.raises(SystemExit):
        parse_args(base + ["--rate-probes", "1"])
    assert "--rate-probes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(base + ["--arrival-steps", "5"])  # 10 workflows a run would need 2,000 per 1,000 steps
    assert "raise --arrival-steps" in capsys.readouterr().err
