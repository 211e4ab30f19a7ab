"""The dispatch core: which queued stage starts next, and on which node — shared by the gateway and the simulator.

A `DispatchCore` owns one queue (a policy's `Scheduler`) and an optional session cap (`cap.SessionCap`). `decisions`
walks it once, in policy order: the head is the first live stage the cap admits; it starts on the fittest node that
may take it now (`NodeView.admit` answers; fitness S(N,T) or least-loaded, `DispatchConfig.router`). When the head fits
nowhere, it fails if no node could ever take it (`may_fit_later`), else it waits and the core backfills: of the next
`backfill_depth` admitted stages, those that fit now go ahead of it, but no stage is overtaken this way more than
`backfill_max_overtaken` times, so a big stage waits a bounded number of small ones, then the queue is strict
head-of-line again until it goes. A stage that every refusing node has room for but Maestro's batch-cost gate holds
back (`NodeView.admit` answers `HELD_BACK`) waits as a head for the batch work behind it as any other does, but not for
interactive work: while every waiting head is so held, an interactive stage behind them starts where it fits, without
counting as backfill against them (the gate never holds a turn a person waits on, and it holds a batch stage for the
running stages' sake, not for want of room the turn would take). A stage waiting for its held home (below) is no
waiting head for the other nodes: it claims its home, where nothing behind it starts but a turn where the gate alone
holds it, and the walk goes on elsewhere (the simulator queues it at its home; one node's queue there).

A session's next stage names its home node, the node holding its context (`StageRequest.home_node`): while the
context is held there (`is_home_held`) the stage waits for home, else it starts at home where home may start it now
(`goes_home`, the simulator's routing rule too).

The core only decides: it takes a started or failed stage off the queue and yields a `Decision`, a start carrying the
node's admission (opaque here: what the node computed to say yes); the caller applies it (reserves the KV with that
admission, wakes the handler, advances its clock) before asking for the next, since a start changes what fits.
No clock, no I/O: the gateway's async shell and the simulator's event loop both drive it.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from serving.core.admission.cap import SessionCap
from serving.core.request import StageRequest
from serving.core.routing import FitnessConfig, select_node
from serving.core.scheduler import Scheduler


class HeldBack:
    """`NodeView.admit`'s answer where the node has room for the stage but the batch-cost gate holds it back now."""

    def __repr__(self) -> str:
        return "HELD_BACK"


HELD_BACK = HeldBack()


class NodeView(Protocol):
    """What the core needs to know of a node (a gateway `Node`, a simulated node)."""

    name: str

    def admit(self, request: StageRequest) -> object | None:
        """What the node computed to let the stage start here now, for the caller to start it with (None: it may
        not; `HELD_BACK`: it has room, but the batch-cost gate holds the stage back)."""

    def may_fit_later(self, request: StageRequest) -> bool:
        """Whether waiting could let the stage start here (False: it never will, as things are)."""

    def fitness_terms(self, request: StageRequest) -> tuple[float, float, float]:
        """(availability: free KV share, ready cost: time or work until the stage could start, degradation)."""

    def load(self) -> float:
        """Work queued or running here (the least-loaded router's measure)."""


class Router(enum.Enum):
    FITNESS = "fitness"  # S(N,T) = A − λ·T_ready − μ·C_deg (serving/core/routing.py)
    LEAST_LOADED = "least-loaded"


class Outcome(enum.Enum):
    START = "start"  # start the stage on `Decision.node`
    NEVER_FITS = "never-fits"  # no node could ever take it: fail it
    DROPPED = "dropped"  # no longer live (cancelled, abandoned): forget it


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    request: StageRequest
    node: NodeView | None = None
    admission: object = None  # the node's answer to `NodeView.admit`, with START
    is_backfill: bool = False


@dataclass
class DispatchConfig:
    backfill_depth: int = 8  # stages behind a waiting head that may pass it (0 = strict head-of-line)
    backfill_max_overtaken: int = 4  # times one stage may be passed before the queue is strict again
    router: Router = Router.FITNESS  # (or its value: "fitness", "least-loaded")
    fitness: FitnessConfig = field(default_factory=FitnessConfig)

    def __post_init__(self):
        if self.backfill_depth < 0 or self.backfill_max_overtaken < 0:
            raise ValueError("backfill_depth and backfill_max_overtaken must be >= 0")
        self.router = Router(self.router)


