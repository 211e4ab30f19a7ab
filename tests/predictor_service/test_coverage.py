"""Coverage watched live: the online correction's per-(app, role, history) share above the reserve."""

import logging

import numpy as np

from predictor_service.online import CorrectionConfig, OnlineCorrection, coverage_group


class FakeClock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_drifting_group_is_flagged_and_corrected_while_the_others_keep_their_reserve(caplog):
    """Two groups served the same reserve (the actuals' 95 % quantile); after stage 1,000 one group's
    actuals run 2× longer. Only that group drifts, is logged, and gets a wider reserve."""
    rng = np.random.default_rng(0)
    correction = OnlineCorrection(CorrectionConfig(significance=1e9), alpha=0.05, clock=FakeClock())
    steady, drifting = coverage_group("chat", "agent", "full"), coverage_group("chat", "agent", "none")
    reserve = float(np.exp(4 + 1.645 * 0.5))
    misses = {steady: [], drifting: []}
    with caplog.at_level(logging.WARNING, logger="predictor_service.online"):
        for i in range(4000):
            for group in (steady, drifting):
                actual = float(rng.lognormal(4 + (0.7 if i >= 1000 and group == drifting else 0), 0.5))
                misses[group].append(actual > reserve * correction.reserve_factor("agent", group))
                correction.update("agent", 55, actual, reserve, group)
                if i == 1100 and group == drifting:
                    watched = correction.coverage()
    assert watched[drifting]["is_drifting"] and watched[drifting]["share_above_reserve"] > 0.1
    assert not watched[steady]["is_drifting"]
    warned = [r.getMessage() for r in caplog.records if "coverage drift" in r.getMessage()]
    assert warned and all("'none'" in message for message in warned)
    assert 0.03 < np.mean(misses[drifting][2500:]) < 0.08  # the group's own shift brings it back to α
    assert 0.03 < np.mean(misses[steady]) < 0.07 and correction.reserve_factor("agent", steady) < 1.3
    assert correction.reserve_factor("agent", drifting) > 1.6
    assert not correction.coverage()[drifting]["is_drifting"]  # back within the promise
