"""The replay benchmark's pieces on a small real workload: arms, quality, the table and the plots."""

import argparse
import json

from benchmarks.sim.replay import Replay, plot, run_all, table


def test_the_replay_runs_every_arm_at_a_rate_and_reports_their_quality(dev_traces, tmp_path):
    args = argparse.Namespace(
        nodes=2,
        workflows=24,
        seed=0,
        slo="scaled",
        arms="oracle,noise0.5,none",
        baselines="edf",
        baseline_caps="16",
        system="maestro",
    )
    replay = Replay(dev_traces, tmp_path / "no-model", args)
    report = run_all(replay, [0.2], args)
    row = report["results"]["scaled"]["0.2"]
    assert set(row) == {"edf", "edf@16", "maestro[oracle]", "maestro[noise0.5]", "maestro[none]"}
    assert all(r["oom_rate"] == 0 for r in row.values())
    # 24 workflows on 2 nodes at 0.2/s is a light load: under deadlines of 5 x their own unloaded latency, all make it
    assert all(r["slo_attainment"] == 1.0 for r in row.values())
    assert row["maestro[oracle]"]["kv_reserved_frac_vs_maxlen"] < row["edf"]["kv_reserved_frac_vs_maxlen"] == 1.0
    q = report["quality"]
    assert q["oracle"]["kendall_tau"] == 1.0 and q["oracle"]["mae_tokens"] == 0
    assert 0 < q["noise0.5"]["kendall_tau"] < 1 and q["noise0.5"]["mae_tokens"] > 0
    # the arms' predictions were made once and are set again at the next rate
    again = run_all(replay, [0.2], args)["results"]["scaled"]["0.2"]
    assert again["maestro[noise0.5]"]["slo_attainment"] == row["maestro[noise0.5]"]["slo_attainment"]
    assert "| 0.2 |" in table(report)
    out = tmp_path / "replay.json"
    out.write_text(json.dumps(report))
    assert [p.exists() for p in plot(report, out)] == [True]
