"""group_levels: each row's reserve level, looked up once per distinct group, is the per-row lookup's."""

import numpy as np

from pipelines.calibration import calibration_keys, group_levels


def per_row(roles, p_tool, apps, history, groups, global_level):
    """The lookup one row at a time: the first of calibration_keys' levels with a (non-NaN) level."""
    levels = calibration_keys(roles, p_tool, apps, history)
    return np.array(
        [
            next((groups[k] for k in keys if k in groups and groups[k] == groups[k]), global_level)
            for keys in zip(*levels)
        ]
    )


def test_the_levels_of_distinct_groups_are_the_per_row_lookups():
    rng = np.random.default_rng(3)
    n = 500
    roles = list(rng.choice(["coder", "reviewer", "unknown"], n))
    apps = rng.choice(["0", "1", "-"], n).astype(object)
    history = rng.choice(["full", "partial", "none"], n).astype(object)
    p_tool = np.where(rng.random(n) < 0.05, np.nan, rng.random(n))
    keys = {k for level in calibration_keys(roles, p_tool, apps, history) for k in level}
    # sorted: a set's order follows the process's string hashing, and the draws below must not
    groups = {k: (np.nan if rng.random() < 0.2 else float(rng.normal())) for k in sorted(keys) if rng.random() < 0.5}
    for a, h in ((apps, history), (None, history), (apps, None), (None, None)):
        expected = per_row(roles, p_tool, a, h, groups, 0.7)
        np.testing.assert_array_equal(group_levels(roles, p_tool, a, h, groups, 0.7), expected)
        assert len(set(expected)) > 3
