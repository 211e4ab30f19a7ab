"""A stage of the engine replay as the replay loop (`benchmarks/engine/steps.py`) keeps it: its plan entry, its
steps, its vLLM request and what it produced; and its prompt, seeded token ids that resend its session parent's."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

VOCAB_LOW, VOCAB_HIGH = 16, 2000  # prompt token ids drawn from here (clear of the tiny tokenizer's special tokens)


@dataclass
class Stage:
    workflow: int
    index: int
    spec: dict
    num_parents_left: int
    ready_step: int = -1
    finish_step: int = -1
    request_id: str = ""
    request: object = None  # vLLM's Request, read after it left the scheduler too
    prompt_ids: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    computed_tokens: int = 0  # after the last step: what a preemption in the next one drops
    output_ids: list[int] = field(default_factory=list)  # what it produced, for its session's next turn
    num_output_tokens: int = 0
    cached_tokens: int = -1  # prompt tokens served from the prefix cache at its first start (-1: not started)
    window_tokens: int = 0  # output tokens produced inside the plan's steady window
    tool_pred_steps: float = 0.0  # the tool time it was sent with (maestro_tool_s), where it ends in a tool call
    triaged: object = None  # the StageRequest the gateway triaged it as (gateway arms only)
    is_rejected: bool = False  # never ran: the gateway turned its workflow away
    tool_ahead_steps: float = 0.0  # the tool steps predicted from it on as it became ready (`ToolAhead.arrived`)

    def record(self) -> dict:
        """What the replay's report keeps of the stage."""
        return {
            "ready_step": self.ready_step,
            "finish_step": self.finish_step,
            "num_preemptions": self.num_preemptions,
            "cached_tokens": self.cached_tokens,
            "window_tokens": self.window_tokens,
            "tool_pred_steps": self.tool_pred_steps,
            "tool_ahead_steps": round(self.tool_ahead_steps, 4),
            "is_rejected": self.is_rejected,
        }


def prompt_ids(plan_seed: int, workflow: int, stage: dict, parent: Stage | None) -> list[int]:
    """The stage's prompt: its session parent's prompt and output first (a tool loop resends them), then seeded fresh
    ids (the tool's result, the next instruction)."""
    rng = random.Random(f"{plan_seed}:{workflow}:{stage['index']}")
    head = (parent.prompt_ids + parent.output_ids)[: stage["prompt_tokens"] - 1] if parent is not None else []
    return head + [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(stage["prompt_tokens"] - len(head))]


def cached_tokens_check(stats_dir: Path, by_name: dict[str, Stage]) -> dict:
    """The stages' `cached_tokens` (by request id) against the stat-logger plugin's `num_cached_tokens` of each
    finished request, as it logged them into `stats_dir`."""
    logged = {}
    for path in sorted(stats_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "request":
                logged[record["request_id"]] = record["num_cached_tokens"]
    mismatched = [name for name, cached in logged.items() if by_name[name].cached_tokens != cached]
    return {"num_logged": len(logged), "num_mismatched": len(mismatched), "mismatched": mismatched[:5]}
