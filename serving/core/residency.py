"""Model residency on one node: Running → Sleeping → CPU → Disk → Remote, hierarchical LRU.

Each tier has a byte budget; when a model is activated, the least recently used models of a
full tier drop one tier down (cascading), never a model with stages in flight. Transition costs
come from bandwidths (PCIe, NVMe, network) plus the CUDA-graph/JIT warm-up that Sleeping keeps
(the seed: ~0.5 GB stays on the GPU and waking saves 5–8 s over a cold CPU load).
"""

from __future__ import annotations

import copy
import enum
from collections import OrderedDict
from dataclasses import dataclass

GiB = 1024**3


class ModelState(enum.IntEnum):
    RUNNING = 0
    SLEEPING = 1
    CPU = 2
    DISK = 3
    REMOTE = 4


@dataclass
class ResidencyConfig:
    gpu_weight_budget_bytes: int = 40 * GiB
    cpu_budget_bytes: int = 256 * GiB
    disk_budget_bytes: int = 1024 * GiB
    sleeping_gpu_bytes: int = GiB // 2  # CUDA graphs + JIT caches kept on the GPU while sleeping
    pcie_bytes_per_s: float = 25e9  # PCIe 4.0 x16, effective
    nvme_bytes_per_s: float = 3.5e9
    network_bytes_per_s: float = 1.25e9  # 10 Gbit/s to the model store
    warmup_s: float = 6.5  # graph capture + JIT on a cold start (seed: 5–8 s)

    def __post_init__(self):
        if min(self.gpu_weight_budget_bytes, self.cpu_budget_bytes, self.disk_budget_bytes) <= 0:
            raise ValueError("every tier budget must be > 0 bytes")
        if min(self.pcie_bytes_per_s, self.nvme_bytes_per_s, self.network_bytes_per_s) <= 0:
            raise ValueError("bandwidths must be > 0")


