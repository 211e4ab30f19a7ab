"""`SimContext`: the simulation as its dispatcher sees it, so the dispatcher is handed this seam, not the simulator."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from serving.core.tool_kv import ToolKV
from serving.sim.node import SimNode
from serving.sim.workload import SimStage

if TYPE_CHECKING:
    from serving.core.systems import System
    from serving.sim.costmodel import CostModel
    from serving.sim.engine import ClusterConfig
    from serving.sim.metrics import Recorder
    from serving.sim.workload import SimWorkflow


class SimContext(Protocol):
    """The simulation as the dispatcher sees it (the `Simulator` is one): what it reads, and the events it raises."""

    now: float
    nodes: list[SimNode]
    cluster: ClusterConfig
    system: System
    cost: CostModel
    recorder: Recorder
    tool_kv: ToolKV
    stage_ema_s: float  # moving average of a stage's service time
    evicted_wait_ema_s: float  # moving average of an evicted context's wait (Continuum-Dy's T)

    def children_ready(self, stage: SimStage) -> None:
        """`stage` ended without a tool call: its children may become ready."""

    def drop(self, workflow: SimWorkflow) -> None:
        """The workflow is given up (a stage could never start, or it was abandoned)."""

    def submit_tool(self, node: SimNode, stage: SimStage) -> None:
        """`stage` ended in a tool call: run its tool on the node's host CPU."""

    def arm_ttl(self, stage: SimStage, ttl_s: float) -> None:
        """Evict the kept context of `stage` after `ttl_s` unless its session's next stage takes it first."""

    def predicted_tool_s(self, tool: str) -> float:
        """How long the tool is predicted to run."""
