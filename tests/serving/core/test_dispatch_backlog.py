"""A pool's backlog: the dispatch core says whether stages of one model wait, on nodes that queue several models'."""

from serving.core.dispatch import DispatchCore
from serving.core.request import StageRequest
from serving.core.scheduler import Policy, SchedulerConfig, create_scheduler


def core() -> DispatchCore:
    return DispatchCore(create_scheduler(SchedulerConfig(policy=Policy.EDF)))


def test_only_a_queued_stage_of_the_model_makes_its_pool_wait():
    queue = core()
    other = StageRequest("w1", "s1", "big-model", deadline_s=10.0)
    queue.add(other, now=0.0)
    assert len(queue) == 1 and queue.is_waiting("big-model")
    assert not queue.is_waiting("small-model")  # the node's queue is not empty, but nothing of this model waits
    mine = StageRequest("w2", "s2", "small-model", deadline_s=20.0)
    queue.add(mine, now=0.0)
    assert queue.is_waiting("small-model")
    queue.remove(mine)
    assert not queue.is_waiting("small-model") and queue.is_waiting("big-model")
    queue.remove(mine)  # no longer queued: nothing to take off
    assert queue.num_queued_by_model["small-model"] == 0


def test_a_stage_the_core_takes_off_its_queue_leaves_its_pool_backlog():
    queue = core()
    request = StageRequest("w1", "s1", "m", deadline_s=10.0)
    queue.add(request, now=0.0)
    [decision] = queue.decisions([], now=0.0)  # no node could ever take it: it fails, off the queue
    assert decision.request is request and len(queue) == 0
    assert not queue.is_waiting("m")
