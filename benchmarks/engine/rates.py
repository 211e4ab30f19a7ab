"""`--rates auto` for the engine referee: the arrival rates where vLLM's priority fed the deadline attains about each
of the simulator mode's targets (`benchmarks.referee.grid.RATE_TARGETS`: 0.99 / 0.9 / 0.7 / 0.5 of the ceiling).

Every probe is a real engine run (seed 0, one arm, sustained arrivals), so the search is frugal: a geometric sweep
from `start_rate` (×`factor` up while the arm still attains the lowest target, ÷`factor` down while it misses the
highest), then, while probes are left (at most `max_probes` in all), one probe at the rate interpolated for a target
(the least refined first, then the widest bracket in log rate). Attainment is read as non-increasing in rate (probes
that rise with rate, by noise, are pooled) and interpolated linearly in log rate between the two probes that bracket a
target; a target no probe brackets takes the last rate probed on its side, and `RateSearch.unbracketed` names it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm import tqdm

from benchmarks.referee.grid import RATE_TARGETS, TARGETS

RATES_FOUND_BY = "vllm-priority-deadline"  # the engine arm the search runs
AUTO = "auto"


@dataclass(frozen=True)
class RateSearchConfig:
    """Where the sweep starts, its step, its bounds (arrivals per 1,000 steps) and its probe budget."""

    start_rate: float = 100.0
    min_rate: float = 10.0
    max_rate: float = 1000.0
    factor: float = 2.0
    max_probes: int = 8
    tolerance: float = 1.1  # a bracket narrower than this ratio of rates is not probed again

    def __post_init__(self):
        if not 0 < self.min_rate <= self.start_rate <= self.max_rate:
            raise ValueError(
                f"rate search: need 0 < min_rate {self.min_rate} <= start_rate {self.start_rate} <= "
                f"max_rate {self.max_rate} (the engine referee's min_rate is 10 workflows a run: raise --arrival-steps)"
            )
        if self.factor <= 1 or self.tolerance <= 1 or self.max_probes < 2:
            raise ValueError(
                f"rate search: factor {self.factor} and tolerance {self.tolerance} must be > 1, max_probes "
                f"(--rate-probes) {self.max_probes} >= 2"
            )


@dataclass
class RateSearch:
    """The probes of one search (rate -> attainment) and the rates interpolated from them."""

    ceiling: float
    targets: tuple[float, ...] = TARGETS
    probes: dict[float, float] = field(default_factory=dict)

    def levels(self) -> list[float]:
        return [target * self.ceiling for target in self.targets]

    def curve(self) -> tuple[list[float], list[float]]:
        """The probed rates, ascending, and their attainment made non-increasing: adjacent probes that rise are
        pooled to their mean weighted by rate, as a run measures workflows in proportion to its rate (isotonic
        regression by pooling adjacent violators)."""
        rates = sorted(self.probes)
        blocks: list[list[float]] = []  # [weighted attainment sum, weight, number of probes]
        for rate in rates:
            blocks.append([self.probes[rate] * rate, rate, 1])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
                total, weight, count = blocks.pop()
                blocks[-1] = [blocks[-1][0] + total, blocks[-1][1] + weight, blocks[-1][2] + count]
        return rates, [total / weight for total, weight, count in blocks for _ in range(count)]

    def bracket(self, level: float) -> tuple[int, int] | None:
        """Indices (i, i + 1) into `curve()` whose attainment goes from >= `level` to below it; None if none does."""
        _, attained = self.curve()
        for i in range(len(attained) - 1):
            if attained[i] >= level > attained[i + 1]:
                return i, i + 1
        return None

    def rate_for(self, level: float) -> float:
        """The rate where the curve crosses `level`, linear in log rate; the last probe on its side if unbracketed."""
        rates, attained = self.curve()
        found = self.bracket(level)
        if found is None:
            return rates[-1] if attained[-1] >= level else rates[0]
        i, j = found
        share = (attained[i] - level) / (attained[i] - attained[j])
        return math.exp(math.log(rates[i]) + share * (math.log(rates[j]) - math.log(rates[i])))

    def rates(self) -> list[float]:
        return [round(self.rate_for(level), 1) for level in self.levels()]

    def unbracketed(self) -> list[float]:
        """The targets no two probes bracket (their rate is a bound of the probed range)."""
        return [t for t, level in zip(self.targets, self.levels()) if self.bracket(level) is None]

    def next_rate(self, tolerance: float, refined: list[float]) -> tuple[float, float] | None:
        """(target level, rate to probe for it): among the targets whose bracket is wider than `tolerance`, the one
        least often in `refined`, then the widest; the rate interpolated for it, kept inside its bracket."""
        rates, _ = self.curve()
        brackets = [(b, level) for level in self.levels() if (b := self.bracket(level)) is not None]
        brackets = [(b, level) for b, level in brackets if rates[b[1]] / rates[b[0]] > tolerance]
        if not brackets:
            return None
        (i, j), level = min(
            brackets, key=lambda found: (refined.count(found[1]), rates[found[0][0]] / rates[found[0][1]])
        )
        low, high = math.log(rates[i]), math.log(rates[j])
        inside = min(max(math.log(self.rate_for(level)), low + 0.15 * (high - low)), high - 0.15 * (high - low))
        return level, round(math.exp(inside), 1)

    def describe(self) -> dict:
        return {
            "found_by": RATES_FOUND_BY,
            "targets": dict(zip(RATE_TARGETS, self.targets)),
            "probes": {f"{rate:g}": round(a, 4) for rate, a in sorted(self.probes.items())},
            "unbracketed_targets": self.unbracketed(),
        }


def find_rates(
    probe: Callable[[float], float], ceiling: float, config: RateSearchConfig = RateSearchConfig()
) -> RateSearch:
    """Search the rates (see the module docstring); `probe(rate)` is the arm's SLO attainment at `rate`."""
    search = RateSearch(ceiling)
    top, bottom = max(search.levels()), min(search.levels())
    bar = tqdm(total=config.max_probes, desc=f"rates ({RATES_FOUND_BY})", unit="probe")

    def run(rate: float) -> float:
        search.probes[rate] = probe(rate)
        bar.update(1)
        bar.set_postfix_str(f"{rate:g} -> {search.probes[rate]:.3f}")
        return search.probes[rate]

    def has_budget() -> bool:
        return len(search.probes) < config.max_probes

    rate = config.start_rate
    while run(rate) >= bottom and rate * config.factor <= config.max_rate and has_budget():
        rate *= config.factor
    rate = config.start_rate
    while search.probes[min(search.probes)] < top and rate / config.factor >= config.min_rate and has_budget():
        rate /= config.factor
        run(rate)
    refined: list[float] = []
    while has_budget() and (found := search.next_rate(config.tolerance, refined)) and found[1] not in search.probes:
        refined.append(found[0])
        run(found[1])
    bar.close()
    if search.unbracketed():
        print(
            f"rate search: no two probes bracket the targets {search.unbracketed()}; their rates are the probed bounds"
        )
    return search


def parse_rates(text: str) -> list[float] | None:
    """`--rates`: `auto` (None: search them) or comma-separated positive rates."""
    if text.strip() == AUTO:
        return None
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        rates = []
    if not rates or min(rates) <= 0 or not all(math.isfinite(r) for r in rates):
        raise ValueError(
            f"--rates {text!r}: give '{AUTO}' or positive workflow arrivals per 1,000 steps separated by commas "
            "(--rates 100,150)"
        )
    return rates
