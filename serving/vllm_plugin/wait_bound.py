"""A wait bound on MaestroScheduler's admission (plain Python, no vLLM).

Admission holds back a predicted request whose projected KV does not fit; a large one could then wait for ever
behind a stream of small ones that always fit. Once a request has been held back for `max_hold_s` (on the policy's
clock), it is overdue: until it starts, every other predicted request is held back too, so the running ones drain
until it fits. One request is overdue at a time; with nothing running it starts as vLLM would start it.
"""

from __future__ import annotations


class HoldBound:
    def __init__(self, max_hold_s: float | None):
        self.max_hold_s = max_hold_s
        self.held_since: dict[str, float] = {}  # request id -> when admission first held it back
        self.overdue: str | None = None

    def is_blocked(self, request_id: str) -> bool:
        """Whether another request is overdue, so this one waits whatever its fit."""
        return self.overdue is not None and self.overdue != request_id

    def hold(self, request_id: str, now: float) -> bool:
        """Note a hold-back at `now`; True when it makes this request the overdue one."""
        since = self.held_since.setdefault(request_id, now)
        if self.overdue is None and self.max_hold_s is not None and now - since >= self.max_hold_s:
            self.overdue = request_id
            return True
        return False

    def forget(self, request_id: str) -> None:
        """The request started (or left the engine)."""
        self.held_since.pop(request_id, None)
        if self.overdue == request_id:
            self.overdue = None
