"""What a simulated node's engine steps carry, built as vLLM's V1 scheduler builds them with chunked prefill.

A step carries the running requests first: every decoding sequence one token, then each prefill under way its next
chunk, in start order, while the token budget (`max_num_batched_tokens`) lasts. A prefill's last chunk samples its
first output token. The node's step clock (serving/sim/node.py) counts steps; this module says what they carry, so
that a step's price is `CostModel.step_time_s` of exactly that content, and what the next steps will carry (the
batch-cost gate's view: the prefills under way, a candidate's chunks). Approximations, on the continuous step clock:
- a prefill's chunk is the budget left after the decodes and the prefills started before it, spread evenly over the
  whole steps it needs: its last, partial chunk takes a whole step (a P-token prefill alone with budget B takes
  ceil(P / B) steps), and its steps count from its start, so a batch change part-way through a step costs no step;
- a chunk's attention pairs are priced at the middle of the prefill's remaining tokens (exact when the batch does not
  change before it ends); a chunk's tokens may be fractional on the clock, and a step's price counts them rounded;
- a decode's KV read is its context when it began decoding (its growth while it decodes is not priced);
- a prefill computes at least one token (vLLM recomputes the last prompt token on a full prefix hit).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from serving.sim.costmodel import StepLoad

Price = Callable[[dict[str, StepLoad]], float]  # a step's seconds from what it carries (`CostModel.step_time_s`)
Stretch = tuple[float, dict[str, StepLoad], list["Prefill"]]  # (steps, decodes, prefills with their chunks)
DONE_TOKENS = 0.01  # a prefill with fewer tokens left than this has ended (float residue of its chunks)
DUE_STEPS = 1e-6  # how close the step clock must be to an end for it to be due


@dataclass(eq=False)
class Prefill:
    """A prefill under way: its model, the tokens still to compute, those already in KV (prefix hit and chunks done),
    the step clock value its steps count from, and, until the batch changes, its chunk per step and its end."""

    model: str
    tokens_left: float
    cached_tokens: float
    anchor_v: float
    chunk_tokens: float = 0.0
    end_v: float = math.inf

    @property
    def is_done(self) -> bool:
        return self.tokens_left <= DONE_TOKENS

    @property
    def context_tokens(self) -> int:
        return round(self.cached_tokens + self.tokens_left)

    @property
    def pair_tokens(self) -> float:
        """Attention query-key pairs per step of its chunks (`StepLoad.prefill_pair_tokens`)."""
        return self.chunk_tokens * (self.cached_tokens + self.tokens_left / 2)

    def copy(self) -> Prefill:
        return Prefill(self.model, self.tokens_left, self.cached_tokens, self.anchor_v, self.chunk_tokens, self.end_v)


def set_chunks(prefills: Iterable[Prefill], num_decodes: int, budget_tokens: int, v: float) -> None:
    """Each prefill's chunk per step and end from step `v`: the budget left after the decodes, in start order."""
    left = budget_tokens - num_decodes
    for p in prefills:
        if p.is_done or left < 1.0:
            p.chunk_tokens, p.end_v = 0.0, (v if p.is_done else math.inf)
            continue
        since = v - p.anchor_v
        steps = math.ceil(since + p.tokens_left / left - DUE_STEPS) - since
        p.chunk_tokens, p.end_v = p.tokens_left / steps, v + steps
        left -= p.chunk_tokens


def progress(prefills: Iterable[Prefill], num_steps: float) -> None:
    """Run `num_steps` steps of the prefills' current chunks."""
    for p in prefills:
        done = min(p.tokens_left, p.chunk_tokens * num_steps)
        p.tokens_left -= done
        p.cached_tokens += done


def step_loads(decodes: dict[str, StepLoad], prefills: Iterable[Prefill]) -> dict[str, StepLoad]:
    """One step's content per model: the decodes, then the prefills' chunks (their tokens rounded to whole ones, at
    least one, as a step schedules them)."""
    loads = {m: StepLoad(d.num_decodes, d.decode_context_tokens) for m, d in decodes.items() if d.num_decodes}
    chunk_tokens: dict[str, float] = {}
    for p in prefills:
        if p.chunk_tokens > 0:
            load = loads.setdefault(p.model, StepLoad())
            load.prefill_pair_tokens += p.pair_tokens
            load.num_prefills += 1
            chunk_tokens[p.model] = chunk_tokens.get(p.model, 0.0) + p.chunk_tokens
    for model, tokens in chunk_tokens.items():
        loads[model].prefill_tokens = max(1, round(tokens))
    return loads


def add_decode(decodes: dict[str, StepLoad], model: str, context_tokens: int, sign: int = 1) -> None:
    load = decodes.setdefault(model, StepLoad())
    load.num_decodes += sign
    load.decode_context_tokens += sign * context_tokens


