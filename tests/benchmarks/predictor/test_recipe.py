"""The predictor benchmark's tables: each app's figures against the baselines on the same stages."""

import pandas as pd

from benchmarks.predictor.recipe import score


def _frame(pred, reserve, tokens, apps, is_tool):
    return pd.DataFrame(
        {
            "tokens": tokens,
            "tokens_pred": pred,
            "tokens_reserve": reserve,
            "app": apps,
            "is_tool": is_tool,
            "p_tool": [0.9 if t else 0.1 for t in is_tool],
            "role": "r",
        }
    )


def test_per_app_figures_are_ratios_on_that_apps_stages():
    tokens = [10, 20, 30, 40, 100, 200]
    apps = ["chat"] * 4 + ["tools"] * 2
    is_tool = [False] * 4 + [True, False]
    model = _frame([12, 18, 33, 41, 100, 190], [15, 25, 35, 45, 90, 250], tokens, apps, is_tool)
    median = _frame([25] * 6, [30] * 6, tokens, apps, is_tool)
    p90 = _frame([25] * 6, [50] * 6, tokens, apps, is_tool)
    table = score(model, {"role_median": median, "role_p90": p90, "role_conformal": p90})
    chat, tools = table["by_app"]["chat"], table["by_app"]["tools"]
    assert chat["mae_vs_role_median"] == round(2.0 / 10.0, 4)  # |2|+|2|+|3|+|1| / 4 vs 15+5+5+15 / 4
    assert chat["auc"] is None  # no tool calls in that app: no AUC, not a fake 0.5
    assert tools["under_rate"] == 0.5 and tools["auc"] == 1.0
    assert chat["over_reservation_vs_role_p90"] == round((5 + 5 + 5 + 5) / (40 + 30 + 20 + 10), 4)
    assert table["n"] == 6 and chat["role_p90_under_rate"] == 0.0