def goes_home(is_home_held: bool, may_start_home: Callable[[], bool]) -> bool:
    """Session affinity, the one rule of the gateway and the simulator: whether a session's next stage goes to its home
    node (where its last stage ran). Always while its context is held there (each runtime says what holds it: the
    simulator's kept tool-call KV or its prefix-cache model, the gateway's tool-call hold), so it waits for home rather
    than re-prefill the context elsewhere; once not held, only if home may start it now (`may_start_home`, asked only
    then)."""
    return is_home_held or may_start_home()


def home_of(request: StageRequest, views: Sequence[NodeView]) -> NodeView | None:
    """The view named the stage's home node (`home_node`), if it is among `views`."""
    return next((v for v in views if v.name == request.home_node), None) if request.home_node else None


def choose(request: StageRequest, views: Sequence[NodeView], config: DispatchConfig) -> NodeView | None:
    """The node among `views` the stage should go to (no admission check: callers pass the candidates)."""
    if len(views) <= 1:
        return views[0] if views else None
    if config.router is Router.LEAST_LOADED:
        return min(views, key=lambda v: v.load())
    terms = [v.fitness_terms(request) for v in views]
    return views[select_node(*zip(*terms), config.fitness)]


class DispatchCore:
    """One queue, the session cap, backfill and node choice (see the module docstring)."""

    def __init__(
        self,
        scheduler: Scheduler,
        config: DispatchConfig | None = None,
        cap: SessionCap | None = None,
        is_live: Callable[[StageRequest, float], bool] = lambda request, now: True,
    ):
        self.scheduler, self.config, self.cap, self.is_live = scheduler, config or DispatchConfig(), cap, is_live
        self.overtaken: dict[StageRequest, int] = {}  # times backfill passed a queued stage
        self.num_queued_by_model: Counter[str] = Counter()  # queued stages per model (a pool's backlog)
        self.num_started = 0
        self.num_backfilled = 0

    def __len__(self) -> int:
        return len(self.scheduler)

    def add(self, request: StageRequest, now: float) -> None:
        self.scheduler.add(request, now)
        self.num_queued_by_model[request.model] += 1

    def remove(self, request: StageRequest) -> None:
        if request.queue_seq >= 0:
            self.num_queued_by_model[request.model] -= 1
            self.scheduler.remove(request)
        self.overtaken.pop(request, None)

    def is_waiting(self, model: str) -> bool:
        """Whether a stage of `model` is queued here (a node serving several models may queue others' stages)."""
        return self.num_queued_by_model[model] > 0

    def num_overtaken(self, request: StageRequest) -> int:
        return self.overtaken.get(request, 0)

    def may_go(self, request: StageRequest, now: float) -> bool:
        return self.cap is None or self.cap.admits(request.workflow_id, request.interactive, now)

    def choose_node(
        self, request: StageRequest, views: Sequence[NodeView], now: float
    ) -> tuple[NodeView, object] | None:
        """Where the stage starts now, with the node's admission (`placement`); None if nowhere."""
        return self.placement(request, views, now)[0]

    def placement(
        self, request: StageRequest, views: Sequence[NodeView], now: float
    ) -> tuple[tuple[NodeView, object] | None, bool]:
        """Where the stage starts now, with the node's admission (None: nowhere), and whether every node refusing it
        holds it back by the batch-cost gate alone (`HELD_BACK`: room for it there). By `goes_home`: its held home
        (`held_home`) is its only candidate; else its home node (`home_node`) where it may start now, else the fittest
        node that may."""
        home = home_of(request, views)
        held = self.held_home(request, views, now)
        admissions = {v: v.admit(request) for v in ([held] if held is not None else views)}
        refusals = [a for a in admissions.values() if a is None or a is HELD_BACK]
        is_held_back = bool(refusals) and all(a is HELD_BACK for a in refusals)
        fitting = {v: a for v, a in admissions.items() if a is not None and a is not HELD_BACK}
        if home is not None and goes_home(held is not None, lambda: home in fitting):
            node = home if home in fitting else None
        else:
            node = choose(request, list(fitting), self.config)
        return ((node, fitting[node]) if node is not None else None), is_held_back

    def held_home(self, request: StageRequest, views: Sequence[NodeView], now: float) -> NodeView | None:
        """The stage's home node while its context is held there (`is_home_held`), it has waited less than its
        `home_wait_s` since it was ready, and the node could ever take it: the one node it waits for; None otherwise."""
        is_waiting = request.is_home_held and now - request.ready_s < request.home_wait_s
        home = home_of(request, views) if is_waiting else None
        return home if home is not None and home.may_fit_later(request) else None

    # ---- the decisions ------------------------------------------------------------------------
    def decisions(self, views: Sequence[NodeView], now: float) -> Iterator[Decision]:
        """Starts (and failures) in policy order until the head must wait, then backfill; apply each before taking
        the next. One walk of the queue: taking a stage off it (lazily) does not disturb the walk. While every waiting
        head is held back by the batch-cost gate alone, an interactive stage behind them passes them uncounted."""
        waiting: list[StageRequest] = []  # admitted stages that could not start, the head first
        num_held = 0  # of them, held back by the gate alone (room for them)
        num_behind = 0  # admitted stages examined behind the waiting head
        is_strict = False  # nothing but an interactive stage passing held heads goes any more
        # held homes a stage waits for (`held_home`) → whether the batch-cost gate alone holds it there: nothing behind
        # it starts there but, where the gate holds it, a turn (as a turn passes gate-held heads)
        claimed: dict[str, bool] = {}
        for request in self.scheduler.in_order(now):
            if not self.is_live(request, now):
                if not waiting:
                    yield self._take(Outcome.DROPPED, request)
                continue  # behind a waiting head: dropped when it reaches the head
            if not self.may_go(request, now):
                continue
            passes_held = request.interactive and num_held == len(waiting)
            if waiting and not passes_held:
                num_behind += 1
                if is_strict or num_behind > self.config.backfill_depth:
                    if num_held < len(waiting):
                        return
                    is_strict = True
                    continue
            open_views = [v for v in views if v.name not in claimed or (request.interactive and claimed[v.name])]
            held = self.held_home(request, views, now)
            if held is not None and held not in open_views:
                continue  # it waits for its home, behind another stage waiting there
            chosen, is_held_back = self.placement(request, open_views, now)
            if chosen is None and held is not None:
                claimed[held.name] = is_held_back  # it waits for its home alone: the other nodes go on
            elif chosen is not None:
                if not passes_held:
                    for ahead in waiting:
                        self.overtaken[ahead] = self.num_overtaken(ahead) + 1
                yield self._take(Outcome.START, request, *chosen, is_backfill=bool(waiting))
            elif not waiting and not is_held_back and not any(v.may_fit_later(request) for v in views):
                yield self._take(Outcome.NEVER_FITS, request)
            elif self.num_overtaken(request) >= self.config.backfill_max_overtaken or self.config.backfill_depth == 0:
                if not is_held_back:
                    return  # nothing further back may pass this one
                waiting.append(request)  # nothing further back but a turn may pass this one
                num_held += 1
                is_strict = True
            else:
                waiting.append(request)
                num_held += is_held_back

    def _take(
        self,
        outcome: Outcome,
        request: StageRequest,
        node: NodeView | None = None,
        admission: object = None,
        is_backfill: bool = False,
    ) -> Decision:
        self.remove(request)
        if outcome is Outcome.START:
            self.num_started += 1
            self.num_backfilled += is_backfill
        return Decision(outcome, request, node, admission, is_backfill)

    def held_back(
        self, views: Sequence[NodeView], now: float, since: Callable[[StageRequest], float] = lambda r: r.ready_s
    ) -> tuple[bool, float | None]:
        """For the cap's adaptation: (whether the first stage the cap holds back would fit a node now while no admitted
        stage waits, since when the longest-waiting admitted stage has waited: `since(request)`, its ready time by
        default)."""
        held, waiting_since = None, None
        for request in self.scheduler.in_order(now):
            if not self.is_live(request, now):
                continue
            if self.may_go(request, now):
                waiting_since = min(waiting_since or since(request), since(request))
            elif held is None:
                held = request
        fits = held is not None and waiting_since is None and self.choose_node(held, views, now) is not None
        return fits, waiting_since