class StepBuilder:
    """A node's step content: its decodes (per model) and its prefills under way (in start order), kept at the step
    clock value `v` where the chunks were last set; every batch change settles the chunks run since, then resets
    them."""

    def __init__(self, budget_tokens: int):
        self.budget_tokens = budget_tokens
        self.decodes: dict[str, StepLoad] = {}
        self.prefills: dict[object, Prefill] = {}  # key (a stage) -> its prefill, in start order
        self.num_decodes = 0
        self.v = 0.0

    def settle(self, v: float) -> None:
        progress(self.prefills.values(), v - self.v)
        self.v = v

    def replan(self) -> None:
        set_chunks(self.prefills.values(), self.num_decodes, self.budget_tokens, self.v)

    def start_prefill(self, key, model: str, context_tokens: int, cached_tokens: int, v: float) -> None:
        self.settle(v)
        new_tokens = max(1, context_tokens - cached_tokens)
        self.prefills[key] = Prefill(model, new_tokens, context_tokens - new_tokens, v)
        self.replan()

    def end_prefill(self, key, v: float) -> bool:
        """Move a prefill that is due to the decodes; False (nothing changes) if it is not due at `v`."""
        p = self.prefills.get(key)
        if p is None or p.end_v > v + DUE_STEPS:
            return False
        self.settle(v)
        del self.prefills[key]
        self.set_decode(p.model, p.context_tokens, 1)
        return True

    def set_decode(self, model: str, context_tokens: int, sign: int) -> None:
        add_decode(self.decodes, model, context_tokens, sign)
        self.num_decodes += sign
        self.replan()

    def drop_prefill(self, key, v: float) -> None:
        self.settle(v)
        del self.prefills[key]
        self.replan()

    def loads(self) -> dict[str, StepLoad]:
        return step_loads(self.decodes, self.prefills.values())

    def bare_decodes(self) -> dict[str, StepLoad]:
        """The batch decoding alone: every running stage, those still prefilling at their whole context."""
        decodes = {m: StepLoad(d.num_decodes, d.decode_context_tokens) for m, d in self.decodes.items()}
        for p in self.prefills.values():
            add_decode(decodes, p.model, p.context_tokens)
        return decodes

    def bare_loads(self) -> dict[str, StepLoad]:
        """The bare decode step's content (`bare_decodes`)."""
        return step_loads(self.bare_decodes(), ())

    def next_end_v(self) -> float:
        return min((p.end_v for p in self.prefills.values()), default=math.inf)

    def due(self, v: float) -> list:
        return [key for key, p in self.prefills.items() if p.end_v <= v + DUE_STEPS]

    # --- the next steps, as the batch-cost gate reads them -----------------------------------
    def plan(self, v: float, extra: Prefill | None = None) -> Iterator[Stretch]:
        """The stretches of steps until the prefills under way (and `extra`, started last) end, were the batch to
        change only as they end: (steps, decodes, prefills with their chunks); each stretch is valid until the next
        is drawn."""
        prefills = [p.copy() for p in self.prefills.values()]
        progress(prefills, v - self.v)
        prefills += [extra] if extra is not None else []
        decodes = {m: StepLoad(d.num_decodes, d.decode_context_tokens) for m, d in self.decodes.items()}
        num_decodes = self.num_decodes
        while prefills:
            set_chunks(prefills, num_decodes, self.budget_tokens, v)
            num_steps = min(p.end_v for p in prefills) - v
            if not math.isfinite(num_steps):
                return
            yield num_steps, decodes, prefills
            progress(prefills, num_steps)
            v += num_steps
            for p in [p for p in prefills if p.end_v <= v + DUE_STEPS]:
                prefills.remove(p)
                add_decode(decodes, p.model, p.context_tokens)
                num_decodes += 1

    def backlog_s(self, price: Price, v: float) -> float:
        """What the chunks of the prefills under way still add to the steps every decode waits for."""
        return sum(n * (price(step_loads(d, ps)) - price(step_loads(d, ()))) for n, d, ps in self.plan(v))

    def added_prefill_s(self, price: Price, model: str, context_tokens: int, cached_tokens: int, v: float) -> float:
        """What a prefill started now (after those under way) adds to the steps it shares with the decodes."""
        new_tokens = max(1, context_tokens - cached_tokens)
        extra = Prefill(model, new_tokens, context_tokens - new_tokens, v)
        total = 0.0
        for n, decodes, prefills in self.plan(v, extra):
            if extra not in prefills:
                break
            others = [p for p in prefills if p is not extra]
            total += n * (price(step_loads(decodes, prefills)) - price(step_loads(decodes, others)))
        return total

    def added_decode_s(self, price: Price, model: str, context_tokens: float) -> float:
        """What one more decode of `context_tokens` adds to each bare decode step (its KV; the weights, for a model
        the batch does not run yet)."""
        decodes = self.bare_decodes()
        before = price(step_loads(decodes, ()))
        add_decode(decodes, model, context_tokens)
        return price(step_loads(decodes, ())) - before
