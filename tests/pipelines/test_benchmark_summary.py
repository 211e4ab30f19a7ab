"""The predictor benchmark's per-app table: each app's ratios against the baselines of the same split."""
from benchmarks.predictor import by_app


def _q(n, mae, under, over, auc=None, tau=0.5):
    return {"n": n, "auc": auc, "mae": mae, "kendall_tau": tau, "under_rate": under, "over_reservation": over}


def _split(ours_mae, p90_over):
    return {"quality_by_app": {
        "maestro": {"chat": _q(10, ours_mae, 0.04, 1.0), "tools": _q(5, 1.0, 0.02, 0.5, auc=0.97)},
        "role_median": {"chat": _q(10, 10.0, 0.4, 0.3), "tools": _q(5, 2.0, 0.4, 0.3)},
        "role_p90": {"chat": _q(10, 10.0, 0.1, p90_over), "tools": _q(5, 2.0, 0.1, 1.0)},
        "role_conformal": {"chat": _q(10, 10.0, 0.05, 3.0), "tools": _q(5, 2.0, 0.05, 2.0)},
    }}


def test_by_app_averages_each_splits_ratio():
    table = by_app([_split(5.0, 2.0), _split(8.0, 1.0)])
    assert set(table) == {"chat", "tools"}
    chat = table["chat"]
    assert chat["mae_vs_role_median"] == 0.65  # mean of 0.5 and 0.8, not 6.5 / 10
    assert chat["over_reservation_vs_role_p90"] == 0.75  # mean of 0.5 and 1.0
    assert chat["auc"] is None  # no tool calls in that app: no AUC, not a fake 0.5
    assert table["tools"]["auc"] == 0.97 and table["tools"]["role_p90_under_rate"] == 0.1


def test_by_app_keeps_only_apps_in_every_split():
    one, other = _split(5.0, 2.0), _split(5.0, 2.0)
    for q in other["quality_by_app"].values():
        q.pop("tools")
    assert set(by_app([one, other])) == {"chat"}
