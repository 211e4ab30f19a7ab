"""What an app of the workload catalog (pipelines/catalog.py) is made of: its agent roles (`Role`, with an output
model), the stages of its plan (`StageSpec`, a DAG of roles) and the app itself (`App`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Role:
    """An agent role and its output model (see synth.py for how the numbers are used).

    tool_p: probability of a tool call when a tool is still needed; text_base_tokens: free-text
    length before the prompt's content (items asked for, documents to digest, detail) scales it.
    """

    name: str
    system_prompt: str
    tools: tuple[str, ...] = ()
    tool_p: float = 0.0
    text_base_tokens: int = 200
    tokens_per_item: int = 0
    digest_ratio: float = 0.0  # output tokens per token of documents handed to it


@dataclass(frozen=True)
class StageSpec:
    """One node of an app's plan: a role that runs after its parents, maybe looping with tools."""

    key: str
    role: str
    parents: tuple[str, ...] = ()
    max_tool_rounds: int = 0  # tool call → tool result → LLM again, at most this many times


@dataclass(frozen=True)
class App:
    name: str
    interactive: bool
    roles: dict[str, Role]
    stages: tuple[StageSpec, ...]
    tasks: tuple[str, ...]
    slo_s: float  # end-to-end latency objective used by the simulator
    models: tuple[str, ...] = ("llama-3-8b",)
    extra: dict = field(default_factory=dict)
