"""What one more stage in a node's batch costs the stages already running there, and whether they can afford it.

Continuous batching runs every sequence once per decode step, and a step reads every running sequence's KV: a stage
admitted now adds its prefill to every running stage's time once (prefill stalls decoding) and its KV read to every
step they share. For a running stage r with m_r predicted decode tokens still to come, a candidate x that prefills in
`stall_s` and adds `added_step_s` to each step delays r by

    delay_r = stall_s + min(m_r, n_x) · added_step_s            (n_x: x's predicted output tokens still to come)

and r's slack is  deadline_r − now − m_r · pace  at the node's *measured* pace (seconds per token of a running stage,
the prefill stalls of recent admissions included: on a node busy prefilling, decoding gets only what is left). The gate
refuses x while some running stage that could still make its deadline (at the bare step time, were nothing more
admitted) would be pushed past it: delay_r > `slack_share` · slack_r. Stages already past saving do not hold the
batch back, and a candidate that would itself miss by waiting goes in anyway: with `hold_while="next"`, waiting for
the next running stage to end; with "endangered", until the last stage it endangers ends (at the measured pace), since
holding it back longer only trades their misses for its own; with "by_class" (the default), the second on a node that
runs an interactive stage and the first elsewhere: on the dev side the second served mixed classes and cost heavy
batch-only overload, whose held work is mostly of workflows that miss anyway (serving/EXPERIMENTS.md).
A running stage's m_r is its predicted rest (`remaining_tokens`: the point, then the reserve), read as the
candidate's n_x is: a bound below the point (the reserve mirrored around it) would rate a stage the shorter the wider
its reserve, and let in the stalls its own prediction says endanger it.
Holding back stops the stalls, so the pace recovers and the gate opens again; meanwhile a queue forms and its order
(least slack first) decides who goes next. The gate acts only on a congested node (pace ≥ `min_stretch` × step).

The gate holds batch work only: an interactive candidate (a turn a person waits on) always goes in. Its stall still
counts — it shows in the node's measured pace, so batch candidates are held the longer — and a running interactive
stage is still protected from batch candidates like any running stage.

Every runtime describes its node the same way, as a `NodeState` (its running stages, its pace, its step, what a
prefill stalls), and a stage that asks to join as a `Candidate`; `gate_inputs` turns the two into what the gate reads,
one way for all: the simulator (its clock and cost model), the gateway (what its calls measured) and the vLLM plugin
(its requests and the steps it timed). Where a runtime lacks a measurement, `NodeState`'s documented default applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from maestro.prediction import OutputSize
from maestro.progressive import UNKNOWN, ProgressiveTable, length_median


def remaining_tokens(
    tokens_pred: float,
    tokens_reserve: float,
    produced: float,
    step_tokens: float = 16.0,
    table: ProgressiveTable | None = None,
    prefix: str = UNKNOWN,
) -> float:
    """Predicted decode tokens still to come for a stage that has produced `produced`: with a progressive `table`,
    the re-predicted median's rest (`maestro.progressive.length_bounds`, `prefix` the class of its first tokens);
    without, its prediction's rest while it is under it, then the rest of its reserve (the calibrated upper bound),
    then `step_tokens` at a time."""
    if table is not None and produced >= table.min_produced:
        return length_median(produced, tokens_pred, tokens_reserve, table=table, prefix=prefix) - produced
    for bound in (tokens_pred, tokens_reserve):
        if produced < bound:
            return bound - produced
    return step_tokens


HOLD_WHILE = ("next", "endangered", "by_class")


@dataclass
class BatchCostConfig:
    slack_share: float = 1.0  # the share of a running stage's slack that one admission may use up
    # The gate acts only while prefill stalls stretch the node's pace this many times or more: below it the node is
    # not congested enough for holding a stage back to pay (serving/EXPERIMENTS.md).
    min_stretch: float = 2.0
    # How long a held candidate must be able to wait: until the next running stage ends ("next"), until the last
    # stage it endangers ends ("endangered"), or the second on a node running interactive work and the first elsewhere
    # ("by_class"); the three measured side by side in serving/EXPERIMENTS.md.
    hold_while: str = "by_class"

    def __post_init__(self):
        if not 0 < self.slack_share <= 1:
            raise ValueError(f"batch cost: slack_share must be in (0, 1], got {self.slack_share}")
        if self.min_stretch < 1:
            raise ValueError(f"batch cost: min_stretch must be >= 1, got {self.min_stretch}")
        if self.hold_while not in HOLD_WHILE:
            raise ValueError(f"batch cost: hold_while must be one of {', '.join(HOLD_WHILE)}, got {self.hold_while!r}")


@dataclass
class RunningBatch:
    """The running stages of one node as the gate reads them (arrays, one entry a stage)."""

    remaining_tokens: np.ndarray  # predicted (`remaining_tokens`), as the candidate's own tokens are read
    slack_s: np.ndarray  # at the node's measured pace (prefill stalls included)
    is_savable: np.ndarray  # could still make its deadline at the bare step time, if nothing more were admitted
    pace_s_per_token: float
    step_s: float
    is_running_interactive: bool = False  # some running stage is of an interactive workflow

    @classmethod
    def of(
        cls,
        remaining: list[float],
        deadlines_s: list[float],
        pace_s_per_token: float,
        step_s: float,
        now: float,
        is_running_interactive: bool = False,
    ) -> RunningBatch:
        """`deadlines_s`: each stage's deadline less the prefills already under way (they stall it too); `step_s`:
        the batch's bare decode step; `pace_s_per_token`: what a running stage's token stream shows now."""
        tokens = np.asarray(remaining, dtype=float)
        time_left_s = np.asarray(deadlines_s, dtype=float) - now
        return cls(
            tokens,
            time_left_s - tokens * pace_s_per_token,
            time_left_s - tokens * step_s >= 0,
            pace_s_per_token,
            step_s,
            is_running_interactive,
        )

    def next_end_s(self) -> float:
        """Seconds until the running stage predicted to end first ends, at the measured pace."""
        return float(self.remaining_tokens.min()) * self.pace_s_per_token

    def end_s(self, among: np.ndarray) -> float:
        """Seconds until the last of the running stages marked in `among` is predicted to end, at the measured pace
        (0 when none is marked)."""
        return float(self.remaining_tokens[among].max(initial=0.0)) * self.pace_s_per_token


# A candidate's added step time where the runtime does not measure it apart from the pace (the gateway, the plugin):
# a step's cost of one more sequence then shows up in the measured pace, as the prefill stalls do.
UNMEASURED_ADDED_STEP_S = 0.0


@dataclass(frozen=True, slots=True)
class RunningStage(OutputSize):
    """A stage running on a node, as every runtime describes it to the gate: its sized output (`OutputSize`,
    keyword-only), deadline, start and output so far."""

    deadline_s: float
    started_s: float  # when it started there (its prefill began)
    produced: float | None = None  # output tokens so far; None: not counted (`NodeState` estimates them)
    prefix: str = UNKNOWN  # the class of its first output tokens (`maestro.progressive.prefix_class`)
    progressive: ProgressiveTable | None = None  # its predictor's re-prediction table; None: parametric
    is_interactive: bool = False  # a stage of an interactive workflow (a turn a person waits on)


@dataclass(frozen=True)
class NodeState:
    """One node as every runtime describes it to the gate, at `now`.

    `pace_s_per_token`: seconds per output token of a running stage lately, prefill stalls included (0: not measured
    yet; the gate then admits: it holds work back only on evidence). `step_s`: the bare decode step (never taken
    above the pace). `prefill_s`: what a prefill stalls the running stages for (live: dispatch → first token).
    `backlog_s`: what the prefills already under way still stall every running stage for.

    Defaults, the same for every runtime that lacks the measurement:
    - a stage's `produced` not counted: its first token comes `prefill_s` after its start, then one every
      `pace_s_per_token`;
    - `backlog_s` None: until the last first token still to come, among the stages that have produced none.
    """

    now: float
    running: tuple[RunningStage, ...]
    pace_s_per_token: float
    step_s: float
    prefill_s: float = 0.0
    backlog_s: float | None = None

    @property
    def bare_step_s(self) -> float:
        return min(self.step_s, self.pace_s_per_token)

    @cached_property
    def batch(self) -> RunningBatch | None:
        """The running stages as the gate reads them; None when nothing runs or the pace is not measured."""
        pace_s = self.pace_s_per_token
        if not self.running or pace_s <= 0:
            return None
        first_tokens_s = [s.started_s + self.prefill_s for s in self.running]
        produced = [
            max(0.0, self.now - first) / pace_s if s.produced is None else s.produced
            for s, first in zip(self.running, first_tokens_s)
        ]
        backlog_s = self.backlog_s
        if backlog_s is None:
            backlog_s = max([first - self.now for first, n in zip(first_tokens_s, produced) if n <= 0], default=0.0)
        remaining = [
            remaining_tokens(s.tokens_pred, s.tokens_reserve, n, table=s.progressive, prefix=s.prefix)
            for s, n in zip(self.running, produced)
        ]
        deadlines_s = [s.deadline_s - max(0.0, backlog_s) for s in self.running]
        is_running_interactive = any(s.is_interactive for s in self.running)
        return RunningBatch.of(remaining, deadlines_s, pace_s, self.bare_step_s, self.now, is_running_interactive)


@dataclass(frozen=True, slots=True)
class Candidate(OutputSize):
    """A stage asking to join a node's running batch, with its sized output (`OutputSize`, keyword-only; the gate
    reads its tokens_pred). `stall_s`: its prefill's stall (None: the node's `prefill_s`); `added_step_s`: what it adds
    to each decode step (None: `UNMEASURED_ADDED_STEP_S`); `produced`: output tokens it has already (a preempted
    stage's); `is_interactive`: a stage of an interactive workflow (the gate never holds it)."""

    deadline_s: float
    produced: float = 0.0
    stall_s: float | None = None
    added_step_s: float | None = None
    is_interactive: bool = False


@dataclass(frozen=True)
class GateInputs:
    """What `BatchCostGate.admits` reads: the running batch, and the candidate's stall, added step time, predicted
    tokens still to come and own slack (if it started now, at the node's measured pace)."""

    batch: RunningBatch
    stall_s: float
    added_step_s: float
    candidate_tokens: float
    candidate_slack_s: float


def gate_inputs(node: NodeState, candidate: Candidate) -> GateInputs | None:
    """What the gate reads of `candidate` joining `node` now, one way for every runtime; None where nothing runs there
    or its pace is not measured (the gate admits)."""
    batch = node.batch
    if batch is None:
        return None
    stall_s = node.prefill_s if candidate.stall_s is None else candidate.stall_s
    added_s = UNMEASURED_ADDED_STEP_S if candidate.added_step_s is None else candidate.added_step_s
    left = max(1.0, candidate.tokens_pred - candidate.produced)
    slack_s = candidate.deadline_s - node.now - stall_s - left * batch.pace_s_per_token
    return GateInputs(batch, stall_s, added_s, left, slack_s)


class BatchCostGate:
    """May a candidate join this batch without pushing a running stage past its deadline (module docstring)."""

    def __init__(self, config: BatchCostConfig | None = None):
        self.config = config or BatchCostConfig()
        self.num_refused = 0

    def is_congested(self, pace_s_per_token: float, step_s: float) -> bool:
        """Whether the gate acts at this pace: prefill stalls stretch it `min_stretch` times the bare step or more."""
        return pace_s_per_token >= self.config.min_stretch * step_s

    def admits(
        self,
        batch: RunningBatch,
        stall_s: float,
        added_step_s: float,
        candidate_tokens: float,
        candidate_slack_s: float,
    ) -> bool:
        """`candidate_slack_s`: the candidate's own slack if it started now (at the node's measured pace). A
        candidate that would miss its deadline by waiting (`BatchCostConfig.hold_while`) is admitted anyway: holding it
        back would trade one miss for another."""
        if len(batch.remaining_tokens) == 0 or not self.is_congested(batch.pace_s_per_token, batch.step_s):
            return True
        delays = stall_s + np.minimum(batch.remaining_tokens, candidate_tokens) * added_step_s
        endangered = batch.is_savable & (delays > self.config.slack_share * batch.slack_s)
        hold_while = self.config.hold_while
        if hold_while == "by_class":
            hold_while = "endangered" if batch.is_running_interactive else "next"
        wait_s = batch.end_s(endangered) if hold_while == "endangered" else batch.next_end_s()
        is_ok = not endangered.any() or candidate_slack_s < wait_s
        self.num_refused += not is_ok
        return is_ok

    def may_hold(self, pace_s_per_token: float, step_s: float, is_interactive: bool = False) -> bool:
        """Whether the gate could hold a candidate back on a running node at this pace and bare decode step: only a
        batch candidate, only where the pace is measured and the node congested. Where it could not, the gate admits
        without describing the node (a runtime may ask this first, before it builds the `NodeState`)."""
        return (
            not is_interactive
            and pace_s_per_token > 0
            and self.is_congested(pace_s_per_token, min(step_s, pace_s_per_token))
        )

    def admits_candidate(self, node: NodeState, candidate: Candidate) -> bool:
        """Whether `candidate` may join `node`'s running batch now: the one entry of the simulator, the gateway and
        the vLLM plugin (`gate_inputs`, then `admits`). An interactive candidate always may: the gate holds batch
        work only."""
        if not node.running or not self.may_hold(node.pace_s_per_token, node.step_s, candidate.is_interactive):
            return True
        inputs = gate_inputs(node, candidate)
        return inputs is None or self.admits(
            inputs.batch, inputs.stall_s, inputs.added_step_s, inputs.candidate_tokens, inputs.candidate_slack_s
        )
