"""How long a replayed tool call runs: one stated distribution, recorded beside every result that used it.

No public agent trace records its tools' run times (the contract's `tool_exec_s` is empty in every trace we have), so
the replay draws them: lognormal with median `median_s` and log-σ `sigma` for a tool of unknown kind, and for a tool the
workload catalog knows (`pipelines.catalog.TOOLS`), lognormal around that tool's `exec_s_mean`. A stage whose trace
records `tool_exec_s` keeps it. Draws are fixed by (seed, workflow, stage), so every arm of one seed sees the same
tool times, and a replay's copies of one workflow differ from each other.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass

import numpy as np

from serving.sim.workload import SimWorkflow


@dataclass(frozen=True)
class ToolTimeDistribution:
    median_s: float = 1.0  # an API or database call of a tau2-style agent: about a second
    sigma: float = 1.0  # its spread: a tenth to ten times the median within ±2.3σ

    def __post_init__(self):
        if self.median_s <= 0 or self.sigma < 0:
            raise ValueError(f"tool times: median_s must be > 0 and sigma >= 0, got {self.median_s}, {self.sigma}")

    def draw(self, workflows: list[SimWorkflow], seed: int) -> None:
        """Set `tool_exec_s` on every tool-call stage whose trace did not record one."""
        from pipelines.agent_tools import TOOLS

        for workflow in workflows:
            for stage in workflow.stages:
                if not stage.is_tool_call or (stage.source or {}).get("tool_exec_s") is not None:
                    continue
                known = TOOLS.get(stage.tool_name)
                median = known.exec_s_mean * math.exp(-(self.sigma**2) / 2) if known else self.median_s
                key = f"{seed}:{workflow.workflow_id}:{stage.stage_id}".encode()
                rng = np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
                stage.tool_exec_s = float(median * math.exp(self.sigma * rng.normal()))

    def to_json(self) -> dict:
        return {
            "distribution": "lognormal",
            **asdict(self),
            "by_kind": "pipelines.catalog.TOOLS exec_s_mean (the mean) where the tool is a catalog one",
            "recorded": "a trace's own tool_exec_s where present",
        }
