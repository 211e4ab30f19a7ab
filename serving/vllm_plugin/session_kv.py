"""A session's KV kept in vLLM's block pool across its tool call (MARS's rule, `serving/core/tool_kv.py`).

When a turn of an agent session ends in a tool call, vLLM frees its blocks to the prefix cache, where any request may
evict them before the session's next turn comes back. A request that says its session continues (`SessionHint`, two
`vllm_xargs` keys) has its cached blocks kept referenced when it finishes, if the system's tool-KV policy says so
(MARS: re-prefilling the context would take longer than the predicted tool time). A hold ends:
- at the hit: the session's next turn starts and takes the blocks as prefix-cache hits (`release_at_start`);
- at expiry: the tool ran longer than held for, and no turn of the session has arrived (`expire`);
- under memory pressure, first: a request cannot get the blocks it needs (`reclaim`), the latest-expiring hold goes.
Only full blocks that vLLM has cached (hashed) are held: a partial last block can never be a prefix hit.

`SessionHolds` talks to vLLM's `BlockPool` through `touch` (a reference more) and `free_blocks` (a reference less).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from serving.core.tool_kv import ToolCallContext, ToolKV
from serving.vllm_plugin.decisions import Decisions

SESSION_KEY = "maestro_session"  # vllm_xargs: the session this request is a turn of (str)
TOOL_S_KEY = "maestro_tool_s"  # vllm_xargs: predicted tool time after this turn, on the plugin's clock (number)


@dataclass(frozen=True, slots=True)
class SessionHint:
    """A turn of `session` predicted to end in a tool call of `tool_s`, after which the session continues; `tool_s`
    0 (or absent): the session continues without a tool call to wait for, so nothing is held."""

    session: str
    tool_s: float = 0.0

    def to_xargs(self) -> dict[str, str | float]:
        return {SESSION_KEY: self.session, TOOL_S_KEY: self.tool_s}


def session_hint_from_extra_args(extra_args: dict | None) -> SessionHint | None:
    """The request's session hint, or None; ValueError naming the key when it is malformed."""
    extra_args = extra_args or {}
    session = extra_args.get(SESSION_KEY)
    if session is None:
        return None
    tool_s = extra_args.get(TOOL_S_KEY, 0.0)
    if not isinstance(session, str) or not session:
        raise ValueError(f"extra_args[{SESSION_KEY!r}] must be a non-empty string, got {session!r}")
    if isinstance(tool_s, bool) or not isinstance(tool_s, (int, float)) or not 0 <= tool_s < math.inf:
        raise ValueError(f"extra_args[{TOOL_S_KEY!r}] must be a number of seconds >= 0, got {tool_s!r}")
    return SessionHint(session, float(tool_s))


@dataclass(slots=True)
class Hold:
    blocks: list  # vLLM KVCacheBlocks, one reference each taken by this hold
    until_s: float
    claimed_by: str = ""  # the id of the session's next turn once it arrived: the hold then waits for its start


class SessionHolds:
    """The holds alive in one engine, by session."""

    def __init__(
        self, block_pool, tool_kv: ToolKV, prefill_s_per_token: float, hold_factor: float, decisions: Decisions
    ):
        self.block_pool, self.tool_kv, self.decisions = block_pool, tool_kv, decisions
        self.prefill_s_per_token, self.hold_factor = prefill_s_per_token, hold_factor
        self.holds: dict[str, Hold] = {}

    def keep(self, hint: SessionHint, blocks: list, num_tokens: int, now: float, num_running: int = 0) -> None:
        """A turn of `hint.session` finished with `blocks` (its KV, first block first) over `num_tokens` tokens;
        `num_running` requests run beside it, each of which a later re-prefill of this context would hold up."""
        if hint.tool_s <= 0:
            return
        self._release(hint.session)
        reprefill_s = num_tokens * self.prefill_s_per_token
        call = ToolCallContext(
            hint.session, num_tokens, reprefill_s, hint.tool_s, others_stall_s=reprefill_s * num_running
        )
        ttl_s = self.tool_kv.ttl_s(call)
        cached = [block for block in blocks if block.block_hash is not None and not block.is_null]
        if ttl_s <= 0 or not cached:
            self.decisions.num_kv_not_kept += 1
            return
        self.block_pool.touch(cached)
        hold_s = ttl_s if math.isfinite(ttl_s) else self.hold_factor * hint.tool_s
        self.holds[hint.session] = Hold(cached, now + hold_s)
        self.decisions.num_kv_kept += 1

    def claim(self, session: str, request_id: str) -> None:
        """The session's next turn arrived: its hold no longer expires, it waits for that turn's start."""
        if (hold := self.holds.get(session)) is not None:
            hold.claimed_by = request_id

    def release_at_start(self, session: str, block_ids: set[int], block_size: int) -> None:
        """The session's next turn started holding `block_ids`: the held blocks it took are its prefix hit."""
        hold = self.holds.get(session)
        if hold is None:
            return
        num_hit = sum(block.block_id in block_ids for block in hold.blocks)
        self.decisions.num_kv_hits += num_hit > 0
        self.decisions.num_kv_missed += num_hit == 0
        self.decisions.num_kv_hit_tokens += num_hit * block_size
        self._release(session)

    def forget(self, session: str, request_id: str) -> None:
        """A request left the engine; a hold it had claimed without starting goes."""
        hold = self.holds.get(session)
        if hold is not None and hold.claimed_by == request_id:
            self.decisions.num_kv_expired += 1
            self._release(session)

    def expire(self, now: float) -> None:
        for session, hold in list(self.holds.items()):
            if not hold.claimed_by and now >= hold.until_s:
                self.decisions.num_kv_expired += 1
                self._release(session)

    def reclaim(self, keep_session: str | None) -> bool:
        """Memory pressure: release the hold that would be kept longest (not `keep_session`'s); False if none."""
        others = [s for s in self.holds if s != keep_session]
        if not others:
            return False
        self.decisions.num_kv_reclaimed += 1
        self._release(max(others, key=lambda s: self.holds[s].until_s))
        return True

    def num_releasable_blocks(self, keep_session: str | None) -> int:
        """Blocks that only holds (not `keep_session`'s) keep: a release would make them free."""
        return sum(
            block.ref_cnt == 1
            for session, hold in self.holds.items()
            if session != keep_session
            for block in hold.blocks
        )

    def _release(self, session: str) -> None:
        hold = self.holds.pop(session, None)
        if hold is not None:
            # The tail first: vLLM evicts free blocks in the order they were freed.
            self.block_pool.free_blocks(reversed(hold.blocks))
