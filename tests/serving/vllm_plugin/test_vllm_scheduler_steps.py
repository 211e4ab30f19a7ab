"""Maestro's schedulers against vLLM's, stepped in process on a fake 20-block pool (vllm_scheduler_steps.py).

Every test runs over both of vLLM's scheduler classes (`is_async`): `Scheduler` against `MaestroScheduler`, and
`AsyncScheduler` against `MaestroAsyncScheduler` driven as vLLM's engine drives it when it schedules asynchronously.
20 blocks of 16 tokens (vLLM keeps one back): a 200-token request holds 14 of them at its end.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import astuple

import numpy as np
import pytest

from driver.testbed.engines import REPO, VLLM_PYTHON, has_vllm
from maestro.progressive import PREFIX_CLASSES, TABLE_FILE, ProgressiveTable
from serving.core.admission.batch_cost import Candidate, NodeState, RunningStage, gate_inputs

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(params=[False, True], ids=["Scheduler", "AsyncScheduler"])
def is_async(request) -> bool:
    return request.param


def steps_of(tmp_path, tiny_model, *scenarios: dict, is_async: bool = False) -> list[dict]:
    """Each scenario's run (vllm_scheduler_steps.py), on vLLM's AsyncScheduler and MaestroAsyncScheduler if
    `is_async`, else on Scheduler and MaestroScheduler."""
    if not has_vllm():
        pytest.skip(".venv-vllm is missing: run scripts/setup-vllm.sh to enable the vLLM tests")
    model = {"model_dir": str(tiny_model), "num_blocks": 20, "max_num_seqs": 8, "policy": "fcfs", "async": is_async}
    path = tmp_path / "scenarios.json"
    path.write_text(json.dumps([model | s for s in scenarios]))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [str(VLLM_PYTHON), "-m", "tests.serving.vllm_plugin.vllm_scheduler_steps", str(path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def request(rid: str, step: int, max_tokens: int, hints: dict | None = None, priority: int = 0) -> dict:
    return {
        "id": rid,
        "step": step,
        "prompt_tokens": 10,
        "max_tokens": max_tokens,
        "hints": hints,
        "priority": priority,
    }


def num_preempted(result: dict) -> int:
    return sum(len(step["preempted"]) for step in result["steps"])


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_without_predictions_every_step_is_vllms(tmp_path, tiny_model, is_async, policy):
    requests = [
        request("a", 0, 200, priority=2),
        request("b", 3, 150, priority=1),
        request("c", 5, 40),
        request("d", 5, 120, priority=1),
        request("e", 40, 30),
    ]
    vllm, maestro = steps_of(
        tmp_path,
        tiny_model,
        *({"scheduler": s, "policy": policy, "requests": requests} for s in ("vllm", "maestro")),
        is_async=is_async,
    )
    assert num_preempted(vllm) > 0  # the pool is contended: the preemption path is exercised
    assert maestro["steps"] == vllm["steps"] and maestro["finished"] == vllm["finished"]
    assert maestro["decisions"]["num_unpredicted"] == 5 and maestro["decisions"]["num_preempted_unpredicted"] > 0


def test_predicted_requests_start_in_the_policys_order(tmp_path, tiny_model, is_async):
    # One at a time (max_num_seqs 1), on the step clock: the four waiting behind "first" start by latest start
    # (deadline − predicted work), not by arrival, and "lost", whose latest start had passed when it came, after all
    # the work that can still make its deadline.
    deadlines = {"first": None, "late": 3000, "urgent": 1000, "middle": 2000, "lost": 5}
    requests = [
        request(rid, k, 20, {"tokens_pred": 20} | ({"deadline_s": d} if d else {}))
        for k, (rid, d) in enumerate(deadlines.items())
    ]
    no_wait_bound = {"scheduler": {"policy": "least-slack", "late_max_wait_s": 1e9}}
    [vllm, maestro] = steps_of(
        tmp_path,
        tiny_model,
        *(
            {"scheduler": s, "max_num_seqs": 1, "requests": requests, "maestro_config": no_wait_bound}
            for s in ("vllm", "maestro")
        ),
        is_async=is_async,
    )
    assert vllm["finished"] == ["first", "late", "urgent", "middle", "lost"]
    assert maestro["finished"] == ["first", "urgent", "middle", "late", "lost"]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_request_that_cannot_fit_by_prediction_waits_instead_of_being_preempted(
    tmp_path, tiny_model, is_async, policy
):
    # 14 + 10 blocks at their ends > 19: vLLM starts "second" and preempts; Maestro holds it back until "long" ends.
    requests = [
        request("long", 0, 200, {"tokens_pred": 200}),
        request("second", 3, 150, {"tokens_pred": 150}),
        request("plain", 3, 8),
    ]
    vllm, maestro = steps_of(
        tmp_path,
        tiny_model,
        *({"scheduler": s, "policy": policy, "requests": requests} for s in ("vllm", "maestro")),
        is_async=is_async,
    )
    assert num_preempted(vllm) > 0 and num_preempted(maestro) == 0
    assert maestro["finished"] == ["plain", "long", "second"]
    decisions = maestro["decisions"]
    assert decisions["num_requests_held_back"] == 1 and decisions["num_admitted"] == 2


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_the_victim_is_the_request_with_the_most_predicted_work_left(tmp_path, tiny_model, is_async, policy):
    # "short" is predicted at 20 tokens (reserve 3 blocks: it fits) but runs 150: the pool overflows. vLLM preempts
    # the later request; Maestro the one whose prediction says it has the most left.
    requests = [
        request("long", 0, 200, {"tokens_pred": 200}),
        request("short", 3, 150, {"tokens_pred": 20, "tokens_reserve": 30}),
    ]
    vllm, maestro = steps_of(
        tmp_path,
        tiny_model,
        *({"scheduler": s, "policy": policy, "requests": requests} for s in ("vllm", "maestro")),
        is_async=is_async,
    )
    victims = lambda result: [rid for step in result["steps"] for rid in step["preempted"]]  # noqa: E731
    assert victims(vllm)[0] == "short" and victims(maestro) == ["long"]
    assert maestro["decisions"]["num_preempted"] == 1


def test_the_plugin_reads_a_progressive_table_from_its_config(tmp_path, tiny_model):
    """`maestro_scheduler.progressive` names a table (here one that re-predicts every running request at its
    prediction ÷ e): the engine starts with it and still preempts the request with the most predicted work left.
    The harness skips the tokenizer, so the class of the output is unknown."""
    levels = (0.05, 0.5, 0.95)
    values = [[[[[-2.0, -1.0, 0.5]]]]] * len(PREFIX_CLASSES)
    (tmp_path / TABLE_FILE).write_text(ProgressiveTable(levels, PREFIX_CLASSES, ((), (), ()), values).to_json())
    requests = [
        request("long", 0, 200, {"tokens_pred": 200}),
        request("short", 3, 150, {"tokens_pred": 20, "tokens_reserve": 30}),
    ]
    (maestro,) = steps_of(
        tmp_path,
        tiny_model,
        {"scheduler": "maestro", "requests": requests, "maestro_config": {"progressive": str(tmp_path)}},
    )
    assert [rid for step in maestro["steps"] for rid in step["preempted"]] == ["long"]


def test_a_request_held_back_too_long_gets_the_pool_drained_for_it(tmp_path, tiny_model, is_async):
    # "big", a 200-token prompt (13 blocks, 15 at its end), fits beside one 40-token "small" (4 blocks) but not beside
    # the three or four that a small every 12 steps keeps running. Without a bound it waits for the stream to end;
    # with max_hold_s 20 (steps) the smalls after that are held until the running ones end, and it starts. Nothing is
    # preempted either way.
    smalls = [request(f"s{i:02d}", 12 * i, 40, {"tokens_pred": 40}) for i in range(26)]
    requests = [{**request("big", 30, 40, {"tokens_pred": 40}), "prompt_tokens": 200}, *smalls]
    unbounded, bounded = steps_of(
        tmp_path,
        tiny_model,
        *(
            {"scheduler": "maestro", "requests": requests, "maestro_config": {"max_hold_s": bound}}
            for bound in (None, 20)
        ),
        is_async=is_async,
    )
    assert num_preempted(unbounded) == num_preempted(bounded) == 0
    assert unbounded["finished"][-1] == "big" and unbounded["decisions"]["num_overdue"] == 0
    assert bounded["finished"].index("big") < len(smalls) // 2 and bounded["decisions"]["num_overdue"] >= 1


# On a fake wall clock a decode step lasts 10 ms and a prompt token's prefill 50 ms more: "tight"'s 10-token prefill
# makes the pace 5 times the bare step. "late" arrives while "tight" can still make its deadline, by 0.25 s, which
# late's prefill (0.51 s) would take.
GATE_SCENARIO = {
    "wall": {"step_s": 0.01, "prefill_token_s": 0.05},
    "requests": [
        request("tight", 0, 60, {"tokens_pred": 60, "deadline_s": 3.35}),
        request("late", 12, 20, {"tokens_pred": 20, "deadline_s": 1000.0}),
    ],
}


def expected_gate_view(result: dict, record: dict) -> tuple[NodeState, Candidate]:
    """What the plugin should describe at a gate decision, from the run's steps: each step's time, the requests it
    scheduled (a 10-token prompt is prefilled in its first step; every step then gives a request one token)."""
    steps, k = result["steps"], record["step"]
    times = [step["time_s"] for step in steps]
    busy = [times[j + 1] - times[j] for j in range(k) if steps[j]["scheduled"]][-64:]
    first = {rid: min(j for j, step in enumerate(steps) if rid in step["scheduled"]) for rid in ("tight", "late")}
    delays = [times[s + 1] - times[s] for s in first.values() if s + 1 <= k]
    specs = {spec["id"]: spec for spec in GATE_SCENARIO["requests"]}
    running = tuple(
        RunningStage(
            times[specs[rid]["step"]] + specs[rid]["hints"]["deadline_s"],
            times[first[rid]],
            sum(rid in step["scheduled"] for step in steps[:k]),
            tokens_pred=specs[rid]["hints"]["tokens_pred"],
            tokens_reserve=specs[rid]["hints"]["tokens_pred"],
        )
        for rid in record["running"]
    )
    node = NodeState(
        times[k], running, float(np.mean(busy)) if len(busy) >= 8 else 0.0, min(busy), float(np.median(delays))
    )
    late = specs["late"]
    tokens = late["hints"]["tokens_pred"]
    return node, Candidate(times[late["step"]] + late["hints"]["deadline_s"], tokens_pred=tokens, tokens_reserve=tokens)


CANDIDATE_INPUTS = ("stall_s", "added_step_s", "candidate_tokens", "candidate_slack_s")


def numbers(node: NodeState, candidate: Candidate) -> list[float]:
    """A node state and a candidate as the numbers they hold (None, a default to apply, and the prefix class and
    table of a running stage, left out)."""
    values = [
        node.now,
        node.pace_s_per_token,
        node.step_s,
        node.prefill_s,
        node.backlog_s,
        *(v for stage in node.running for v in astuple(stage)),
        *astuple(candidate),
    ]
    return [float(v) for v in values if isinstance(v, (int, float))]


def test_the_plugin_gives_the_batch_cost_gate_what_the_shared_function_computes_from_its_engine(tmp_path, tiny_model):
    """MaestroScheduler describes its engine to the gate (its requests' hints and tokens, the steps it timed) as the
    gateway and the simulator describe their nodes; the gate holds "late" back until "tight" has slack to spare."""
    maestro, srtf, in_async = steps_of(
        tmp_path,
        tiny_model,
        {"scheduler": "maestro", **GATE_SCENARIO},
        {"scheduler": "maestro", "maestro_config": {"system": "maestro-srtf"}, **GATE_SCENARIO},
        {"scheduler": "maestro", "async": True, **GATE_SCENARIO},
    )
    records = maestro["gate"]
    assert [(r["step"], r["running"], r["admitted"]) for r in records] == [
        (12, ["tight"], False),
        (13, ["tight"], False),
        (14, ["tight"], True),
    ]
    for record in records:
        node, candidate = expected_gate_view(maestro, record)
        running = tuple(RunningStage(**stage) for stage in record["node"]["running"])
        described = NodeState(**{**record["node"], "running": running}), Candidate(**record["candidate"])
        assert numbers(*described) == pytest.approx(numbers(node, candidate))
        expected, inputs = gate_inputs(node, candidate), record["inputs"]
        assert inputs["remaining_tokens"] + inputs["slack_s"] == pytest.approx(
            expected.batch.remaining_tokens.tolist() + expected.batch.slack_s.tolist()
        )
        assert [inputs[name] for name in CANDIDATE_INPUTS] == pytest.approx(
            [getattr(expected, name) for name in CANDIDATE_INPUTS]
        )
    assert maestro["decisions"]["num_batch_cost_refused"] == 2 and maestro["decisions"]["num_held_back"] == 2
    started = lambda result: min(j for j, step in enumerate(result["steps"]) if "late" in step["scheduled"])  # noqa: E731
    assert started(maestro) == 14 and started(srtf) == 12  # without the gate (maestro-srtf) it starts on arrival
    assert "gate" not in srtf and srtf["decisions"]["num_batch_cost_refused"] == 0
    assert in_async["decisions"]["num_batch_cost_refused"] > 0  # AsyncScheduler: the same gate, a step's lag


def test_a_request_of_a_workflow_triage_sheds_is_served_behind_without_a_deadline(tmp_path, tiny_model, is_async):
    # One at a time, on the step clock (a token a step): "lost" comes while "waiter" waits, with 5 steps to its
    # deadline and 20 of work: the maestro system's triage sheds it (vLLM cannot refuse it: it runs last, the
    # starvation bound set out of reach). Its workflow's next request, "lost-2", with all the time it needs, is shed
    # too; maestro-slack sheds nothing.
    hints = {"waiter": 1000, "lost": 5, "lost-2": 1000, "on-time": 1000}
    requests = [
        request("first", 0, 20, {"tokens_pred": 20}),
        *(
            request(rid, k + 1, 20, {"tokens_pred": 20, "deadline_s": d, "workflow": rid.split("-")[0]})
            for k, (rid, d) in enumerate(hints.items())
        ),
    ]
    configs = [
        {"system": system, "scheduler": {"policy": policy, "late_max_wait_s": 1e9}}
        for system, policy in (("maestro", "triage"), ("maestro-slack", "least-slack"))
    ]
    triage, slack = steps_of(
        tmp_path,
        tiny_model,
        *(
            {"scheduler": "maestro", "max_num_seqs": 1, "requests": requests, "maestro_config": config}
            for config in configs
        ),
        is_async=is_async,
    )
    assert triage["finished"] == ["first", "waiter", "on-time", "lost", "lost-2"]
    assert triage["decisions"]["num_shed"] == 2 and slack["decisions"]["num_shed"] == 0
