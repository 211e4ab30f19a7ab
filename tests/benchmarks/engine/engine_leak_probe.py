"""The engine replay (`benchmarks.engine.steps.Replay`) with what Maestro's vLLM plugin receives and reads recorded.

Run by `.venv-vllm`'s python for tests/benchmarks/engine/test_engine_leaks.py:

    python -m tests.benchmarks.engine.engine_leak_probe PLAN.json OUT.json [--plant read-final]

Records, beside the replay's own report (`log` in OUT):
- `received`: each request's `extra_args` as the plugin gets them (`add_request`);
- `reads`: every read of a request's `final` hint or of its session's `tool_s` by the plugin's code, and whether it
  happened while that very request was leaving the engine (the plugin's `_free_request` for it): the moment its
  client knows whether the turn ended the workflow or in a tool call;
- `seen_at_schedule`: each live request whose `max_tokens` differed from its declared cap when `schedule()` began
  (the plugin's decisions are all made inside `schedule()` and `add_request`);
- `exposed`: each live request whose `max_tokens` differed from its declared cap while the plugin's `_free_request`
  ran for another request (inside vLLM's `update_from_output`, where the replay ends turns at their recorded length),
  with the step it was in; `num_frees_beside_capped`: how many such frees had a request beside them whose recorded
  length differs from its cap (what could have been exposed).
- `priorities`: each request's vLLM `priority` as it arrives;
- `gateway_reads` (a `gateway+` arm): every key of a stage's plan entry (`spec.KEY`) and of its workflow's
  (`workflow.KEY`) that the gateway reads when it triages the stage (`GatewayArm.request`).
`--plant read-final`: a planted policy that reads a request's `final` hint as it arrives (the test's failing case);
`--plant gateway-reads-length`: a planted gateway that reads a stage's recorded length as it triages it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path


def watch(replay, plant: str | None) -> dict:
    import serving.vllm_plugin.scheduler as plugin
    from serving.vllm_plugin.hints import MaestroHints
    from serving.vllm_plugin.session_kv import SessionHint

    scheduler = replay.scheduler
    log = {"received": {}, "priorities": {}, "reads": [], "seen_at_schedule": [], "exposed": [], "num_schedules": 0}
    if replay.gateway is not None:
        log["gateway_reads"] = watch_gateway(replay.gateway, plant)
    log["num_frees_beside_capped"] = 0
    freeing: list = []  # (request id, its hints, its session hint) while the plugin's _free_request runs for it

    def note(obj, what: str) -> None:
        frame = sys._getframe(2)
        if frame.f_code.co_filename.endswith("dataclasses.py"):  # `dataclasses.replace` copying the fields
            return
        log["reads"].append(
            {
                "what": what,
                "at_own_end": bool(freeing) and (obj is freeing[-1][1] or obj is freeing[-1][2]),
                "step": replay.step,
                "where": f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}",
            }
        )

    class WatchedHints(MaestroHints):
        __slots__ = ()

        def __getattribute__(self, name):
            if name == "final":
                note(self, name)
            return object.__getattribute__(self, name)

    class WatchedSession(SessionHint):
        __slots__ = ()

        def __getattribute__(self, name):
            if name == "tool_s":
                note(self, name)
            return object.__getattribute__(self, name)

    def watched(make, cls):
        def read(extra_args):
            found = make(extra_args)
            if found is None:
                return None
            return cls(**{f.name: object.__getattribute__(found, f.name) for f in dataclasses.fields(found)})

        return read

    plugin.hints_from_extra_args = watched(plugin.hints_from_extra_args, WatchedHints)
    plugin.session_hint_from_extra_args = watched(plugin.session_hint_from_extra_args, WatchedSession)

    add, schedule, free = scheduler.add_request, scheduler.schedule, scheduler._free_request

    def add_request(request):
        log["received"][request.request_id] = request.sampling_params.extra_args
        log["priorities"][request.request_id] = request.priority
        add(request)
        if plant == "read-final" and request.request_id in scheduler.hints:
            scheduler.hints[request.request_id].final  # noqa: B018 - the planted policy's read

    def differing(skip=None) -> list:
        return [
            [s.workflow, s.index, s.request.max_tokens, s.spec["max_tokens"], s.spec["output_tokens"]]
            for s in replay.live.values()
            if s.request is not skip and s.request.max_tokens != s.spec["max_tokens"]
        ]

    def watched_schedule(*args, **kwargs):
        log["num_schedules"] += 1
        log["seen_at_schedule"] += [[replay.step, *d] for d in differing()]
        return schedule(*args, **kwargs)

    def free_request(request, *args, **kwargs):
        rid = request.request_id
        log["exposed"] += [[replay.step + 1, *d] for d in differing(skip=request)]  # +1: the step's finish_step
        log["num_frees_beside_capped"] += any(
            s.request is not request and s.spec["output_tokens"] != s.spec["max_tokens"] for s in replay.live.values()
        )
        hints, sessions = getattr(scheduler, "hints", {}), getattr(scheduler, "session_hints", {})  # none: vLLM's own
        freeing.append((rid, hints.get(rid), sessions.get(rid)))
        try:
            return free(request, *args, **kwargs)
        finally:
            freeing.pop()

    scheduler.add_request, scheduler.schedule, scheduler._free_request = add_request, watched_schedule, free_request
    return log


class Watched(dict):
    """A plan entry that records each key read (`NAME.KEY`) into `reads`."""

    def __init__(self, data: dict, name: str, reads: set):
        super().__init__(data)
        self.name, self.reads = name, reads

    def __getitem__(self, key):
        self.reads.add(f"{self.name}.{key}")
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.reads.add(f"{self.name}.{key}")
        return super().get(key, default)


def watch_gateway(gateway, plant: str | None) -> set:
    """The keys of the plan entries the gateway reads as it triages a stage."""
    reads: set = set()
    request = gateway.request

    def watched_request(workflow, spec, stages, step, remaining_tool_s):
        spec = Watched(spec, "spec", reads)
        if plant == "gateway-reads-length":
            spec["output_tokens"]  # noqa: B018 - the planted gateway's read
        return request(Watched(workflow, "workflow", reads), spec, stages, step, remaining_tool_s)

    gateway.request = watched_request
    return reads


def main() -> None:
    from benchmarks.engine.steps import Replay

    plan_path, out_path, *rest = sys.argv[1:]
    plant = rest[1] if rest[:1] == ["--plant"] else None
    replay = Replay(json.loads(Path(plan_path).read_text()), Path(out_path).with_suffix(".vllm-stats"))
    log = watch(replay, plant)
    report = replay.run()
    replay.engine.engine_core.shutdown()
    received, priorities = log.pop("received"), log.pop("priorities")
    sent = [s for wf in replay.stages for s in wf if s.request_id]
    log["received"] = [[s.workflow, s.index, received[s.request_id]] for s in sent]
    log["priorities"] = [[s.workflow, s.index, priorities[s.request_id]] for s in sent]
    log["gateway_reads"] = sorted(log.get("gateway_reads", ()))
    Path(out_path).write_text(json.dumps({**report, "log": log}))


if __name__ == "__main__":
    main()
