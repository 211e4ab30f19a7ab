"""What the driver runs: its config and the workflows it plans — drawn from the workload model, or replayed from a
contract file (`replay.py`) — each stage with its prompt, parents and forced output length."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from driver.replay import ReplayConfig, load_replay, task_ids_of
from pipelines.catalog import APPS, get_app
from pipelines.synth import WorkflowGenerator
from predictor_service.replicas import split_urls


@dataclass
class DriveConfig:
    target: str  # base URL; several gateway replicas comma-separated (see the module's docstring)
    app: str = "all"
    num_workflows: int = 10
    concurrency: int = 4
    model: str = "tiny"
    seed: int = 0
    token_scale: float = 1.0
    max_tokens_cap: int = 4096
    max_prompt_chars: int = 4000
    stream: bool = False
    timeout_s: float = 600.0
    scratch: str | None = None
    run_tools: bool = True
    max_busy_retries: int = 120  # 429/503 answers followed (Retry-After) before a stage fails
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S"))
    traces: str | None = None  # a contract file: replay its workflows instead of drawing catalog ones
    tasks_from: str | None = None  # replay only the tasks of this contract file (e.g. a test split)
    tool_wait_scale: float = 1.0  # replay: × the recorded tool time
    max_tool_wait_s: float = 30.0
    max_stages_per_workflow: int = 0  # replay: a workflow's first N stages (0 = all)
    workflow_suffix: str = ""  # replay: appended to recorded workflow ids ("<id>@<suffix>"), to replay them again
    declared_max_tokens: int = 0  # > 0: the max_tokens sent; the length is forced by min_tokens + eos_token_id
    eos_token_id: int | None = None
    cache_salt: str = ""  # vLLM's prefix-cache salt: runs with different salts share no cached prefix

    def __post_init__(self):
        if self.app != "all":
            get_app(self.app)  # raises with the known names
        if self.num_workflows < 1 or self.concurrency < 1 or self.token_scale <= 0 or self.max_tokens_cap < 1:
            raise ValueError("workflows, concurrency, max-tokens-cap must be >= 1 and token-scale > 0")
        if self.declared_max_tokens and (self.eos_token_id is None or self.declared_max_tokens < self.max_tokens_cap):
            raise ValueError(
                "declared-max-tokens needs --eos-token-id (the model's end-of-sequence id) and must be "
                ">= max-tokens-cap, so every forced length fits under it"
            )
        if self.tasks_from and not self.traces:
            raise ValueError("tasks-from selects tasks of --traces: give --traces too")
        self.target = ",".join(split_urls(self.target, "--target", "gateway replica"))

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self.target.split(","))


def plan_workflows(config: DriveConfig) -> tuple[list[list[dict]], list[str]]:
    """The workflows (stages with prompts, parents and forced lengths), and the trace lines that could not be used."""
    if config.traces:
        return replay_workflows(config)
    return catalog_workflows(config), []


def replay_workflows(config: DriveConfig) -> tuple[list[list[dict]], list[str]]:
    replay = ReplayConfig(
        max_tokens_cap=config.max_tokens_cap,
        tool_wait_scale=config.tool_wait_scale,
        max_tool_wait_s=config.max_tool_wait_s,
        max_workflows=config.num_workflows,
        max_stages_per_workflow=config.max_stages_per_workflow,
        task_ids=task_ids_of(config.tasks_from) if config.tasks_from else None,
    )
    plan = load_replay(config.traces, replay)
    if not plan.workflows:
        raise ValueError(
            f"{config.traces}: no labelled workflow to replay"
            f"{' among the tasks of ' + config.tasks_from if config.tasks_from else ''}"
        )
    for stages in plan.workflows:
        for stage in stages:
            stage["workflow_id"] += f"@{config.workflow_suffix}" if config.workflow_suffix else ""
    return plan.workflows, [str(e) for e in plan.errors]


def catalog_workflows(config: DriveConfig) -> list[list[dict]]:
    """Draw the workflows from the workload model."""
    rng = np.random.default_rng(config.seed)
    names = sorted(APPS) if config.app == "all" else [config.app]
    workflows = []
    for index in range(config.num_workflows):
        generator = WorkflowGenerator(APPS[str(rng.choice(names))], rng, index)
        generator.wid = f"drive/{generator.app.name}/{config.run_id}-s{config.seed}-{index:05d}"
        stages = generator.run()
        for stage in stages:
            stage["max_tokens"] = max(1, min(config.max_tokens_cap, round(stage["output_tokens"] * config.token_scale)))
        workflows.append(stages)
    return workflows