class NodeResidency:
    def __init__(self, config: ResidencyConfig, weight_bytes: dict[str, int]):
        self.config = config
        self.weight_bytes = dict(weight_bytes)
        self.state = {model: ModelState.REMOTE for model in weight_bytes}
        self._lru = {s: OrderedDict() for s in ModelState}  # most recent last
        for model in weight_bytes:
            self._lru[ModelState.REMOTE][model] = None
        self.num_loads = 0  # counted activations of a model that was not Running (see `activate`)
        self.load_s = 0.0  # the seconds those activations cost

    def ready_cost_s(self, model: str, state: ModelState | None = None) -> float:
        """Seconds until `model` can run here, from its current state (or from `state`)."""
        c, size = self.config, self.weight_bytes[model]
        state = self.state[model] if state is None else state
        cost = 0.0
        if state >= ModelState.REMOTE:
            cost += size / c.network_bytes_per_s
        if state >= ModelState.DISK:
            cost += size / c.nvme_bytes_per_s
        if state >= ModelState.SLEEPING:
            cost += size / c.pcie_bytes_per_s
        if state >= ModelState.CPU:
            cost += c.warmup_s
        return cost

    def runs(self, model: str) -> bool:
        """Whether the model's weights are on the GPU, awake."""
        return self.state.get(model) is ModelState.RUNNING

    def running_models(self) -> set[str]:
        return set(self._lru[ModelState.RUNNING])

    def touch(self, model: str) -> None:
        self._lru[self.state[model]].move_to_end(model)

    def activate(self, model: str, busy_models: set[str] = frozenset(), is_counted: bool = True) -> float | None:
        """Make `model` Running; returns the transition cost, or None if busy models leave no room. A counted
        activation that moves weights adds to `num_loads` and `load_s` (the initial placement is not counted)."""
        if self.state[model] is ModelState.RUNNING:
            self.touch(model)
            return 0.0
        if not self.can_activate(model, busy_models):
            return None
        cost = self.ready_cost_s(model)
        if is_counted:
            self.num_loads += 1
            self.load_s += cost
        self._move(model, ModelState.RUNNING)
        self._rebalance(busy_models | {model})
        return cost

    def can_activate(self, model: str, busy_models: set[str] = frozenset()) -> bool:
        """Whether `activate` would succeed now (it runs, or the busy models leave room for its weights)."""
        return self.state[model] is ModelState.RUNNING or (
            self.weight_bytes[model] <= self.config.gpu_weight_budget_bytes - self._pinned_gpu_bytes(busy_models)
        )

    def displaced_by(self, model: str, busy_models: set[str] = frozenset()) -> list[str]:
        """The Running models that activating `model` now would put to sleep (`activate`'s own spill, tried on a
        copy); none where it runs already or cannot be activated."""
        if self.runs(model) or not self.can_activate(model, busy_models):
            return []
        stub = self.config.sleeping_gpu_bytes if self.state[model] is ModelState.SLEEPING else 0
        if self.tier_bytes(ModelState.RUNNING) - stub + self.weight_bytes[model] <= self.config.gpu_weight_budget_bytes:
            return []  # its weights fit beside everything on the GPU: nothing to spill
        trial = copy.copy(self)
        trial.state, trial._lru = dict(self.state), {s: OrderedDict(d) for s, d in self._lru.items()}
        trial._move(model, ModelState.RUNNING)
        pinned = set(busy_models) | {model}
        trial._spill(ModelState.RUNNING, self.config.gpu_weight_budget_bytes, ModelState.SLEEPING, pinned)
        return [m for m in self._lru[ModelState.RUNNING] if trial.state[m] is not ModelState.RUNNING]

    def place(self, model: str, state: ModelState) -> None:
        """Put a model in a state without cost (initial placement)."""
        self._move(model, state)

    def _pinned_gpu_bytes(self, busy_models: set[str]) -> int:
        return sum(self.weight_bytes[m] for m in busy_models if self.state[m] is ModelState.RUNNING)

    def _move(self, model: str, state: ModelState) -> None:
        del self._lru[self.state[model]][model]
        self.state[model] = state
        self._lru[state][model] = None

    def tier_bytes(self, tier: ModelState) -> int:
        """Bytes a tier holds: GPU = Running weights + Sleeping stubs; CPU = Sleeping + CPU weights."""
        c, w = self.config, self.weight_bytes
        if tier is ModelState.RUNNING:
            return sum(w[m] for m in self._lru[ModelState.RUNNING]) + c.sleeping_gpu_bytes * len(
                self._lru[ModelState.SLEEPING]
            )
        if tier is ModelState.CPU:
            return sum(w[m] for s in (ModelState.SLEEPING, ModelState.CPU) for m in self._lru[s])
        return sum(w[m] for m in self._lru[tier])

    def _rebalance(self, pinned: set[str]) -> None:
        c = self.config
        for tier, budget, down in (
            (ModelState.RUNNING, c.gpu_weight_budget_bytes, ModelState.SLEEPING),
            (ModelState.CPU, c.cpu_budget_bytes, ModelState.DISK),
            (ModelState.DISK, c.disk_budget_bytes, ModelState.REMOTE),
        ):
            self._spill(tier, budget, down, pinned)

    def _spill(self, tier: ModelState, budget: int, down: ModelState, pinned: set[str]) -> None:
        sources = (
            (ModelState.SLEEPING, ModelState.RUNNING)
            if tier is ModelState.RUNNING
            else ((ModelState.CPU, ModelState.SLEEPING) if tier is ModelState.CPU else (tier,))
        )
        while self.tier_bytes(tier) > budget:
            victim = self._lru_victim(sources, pinned)
            if victim is None:
                raise RuntimeError(f"tier {tier.name} over budget with only pinned models left")
            state = self.state[victim]
            next_state = ModelState.CPU if state is ModelState.SLEEPING and tier is ModelState.RUNNING else down
            if tier is ModelState.CPU and state is ModelState.SLEEPING:
                next_state = ModelState.DISK
            self._move(victim, next_state)

    def _lru_victim(self, sources: tuple[ModelState, ...], pinned: set[str]) -> str | None:
        for state in sources:
            for model in self._lru[state]:
                if model not in pinned:
                    return model
        return None


@dataclass(frozen=True)
class ModelNodes:
    """Where a model runs (node names), and where its weights could be loaded now beside the models with stages in
    flight there (`NodeResidency.can_activate`). The router sends a stage to the nodes running its model and loads it
    elsewhere where none runs it (`names`); with S(N,T) it may also load it on a spare node where a stage is predicted
    to end sooner (`serving.sim.slot.scaled_out`), which triage's capacity (`names`) does not count in advance."""

    running: frozenset[str]
    loadable: frozenset[str]

    @property
    def names(self) -> frozenset[str]:
        """The nodes the router would load the model on: those running it, else those that could take it."""
        return self.running or self.loadable

    @classmethod
    def of(cls, model: str, nodes) -> ModelNodes:
        """From the fleet's nodes, each with a `name`, its `residency` (`NodeResidency`) and `busy_models()`."""
        residencies = {node.name: (node.residency, node.busy_models()) for node in nodes}
        running = frozenset(n for n, (r, _) in residencies.items() if r.runs(model))
        loadable = frozenset(
            n for n, (r, busy) in residencies.items() if model in r.weight_bytes and r.can_activate(model, busy)
        )
        return cls(running, loadable - running)
