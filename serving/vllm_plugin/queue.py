"""vLLM's waiting queue with Maestro's order for the requests that carry a prediction (scheduler.py).

`schedule()` peeks, pops and prepends to `Scheduler.waiting`; this queue answers those calls with the policy object's
order (`serving.core.scheduler.create_scheduler`, the one the gateway and the simulator use) for predicted requests and
vLLM's own order (the queue vLLM made for its `--scheduling-policy`) for the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request

from serving.core.request import StageRequest
from serving.vllm_plugin.hints import MaestroHints, request_from_hints


class MaestroRequestQueue(RequestQueue):
    """vLLM's waiting queue with Maestro's order for predicted requests.

    Predicted requests are ordered by the policy object; the others stay in `vllm_queue` in vLLM's own order. Between
    the two heads, the one that arrived first goes first, so a queue of only one kind is that kind's order.
    `now` is the step's clock, set by the scheduler before each step, so that a peek and the pop after it agree.
    """

    def __init__(
        self, policy, vllm_queue: RequestQueue, hints: dict[str, MaestroHints], decode_s_per_token: float, now: float
    ):
        self.policy, self.vllm_queue, self.hints = policy, vllm_queue, hints
        self.decode_s_per_token = decode_s_per_token
        self.stages: dict[str, StageRequest] = {}  # predicted requests queued here, by request id
        self.now = now

    def add_request(self, request: Request) -> None:
        hints = self.hints.get(request.request_id)
        if hints is None:
            self.vllm_queue.add_request(request)
            return
        if request.request_id in self.stages:
            raise RuntimeError(f"{request.request_id} queued twice")
        stage = request_from_hints(
            request.request_id,
            request.arrival_time,
            request.num_prompt_tokens,
            request.max_tokens,
            hints,
            self.decode_s_per_token,
        )
        stage.payload = request
        self.stages[request.request_id] = stage
        self.policy.add(stage, self.now)

    @staticmethod
    def _is_mine_first(mine: Request | None, theirs: Request | None) -> bool:
        """Whether the predicted head goes before vLLM's: it arrived first, or vLLM's queue is empty."""
        return theirs is None or (mine is not None and mine.arrival_time <= theirs.arrival_time)

    def _head(self) -> Request | None:
        stage = self.policy.peek(self.now)
        mine = stage.payload if stage is not None else None
        theirs = self.vllm_queue.peek_request() if self.vllm_queue else None
        return mine if self._is_mine_first(mine, theirs) else theirs

    def peek_request(self) -> Request:
        head = self._head()
        if head is None:
            raise IndexError("peek from an empty queue")
        return head

    def pop_request(self) -> Request:
        head = self.peek_request()
        if head.request_id in self.stages:
            self.policy.remove(self.stages.pop(head.request_id))
            return head
        return self.vllm_queue.pop_request()

    def prepend_request(self, request: Request) -> None:
        """A predicted request goes back in policy order (as vLLM's priority queue does); the others to vLLM's."""
        self.prepend_requests([request])

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        requests = list(requests)
        for request in requests:
            if request.request_id in self.hints:
                self.add_request(request)
        self.vllm_queue.prepend_requests([r for r in requests if r.request_id not in self.hints])

    def remove_request(self, request: Request) -> None:
        if request.request_id in self.stages:
            self.policy.remove(self.stages.pop(request.request_id))
        else:
            self.vllm_queue.remove_request(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Removes those that are queued here; the others are ignored (as vLLM's queues do)."""
        others = []
        for request in requests:
            stage = self.stages.pop(request.request_id, None)
            if stage is not None:
                self.policy.remove(stage)
            else:
                others.append(request)
        self.vllm_queue.remove_requests(others)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __len__(self) -> int:
        return len(self.policy) + len(self.vllm_queue)

    def __iter__(self) -> Iterator[Request]:
        mine = (stage.payload for stage in self.policy.in_order(self.now))
        theirs = iter(self.vllm_queue)
        head_1, head_2 = next(mine, None), next(theirs, None)
        while head_1 is not None or head_2 is not None:
            if self._is_mine_first(head_1, head_2):
                yield head_1
                head_1 = next(mine, None)
            else:
                yield head_2
                head_2 = next(theirs, None)
