"""Maestro's schedulers against vLLM's, stepped in process on a fake 20-block pool (vllm_scheduler_steps.py).

Every test runs over both of vLLM's scheduler classes (`is_async`): `Scheduler` against `MaestroScheduler`, and
`AsyncScheduler` against `MaestroAsyncScheduler` driven as vLLM's engine drives it when it schedules asynchronously.
20 blocks of 16 tokens (vLLM keeps one back): a 200-token request holds 14 of them at its end.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from .engines import REPO, VLLM_PYTHON, has_vllm

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
    done = subprocess.run([str(VLLM_PYTHON), "-m", "tests.gateway.vllm_scheduler_steps", str(path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def request(rid: str, step: int, max_tokens: int, hints: dict | None = None, priority: int = 0) -> dict:
    return {"id": rid, "step": step, "prompt_tokens": 10, "max_tokens": max_tokens, "hints": hints,
            "priority": priority}


def num_preempted(result: dict) -> int:
    return sum(len(step["preempted"]) for step in result["steps"])


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_without_predictions_every_step_is_vllms(tmp_path, tiny_model, is_async, policy):
    requests = [request("a", 0, 200, priority=2), request("b", 3, 150, priority=1), request("c", 5, 40),
                request("d", 5, 120, priority=1), request("e", 40, 30)]
    vllm, maestro = steps_of(tmp_path, tiny_model, *({"scheduler": s, "policy": policy, "requests": requests}
                                           for s in ("vllm", "maestro")), is_async=is_async)
    assert num_preempted(vllm) > 0  # the pool is contended: the preemption path is exercised
    assert maestro["steps"] == vllm["steps"] and maestro["finished"] == vllm["finished"]
    assert maestro["decisions"]["num_unpredicted"] == 5 and maestro["decisions"]["num_preempted_unpredicted"] > 0


def test_predicted_requests_start_in_the_policys_order(tmp_path, tiny_model, is_async):
    # One at a time (max_num_seqs 1), on the step clock: the four waiting behind "first" start by latest start
    # (deadline − predicted work), not by arrival, and "lost", whose latest start had passed when it came, after all
    # the work that can still make its deadline.
    deadlines = {"first": None, "late": 3000, "urgent": 1000, "middle": 2000, "lost": 5}
    requests = [request(rid, k, 20, {"tokens_pred": 20} | ({"deadline_s": d} if d else {}))
                for k, (rid, d) in enumerate(deadlines.items())]
    no_wait_bound = {"scheduler": {"policy": "maestro", "late_max_wait_s": 1e9}}
    [vllm, maestro] = steps_of(tmp_path, tiny_model, *({"scheduler": s, "max_num_seqs": 1, "requests": requests,
                                                        "maestro_config": no_wait_bound} for s in ("vllm", "maestro")),
                               is_async=is_async)
    assert vllm["finished"] == ["first", "late", "urgent", "middle", "lost"]
    assert maestro["finished"] == ["first", "urgent", "middle", "late", "lost"]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_request_that_cannot_fit_by_prediction_waits_instead_of_being_preempted(tmp_path, tiny_model, is_async,
                                                                                  policy):
    # 14 + 10 blocks at their ends > 19: vLLM starts "second" and preempts; Maestro holds it back until "long" ends.
    requests = [request("long", 0, 200, {"tokens_pred": 200}), request("second", 3, 150, {"tokens_pred": 150}),
                request("plain", 3, 8)]
    vllm, maestro = steps_of(tmp_path, tiny_model, *({"scheduler": s, "policy": policy, "requests": requests}
                                           for s in ("vllm", "maestro")), is_async=is_async)
    assert num_preempted(vllm) > 0 and num_preempted(maestro) == 0
    assert maestro["finished"] == ["plain", "long", "second"]
    decisions = maestro["decisions"]
    assert decisions["num_requests_held_back"] == 1 and decisions["num_admitted"] == 2


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_the_victim_is_the_request_with_the_most_predicted_work_left(tmp_path, tiny_model, is_async, policy):
    # "short" is predicted at 20 tokens (reserve 3 blocks: it fits) but runs 150: the pool overflows. vLLM preempts
    # the later request; Maestro the one whose prediction says it has the most left.
    requests = [request("long", 0, 200, {"tokens_pred": 200}),
                request("short", 3, 150, {"tokens_pred": 20, "tokens_reserve": 30})]
    vllm, maestro = steps_of(tmp_path, tiny_model, *({"scheduler": s, "policy": policy, "requests": requests}
                                           for s in ("vllm", "maestro")), is_async=is_async)
    victims = lambda result: [rid for step in result["steps"] for rid in step["preempted"]]  # noqa: E731
    assert victims(vllm)[0] == "short" and victims(maestro) == ["long"]
    assert maestro["decisions"]["num_preempted"] == 1


def test_a_request_held_back_too_long_gets_the_pool_drained_for_it(tmp_path, tiny_model, is_async):
    # "big", a 200-token prompt (13 blocks, 15 at its end), fits beside one 40-token "small" (4 blocks) but not beside
    # the three or four that a small every 12 steps keeps running. Without a bound it waits for the stream to end;
    # with max_hold_s 20 (steps) the smalls after that are held until the running ones end, and it starts. Nothing is
    # preempted either way.
    smalls = [request(f"s{i:02d}", 12 * i, 40, {"tokens_pred": 40}) for i in range(26)]
    requests = [{**request("big", 30, 40, {"tokens_pred": 40}), "prompt_tokens": 200}, *smalls]
    unbounded, bounded = steps_of(tmp_path, tiny_model, *(
        {"scheduler": "maestro", "requests": requests, "maestro_config": {"max_hold_s": bound}}
        for bound in (None, 20)), is_async=is_async)
    assert num_preempted(unbounded) == num_preempted(bounded) == 0
    assert unbounded["finished"][-1] == "big" and unbounded["decisions"]["num_overdue"] == 0
    assert bounded["finished"].index("big") < len(smalls) // 2 and bounded["decisions"]["num_overdue"] >= 1
