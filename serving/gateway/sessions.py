"""MARS's session controls in the gateway, as far as a proxy in front of vLLM can act.

A session is one workflow between and during its calls. The gateway sees each call arrive and end, and from that:

- **Affinity.** A session's context lives where its last stage ran: vLLM's prefix cache holds the prompt's blocks
  there. Its next stage names that node (`StageRequest.home_node`) and goes by the dispatch core's rule
  (`serving.core.dispatch.goes_home`, the simulator's too): while the context is held there it waits for that node
  rather than re-prefill the context elsewhere, but no longer than that re-prefill would take (`home_wait_s`: its
  prompt × `prefill_s_per_token`; waiting longer than the cost it avoids would be the worse bet, and a slow or
  overloaded home would hold its sessions without end); else it goes there when it may start now, else to the fittest
  node. (The simulator routes a stage once, when it is ready: there it waits at a home holding its context.)
  Held, here, means the session's tool-call hold (below) was still on when its next call arrived (`Home.is_held`):
  the hold keeps the blocks out of other stages' reach, so vLLM's prefix cache still has them. Once a hold ends (its
  TTL, or the tool-KV policy chose to evict, or the node had no room to hold), the gateway cannot know what vLLM's
  prefix cache still holds of the context (vLLM reports no per-prompt cache contents), nor whether a node running
  Maestro's vLLM scheduler kept it in its own pool (the engine's hold, below), so the stage is not held and goes
  home only if home may start it now.
- **Tool phases.** A stage that ended in a tool call (its answer holds tool_calls, or its caller said
  `x-maestro-tool-call: true`) starts one; the session's next call ends it, and the gap is the
  tool's time, learnt as a moving average per (app, role) of the stage that called it. While the phase lasts, the
  tool-KV policy (serving/core/tool_kv.py; MARS: keep while re-prefilling the context would take longer than the tool is
  predicted to run) holds the session's context on its node or lets it go. Held, its blocks count as used there
  (`Node.hold`): the gateway admits no stage into them, so vLLM's prefix cache keeps the context for the next call.
  A hold ends when the session's next call arrives or its TTL passes.
- **The session cap.** Sessions in a tool phase are the tool pressure MARS's AIMD window (admission/aimd.py) adapts
  to, with vLLM's KV usage. A session holds its place in the cap from its first start until it ends: the caller
  says so (`x-maestro-final: true` on its last call) or it sends nothing for `idle_s`.
- **The engine's hold** (a node running Maestro's vLLM scheduler, serving/vllm_plugin/session_kv.py): each call goes
  with its session (the workflow's turns of its role) and, where the stage model predicts the turn ends in a tool
  call (`p_tool` ≥ `TOOL_CALL_P`), that tool's predicted time (the (app, role)'s moving average above), so the
  engine can keep the context in its own block pool across the tool call; 0 otherwise, and the engine keeps nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from serving.core.admission.cap import SessionCap
from serving.core.scheduler.pool_window import ToolPool
from serving.core.tool_kv import ToolCallContext, ToolTimes, create_tool_kv
from serving.gateway.nodes import Node
from serving.vllm_plugin.session_kv import SessionHint

DEFAULT_TOOL_S = 1.0  # the predicted tool time of a (app, role) whose tool calls were never timed
# A turn is predicted to end in a tool call when its stage prediction's calibrated p_tool is at least this (the split
# between the predictor's "tool" and "text" calibration groups, pipelines/calibration.py).
TOOL_CALL_P = 0.5


@dataclass(frozen=True, slots=True)
class Home:
    """Where an arriving call's session context lives: the node its last stage ran on ('' if none or down), and whether
    the context was held there for this call (a tool-call hold still on when the call arrived)."""

    node: str = ""
    is_held: bool = False


@dataclass(slots=True)
class Session:
    node: Node | None = None  # where its last stage ran (its context)
    last_seen_s: float = 0.0
    tool_key: str = ""  # (app, role) of the stage whose tool call is running
    tool_since_s: float | None = None  # in a tool phase since (None: not in one)
    hold_until_s: float = 0.0


class Sessions:
    def __init__(
        self,
        tool_kv: str = "mars",
        idle_s: float = 30.0,
        prefill_s_per_token: float = 1e-4,
        cap: SessionCap | None = None,
        on_tool_s: Callable[[str, float], None] | None = None,  # (workflow, seconds) where a tool phase ends
        tool_workers: int = 4,  # the callers' tool workers
    ):
        self.tool_kv, self.tool_workers = create_tool_kv(tool_kv), tool_workers
        self.on_tool_s = on_tool_s
        self.idle_s, self.prefill_s_per_token, self.cap = idle_s, prefill_s_per_token, cap
        self.sessions: dict[str, Session] = {}
        self.tool_times = ToolTimes()  # by (app, role) of the stage that called the tool
        self.num_kept = self.num_evicted = self.num_hold_refused = self.num_ended = self.num_expired = 0

    # ---- a call's life ------------------------------------------------------------------------
    def arrive(self, workflow_key: str, now: float) -> Home:
        """A call of the session arrived: its tool phase (if any) is over and its hold goes. Returns where its
        context lives, and whether it was held there until now."""
        session = self.sessions.get(workflow_key)
        if session is None:
            self.sessions[workflow_key] = Session(last_seen_s=now)
            return Home()
        if session.tool_since_s is not None:
            self.tool_times.observe(session.tool_key, now - session.tool_since_s)
            self.tool_kv.observe(session.tool_key, now - session.tool_since_s)
            if self.on_tool_s is not None:
                self.on_tool_s(workflow_key, now - session.tool_since_s)
            session.tool_since_s = None
        is_held = bool(session.hold_until_s)
        self._unhold(workflow_key, session)
        session.last_seen_s = now
        if session.node is None or not session.node.is_healthy:
            return Home()
        return Home(session.node.name, is_held)

    def stage_ended(
        self,
        workflow_key: str,
        node: Node | None,
        context_tokens: int,
        is_tool_call: bool,
        tool_key: str,
        is_final: bool,
        now: float,
    ) -> None:
        """A stage of the session ended on `node` with `context_tokens` of prompt and output."""
        session = self.sessions.setdefault(workflow_key, Session())
        session.node, session.last_seen_s = node or session.node, now
        if is_final:
            self.end(workflow_key)
            return
        if not is_tool_call or node is None:
            return
        session.tool_key, session.tool_since_s = tool_key, now
        # re-prefilled later, the context would hold up each call then running on the node about as long as itself
        reprefill_s = context_tokens * self.prefill_s_per_token
        ttl = self.tool_kv.ttl_s(
            ToolCallContext(
                tool_key,
                context_tokens,
                reprefill_s,
                self.tool_times.get(tool_key, DEFAULT_TOOL_S),
                others_stall_s=reprefill_s * node.num_inflight,
            )
        )
        if ttl <= 0:
            self.num_evicted += 1
        elif node.hold(workflow_key, context_tokens):
            self.num_kept += 1
            session.hold_until_s = now + min(ttl, self.idle_s)
        else:
            self.num_hold_refused += 1

    def end(self, workflow_key: str) -> None:
        """The session is over: its hold and its place in the cap go."""
        session = self.sessions.pop(workflow_key, None)
        if session is None:
            return
        self._unhold(workflow_key, session)
        if self.cap is not None:
            self.cap.end(workflow_key)
        self.num_ended += 1

    def expire(self, now: float, busy: set[str]) -> None:
        """At each /metrics poll: holds past their TTL go; sessions silent for idle_s (none of their calls queued or
        running: `busy`) end."""
        for key, session in list(self.sessions.items()):
            if key in busy:
                continue
            if now - session.last_seen_s >= self.idle_s:
                self.num_expired += 1
                self.end(key)
            elif session.hold_until_s and now >= session.hold_until_s:
                self._unhold(key, session)

    def engine_hint(self, workflow_key: str, app: str | None, role: str, p_tool: float) -> SessionHint:
        """What a node running Maestro's vLLM scheduler is told of this call's session: the workflow's turns of `role`,
        and the predicted time of the tool call the stage model predicts the turn ends in (0 when it predicts none)."""
        key = tool_key(app, role)
        tool_s = self.tool_times.get(key, DEFAULT_TOOL_S) if p_tool >= TOOL_CALL_P else 0.0
        return SessionHint(f"{workflow_key}/{role}", round(tool_s, 4))

    @property
    def tool_s(self) -> dict[str, float]:
        """(app, role) → the moving average of its tool calls' time."""
        return self.tool_times.ema_s

    # ---- what the cap adapts to ---------------------------------------------------------------------
    @property
    def num_in_tool(self) -> int:
        return sum(s.tool_since_s is not None for s in self.sessions.values())

    def tool_pool(self) -> ToolPool:
        """The callers' tool workers as triage reads them: `tool_workers` seconds of tool work a second, saturated
        while more sessions are in a tool call than they have workers."""
        return ToolPool(float(self.tool_workers), self.num_in_tool > self.tool_workers)

    def _unhold(self, workflow_key: str, session: Session) -> None:
        if session.hold_until_s and session.node is not None:
            session.node.unhold(workflow_key)
        session.hold_until_s = 0.0

    def snapshot(self) -> dict:
        return {
            "tool_kv": self.tool_kv.config.policy,
            "sessions": len(self.sessions),
            "in_tool": self.num_in_tool,
            "kept": self.num_kept,
            "evicted": self.num_evicted,
            "hold_refused": self.num_hold_refused,
            "ended": self.num_ended,
            "expired": self.num_expired,
            "tool_s": {k: round(v, 3) for k, v in sorted(self.tool_s.items())[:50]},
            **({"cap": self.cap.snapshot()} if self.cap is not None else {}),
        }


def tool_key(app: str | None, role: str) -> str:
    return f"{app or '-'}/{role}"
