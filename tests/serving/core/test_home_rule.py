"""Session affinity, one rule for the gateway and the simulator (`serving.core.dispatch.goes_home`): a session's next
stage waits for its home node while its context is held there, else goes home only if home may start it now."""

from serving.core.dispatch import HELD_BACK, DispatchConfig, DispatchCore, Outcome, goes_home
from serving.core.request import StageRequest
from serving.core.scheduler import Policy, SchedulerConfig, create_scheduler


class Node:
    """A node that may start every stage now (`is_free`) or none; `may_ever`: whether it could ever."""

    def __init__(self, name: str, is_free: bool, may_ever: bool = True, free_share: float = 0.5):
        self.name, self.is_free, self.may_ever, self.free_share = name, is_free, may_ever, free_share
        self.num_asked = 0
        self.small_ids: set[str] = set()  # workflows with a stage small enough to start here while it is not free

    def admit(self, request: StageRequest) -> object | None:
        self.num_asked += 1
        return f"admitted by {self.name}" if self.is_free or request.workflow_id in self.small_ids else None

    def may_fit_later(self, request: StageRequest) -> bool:
        return self.may_ever

    def fitness_terms(self, request: StageRequest) -> tuple[float, float, float]:
        return self.free_share, 0.0, 0.0

    def load(self) -> float:
        return 0.0


def core_with(*requests: StageRequest) -> DispatchCore:
    core = DispatchCore(create_scheduler(SchedulerConfig(policy=Policy.FCFS)), DispatchConfig())
    for request in requests:
        core.add(request, now=0.0)
    return core


def next_stage(is_home_held: bool) -> StageRequest:
    return StageRequest("w", "s2", "m", home_node="home", is_home_held=is_home_held)


def test_a_held_home_that_cannot_start_the_stage_now_keeps_it_waiting():
    home, other = Node("home", is_free=False), Node("other", is_free=True)
    core = core_with(next_stage(is_home_held=True))
    assert core.choose_node(next_stage(is_home_held=True), [home, other], now=0.0) is None
    assert list(core.decisions([home, other], now=0.0)) == [] and len(core) == 1
    assert other.num_asked == 0  # only home is considered while it holds the context
    home.is_free = True
    [decision] = core.decisions([home, other], now=1.0)
    assert decision.outcome is Outcome.START and decision.node is home


def test_a_stage_waiting_for_its_held_home_claims_that_node_alone():
    home, other = Node("home", is_free=False), Node("other", is_free=True)
    held = next_stage(is_home_held=True)
    behind = [StageRequest(f"v{i}", "s", "m") for i in range(6)]  # more than backfill_max_overtaken (4)
    core = core_with(held, *behind)
    started = [(d.request.workflow_id, d.node.name) for d in core.decisions([home, other], now=0.0)]
    assert started == [(f"v{i}", "other") for i in range(6)]  # the other node goes on; none counts as backfill
    assert core.num_backfilled == 0 and len(core) == 1
    home.small_ids, other.is_free = {"small"}, False  # home has room for a small stage only; the other node for none
    core = core_with(next_stage(is_home_held=True), StageRequest("small", "s", "m"))
    assert list(core.decisions([home, other], now=1.0)) == []  # home is claimed: the small stage does not take it
    assert len(core) == 2


def test_a_home_that_no_longer_holds_the_context_takes_the_stage_only_if_it_may_start_it_now():
    home, other = Node("home", is_free=False), Node("other", is_free=True)
    [decision] = core_with(next_stage(is_home_held=False)).decisions([home, other], now=0.0)
    assert decision.outcome is Outcome.START and decision.node is other
    home.is_free = True  # home may start it: home, though the other node is fitter
    other.free_share = 0.9
    assert core_with().choose_node(next_stage(is_home_held=False), [home, other], now=0.0)[0] is home


def test_a_held_home_that_could_never_take_the_stage_does_not_keep_it():
    home, other = Node("home", is_free=False, may_ever=False), Node("other", is_free=True)
    [decision] = core_with(next_stage(is_home_held=True)).decisions([home, other], now=0.0)
    assert decision.node is other


def test_the_rule_asks_whether_home_may_start_the_stage_only_when_the_context_is_not_held():
    asked = []

    def may_start_home() -> bool:
        asked.append(True)
        return False

    assert goes_home(True, may_start_home) and not asked
    assert not goes_home(False, may_start_home) and asked


class ClosedCap:
    """A session cap that admits no workflow."""

    def admits(self, workflow_id: str, interactive: bool, now: float) -> bool:
        return False


def test_the_caps_question_whether_a_held_stage_would_fit_now_reads_the_placement():
    core = DispatchCore(create_scheduler(SchedulerConfig(policy=Policy.FCFS)), DispatchConfig(), cap=ClosedCap())
    core.add(StageRequest("w", "s1", "m"), now=0.0)
    assert core.held_back([Node("a", is_free=True)], now=0.0) == (True, None)
    assert core.held_back([Node("a", is_free=False)], now=0.0) == (False, None)


class GatedNode(Node):
    """A node with room for every stage whose batch-cost gate holds batch work back (`HELD_BACK`) but never a turn."""

    def admit(self, request: StageRequest) -> object | None:
        self.num_asked += 1
        return f"admitted by {self.name}" if request.interactive else HELD_BACK


def test_a_turn_passes_a_stage_the_gate_holds_at_its_held_home_and_batch_work_does_not():
    home, other = GatedNode("home", is_free=True), Node("other", is_free=False)
    turn = StageRequest("t", "s", "m", interactive=True)
    batch = StageRequest("b", "s", "m")
    started = [
        (d.request.workflow_id, d.node.name)
        for d in core_with(next_stage(True), batch, turn).decisions([home, other], now=0.0)
    ]
    assert started == [("t", "home")]  # the turn starts where the held stage waits; the batch stage behind it does not


def test_a_held_stage_waits_for_its_home_no_longer_than_its_home_wait():
    home, other = Node("home", is_free=False), Node("other", is_free=True)
    request = StageRequest("w", "s2", "m", ready_s=10.0, home_node="home", is_home_held=True, home_wait_s=0.5)
    core = core_with(request)
    assert list(core.decisions([home, other], now=10.4)) == []  # within its wait: home only
    [decision] = core.decisions([home, other], now=10.5)  # waited as long as a re-prefill elsewhere takes: any node
    assert decision.outcome is Outcome.START and decision.node is other
