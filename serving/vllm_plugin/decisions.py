"""The decisions Maestro's vLLM scheduler made, counted, and the log line that reports them (plain Python, no vLLM).

The scheduler logs `LOG_TAG {json}` through vLLM's logger (the engine's log) whenever a count changed, at most once per
`log_period_s`, and always once the engine has nothing left to do (that line marked `"idle": true`: every count of
the work before it is in); `parse_decision_lines` reads them back.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

LOG_TAG = "maestro-scheduler decisions"
_LINE = re.compile(re.escape(LOG_TAG) + r" (\{.*\})")


@dataclass
class Decisions:
    """Counts since the engine started. `num_held_back` counts (request, step) pairs; `num_requests_held_back` the
    requests held back at least once."""

    num_predicted: int = 0  # requests that arrived with a prediction
    num_unpredicted: int = 0  # ... without one (served as vLLM would)
    num_bad_hints: int = 0  # ... with a malformed one (served as without)
    num_admitted: int = 0  # waiting → running moves of predicted requests (first starts and resumes)
    num_held_back: int = 0
    num_preempted: int = 0  # victims chosen by predicted remaining work
    num_preempted_unpredicted: int = 0  # victims chosen by vLLM's own rule (no predicted request was running)
    num_requests_held_back: int = 0
    num_overdue: int = 0  # requests held back past max_hold_s, for which the others were then held (wait_bound.py)
    # admission "adaptive" (adaptive.py), for a request whose footprint did not fit: (request, step) pairs held back
    # because the re-prefill would cost more than the wait (in num_held_back too), and pairs left to vLLM's allocation
    num_adaptive_held: int = 0
    num_adaptive_admitted: int = 0
    num_batch_cost_refused: int = 0  # (request, step) pairs the batch-cost gate held back (in num_held_back too)
    # predicted requests of a workflow that workflow triage shed (triage.py): served behind the rest, no deadline
    num_shed: int = 0
    # A session's KV across its tool call (session_kv.py): turns whose blocks were kept or let go by the tool-KV rule;
    # next turns that started on held blocks (and the tokens they found there) or found none of them; holds that
    # expired, and holds released first under memory pressure.
    num_kv_kept: int = 0
    num_kv_not_kept: int = 0
    num_kv_hits: int = 0
    num_kv_hit_tokens: int = 0
    num_kv_missed: int = 0
    num_kv_expired: int = 0
    num_kv_reclaimed: int = 0
    _held_ids: set[str] = field(default_factory=set, repr=False)  # live requests held back at least once

    def hold_back(self, request_id: str) -> None:
        self.num_held_back += 1
        if request_id not in self._held_ids:
            self._held_ids.add(request_id)
            self.num_requests_held_back += 1

    def forget(self, request_id: str) -> None:
        """The request left the engine."""
        self._held_ids.discard(request_id)

    def snapshot(self) -> dict[str, int]:
        counts = asdict(self)
        counts.pop("_held_ids")
        return counts

    def log_line(self, step: int, is_idle: bool = False) -> str:
        return f"{LOG_TAG} " + json.dumps({"step": step, "idle": is_idle, **self.snapshot()}, separators=(",", ":"))


def parse_decision_lines(text: str) -> list[dict]:
    """Every decisions record in a log, oldest first."""
    return [json.loads(m[1]) for m in _LINE.finditer(text)]
