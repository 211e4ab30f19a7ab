"""A stage the batch-cost gate holds back does not hold up the queue behind it; a stage without room still does."""

from serving.core.dispatch import HELD_BACK, DispatchConfig, DispatchCore, Outcome
from serving.core.request import StageRequest
from serving.core.scheduler import Policy, SchedulerConfig, create_scheduler


class GatedNode:
    """One node with room for every stage, whose gate holds every batch stage back; `is_full`: no room at all."""

    name = "a"

    def __init__(self, is_full: bool = False):
        self.is_full = is_full

    def admit(self, request: StageRequest) -> object | None:
        if self.is_full:
            return None
        return "admitted" if request.interactive else HELD_BACK

    def may_fit_later(self, request: StageRequest) -> bool:
        return True

    def fitness_terms(self, request: StageRequest) -> tuple[float, float, float]:
        return 1.0, 0.0, 0.0

    def load(self) -> float:
        return 0.0


def queued(*requests: StageRequest) -> DispatchCore:
    core = DispatchCore(create_scheduler(SchedulerConfig(policy=Policy.TRIAGE)), DispatchConfig(backfill_depth=0))
    for request in requests:
        core.add(request, now=0.0)
    return core


def test_a_turn_behind_a_batch_stage_the_gate_holds_starts_even_in_a_strict_queue():
    job = StageRequest("job", "s", "m", deadline_s=10.0)
    turn = StageRequest("chat", "s", "m", deadline_s=50.0, interactive=True)
    core = queued(job, turn)
    assert [r.workflow_id for r in core.scheduler.in_order(0.0)] == ["job", "chat"]  # the job's deadline is earlier
    started = [(d.outcome, d.request.workflow_id) for d in core.decisions([GatedNode()], now=0.0)]
    assert started == [(Outcome.START, "chat")]  # before: the held job was a waiting head, and nothing passed it
    assert len(core) == 1 and core.scheduler.peek(0.0) is job  # the held job stays queued, first in line


def test_a_stage_without_room_is_still_a_waiting_head():
    job = StageRequest("job", "s", "m", deadline_s=10.0)
    turn = StageRequest("chat", "s", "m", deadline_s=50.0, interactive=True)
    core = queued(job, turn)
    assert list(core.decisions([GatedNode(is_full=True)], now=0.0)) == []
    assert len(core) == 2


def test_batch_work_behind_a_held_batch_stage_still_waits_for_it():
    # the gate holds batch work for the running stages' sake: a batch stage behind a held one is no turn, and in a
    # strict queue it does not pass (batch-only runs are dispatched as before)
    first, second = StageRequest("job", "s", "m", deadline_s=10.0), StageRequest("job2", "s", "m", deadline_s=20.0)
    admitted = []

    class SecondFits(GatedNode):
        def admit(self, request: StageRequest) -> object | None:
            admitted.append(request.workflow_id)
            return "admitted" if request is second else HELD_BACK

    core = queued(first, second)
    assert list(core.decisions([SecondFits()], now=0.0)) == [] and admitted == ["job"]
