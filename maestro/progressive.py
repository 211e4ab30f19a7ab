"""A running stage's output length re-predicted from what it has produced so far: one function for every runtime.

While a stage decodes, a runtime knows its prediction (median `tokens_pred`, `tokens_reserve` at quantile
`reserve_level`), the tokens it has produced, and, where it can read them, its first tokens. `length_bounds` turns
these into (low, median, upper) of the stage's total output length:

- parametric (no table): the prediction read as a log-normal and conditioned on L > produced (`parametric_bounds`);
  low mirrors the reserve around the median in log space (pred² ÷ reserve), unconditioned;
- learned (`ProgressiveTable`, trained by `pipelines/progressive.py` on the traces' `output_text`): conditional
  quantiles of log(L ÷ max(tokens_pred, produced)) given the class of the output's first tokens (`prefix_class`),
  log produced, how far the prediction is ahead of it and the prediction's spread (`table_features`), fitted with
  LightGBM and saved as the table its trees amount to on the grid of their own split thresholds. Below
  `min_produced` tokens the prediction stands, as in the parametric form.

Plain Python (no numpy, pandas or LightGBM), so the vLLM plugin (in vLLM's own environment) imports it as the simulator
does.
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist

TABLE_FILE = "progressive.json"  # beside a saved predictor's other files (pipelines/predictor.py)
DEFAULT_RESERVE_LEVEL = 0.95  # the quantile a reserve stands at where a runtime is not told (hints' default)
PREFIX_TOKENS = 32  # the class reads at most the output's first this many tokens
# Characters a trace's output token is taken to make, where the tokens themselves are not stored: at most the ratio of
# 98 % of the real traces' stages (`../shared/data`, 5,624 stages with text; medians 2.8-4.0 by app; tau2 medical
# triage 88 %), so that a cut at k tokens reads no more than those k tokens made, whatever the output's length.
CHARS_PER_TOKEN = 2.0
NUM_FEATURES = 3  # the table's numeric axes (`table_features`)

# Classes of an output's first tokens. `unknown`: a runtime that cannot read them (the table is fitted on every
# stage under it too, so it answers from produced and tokens_pred alone).
TOOL, CODE, TAG, PROSE, UNKNOWN = "tool", "code", "tag", "prose", "unknown"
PREFIX_CLASSES = (TOOL, CODE, TAG, PROSE, UNKNOWN)
# A tool call's markup as the output starts: JSON (`{`, `[{`, `["`), tau2's `[tool call] name(...)`, Mistral's
# `[TOOL_CALLS]`, Hermes / Qwen `<tool_call>`, Llama's `<|python_tag|>` and `<function=...>`, `functions.name`.
TOOL_MARKERS = (
    "{",
    "[{",
    '["',
    "[tool call]",
    "[TOOL_CALLS]",
    "<tool_call>",
    "<|python_tag|>",
    "<function",
    "functions.",
)
_TAG_START = re.compile(r"^(<[A-Za-z_]+>|#{3}[A-Z_]+#{3})")  # ChatDev's <INFO>, tau2's ###STOP###
_NORMAL = NormalDist()


def prefix_class(text: str | None) -> str:
    """The class of an output's first tokens (`text`: their text; None or empty: unknown)."""
    if not text or not text.strip():
        return UNKNOWN
    start = text.lstrip()
    if start.startswith(TOOL_MARKERS):
        return TOOL
    if _TAG_START.match(start):
        return TAG
    if any(marker.startswith(start) for marker in TOOL_MARKERS if not marker[0].isalpha()):
        return TOOL  # too few characters yet: the beginning of a marker that opens with a bracket
    return CODE if "```" in start else PROSE


def prefix_chars(text: str, produced: float) -> str:
    """A finished output's text as far as a runtime could have read it after `produced` tokens (at most
    `PREFIX_TOKENS`): its first `CHARS_PER_TOKEN` × produced characters. The simulator and the training rows cut a
    trace's text this way; the cut reads neither the output's length nor, in nearly every stage, text it had not
    produced yet."""
    return text[: prefix_num_chars(produced)]


def prefix_num_chars(produced: float) -> int:
    """How many characters of an output `prefix_chars` reads after `produced` tokens."""
    return int(CHARS_PER_TOKEN * max(0.0, min(produced, PREFIX_TOKENS)))


@dataclass(frozen=True, slots=True)
class LengthBounds:
    """A running stage's total output length: a low quantile, the median and the reserve's quantile."""

    low: float
    median: float
    upper: float


def parametric_bounds(
    produced: float, tokens_pred: float, tokens_reserve: float, reserve_level: float = DEFAULT_RESERVE_LEVEL
) -> tuple[float, float]:
    """(median, reserve) of the output length given that it has produced `produced`, the prediction read as a
    log-normal (median `tokens_pred`, `reserve_level` quantile `tokens_reserve`). While the stage is short of its
    median the prediction stands. Past it, both move to the same quantiles of the length conditioned on
    L > produced, so a long answer that outlives a short stage's bound gets the tail's bound, not "nothing left".
    A point prediction (reserve = median) only moves up to what has been produced."""
    median, reserve = max(tokens_pred, 1), max(tokens_reserve, 1)
    if produced < median:
        return median, reserve
    if reserve <= median:
        return produced + 1, produced + 1
    sigma = math.log(reserve / median) / _NORMAL.inv_cdf(reserve_level)
    tail = 1.0 - _NORMAL.cdf(math.log(produced / median) / sigma)  # P(L > produced)

    def quantile(level: float) -> float:
        z = _NORMAL.inv_cdf(min(1.0 - tail * (1.0 - level), 1.0 - 1e-12))
        return max(median * math.exp(sigma * z), produced + 1)

    return quantile(0.5), quantile(reserve_level)


@dataclass(frozen=True)
class ProgressiveTable:
    """Quantiles of log(total ÷ anchor), anchor = max(tokens_pred, produced), per prefix class and cell of the
    numeric features (`table_features`: log produced, log(tokens_pred ÷ produced), log(tokens_reserve ÷ tokens_pred)),
    at `levels`.

    A cell of an axis holds the values up to and including its edge (LightGBM's `x <= threshold` goes left);
    `values[class][cell 1][cell 2][cell 3]` lists one quantile a level, non-decreasing."""

    levels: tuple[float, ...]
    classes: tuple[str, ...]
    edges: tuple[tuple[float, ...], ...]  # one axis a numeric feature
    values: tuple
    min_produced: int = 4
    scores: tuple[float, ...] = field(init=False, repr=False, compare=False)  # the levels' normal scores

    def __post_init__(self):
        if list(self.levels) != sorted(self.levels) or 0.5 not in self.levels:
            raise ValueError(f"progressive table: levels must be sorted and hold 0.5, got {self.levels}")
        if set(self.classes) != set(PREFIX_CLASSES):
            raise ValueError(f"progressive table: classes must be {PREFIX_CLASSES}, got {self.classes}")
        shape = (len(self.classes), *(len(axis) + 1 for axis in self.edges), len(self.levels))
        if len(self.edges) != NUM_FEATURES or _shape(self.values, len(shape)) != shape:
            raise ValueError(f"progressive table: {NUM_FEATURES} axes and values of shape {shape} expected")
        object.__setattr__(self, "scores", tuple(_NORMAL.inv_cdf(level) for level in self.levels))

    def quantiles(self, prefix: str, features: tuple[float, ...]) -> list[float]:
        """log(total ÷ anchor) at each level for a stage of this class at these `table_features`."""
        cells = self.values[self.classes.index(prefix if prefix in self.classes else UNKNOWN)]
        for axis, x in zip(self.edges, features):
            cells = cells[bisect_left(axis, x)]
        return cells

    def at_score(self, quantiles: list[float], z: float) -> float:
        """The quantile at the level of normal score `z`, linear in the score between the table's levels (clamped
        to them)."""
        scores = self.scores
        if z <= scores[0] or z >= scores[-1]:
            return quantiles[0] if z <= scores[0] else quantiles[-1]
        i = bisect_left(scores, z)
        return quantiles[i - 1] + (quantiles[i] - quantiles[i - 1]) * (z - scores[i - 1]) / (scores[i] - scores[i - 1])

    def to_json(self) -> str:
        fields = {
            "levels": self.levels,
            "classes": self.classes,
            "edges": self.edges,
            "min_produced": self.min_produced,
            "values": self.values,
        }
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ProgressiveTable:
        raw = json.loads(text)
        return cls(
            tuple(raw["levels"]),
            tuple(raw["classes"]),
            tuple(tuple(axis) for axis in raw["edges"]),
            raw["values"],
            raw.get("min_produced", 4),
        )


def table_features(produced: float, tokens_pred: float, tokens_reserve: float) -> tuple[float, float, float]:
    """What the table reads of a running stage besides its prefix class: log produced (≥ 1), how far its prediction
    is ahead of it (log tokens_pred ÷ produced) and the prediction's spread (log reserve ÷ median)."""
    median = max(tokens_pred, 1.0)
    produced = max(produced, 1.0)
    return math.log(produced), math.log(median / produced), math.log(max(tokens_reserve, median) / median)


def _shape(values, depth: int) -> tuple[int, ...]:
    """The shape of nested lists, read along their first entries; () for a ragged or too shallow one."""
    shape, level = [], values
    for _ in range(depth):
        if not isinstance(level, (list, tuple)) or not level:
            return ()
        shape.append(len(level))
        level = level[0]
    return tuple(shape)


def load_table(directory: str | Path | None) -> ProgressiveTable | None:
    """The table saved in a predictor's directory (or a path to the file itself); None where there is none, so the
    caller falls back to the parametric bounds (a predictor saved before it had one)."""
    if directory is None:
        return None
    path = Path(directory)
    path = path / TABLE_FILE if path.is_dir() else path
    return ProgressiveTable.from_json(path.read_text()) if path.exists() else None


def length_bounds(
    produced: float,
    tokens_pred: float,
    tokens_reserve: float,
    reserve_level: float = DEFAULT_RESERVE_LEVEL,
    table: ProgressiveTable | None = None,
    prefix: str = UNKNOWN,
) -> LengthBounds:
    """A running stage's total output length from what it has produced: learned where `table` is given and the
    stage has produced at least its `min_produced`, else parametric (module docstring). `prefix`: the class of its
    first tokens (`prefix_class`); the low quantile is at 1 − `reserve_level`."""
    z = _NORMAL.inv_cdf(reserve_level)  # the low bound's score is −z, the median's 0
    learned = _learned_lengths(produced, tokens_pred, tokens_reserve, table, prefix, (-z, 0.0, z))
    if learned is None:
        median, upper = parametric_bounds(produced, tokens_pred, tokens_reserve, reserve_level)
        return LengthBounds(tokens_pred * tokens_pred / max(tokens_reserve, tokens_pred, 1), median, upper)
    return LengthBounds(*learned)


def length_median(
    produced: float,
    tokens_pred: float,
    tokens_reserve: float,
    reserve_level: float = DEFAULT_RESERVE_LEVEL,
    table: ProgressiveTable | None = None,
    prefix: str = UNKNOWN,
) -> float:
    """`length_bounds(...).median` alone, for a caller that reads only the median of every running stage at every
    batch change (the batch-cost gate): the same arithmetic, without the two other quantiles."""
    learned = _learned_lengths(produced, tokens_pred, tokens_reserve, table, prefix, (0.0,))
    return parametric_bounds(produced, tokens_pred, tokens_reserve, reserve_level)[0] if learned is None else learned[0]


def _learned_lengths(
    produced: float,
    tokens_pred: float,
    tokens_reserve: float,
    table: ProgressiveTable | None,
    prefix: str,
    scores: tuple[float, ...],
) -> list[float] | None:
    """The table's total lengths at these scores of its quantile curve, each at least produced + 1; None where the
    parametric bounds answer (no table, or fewer than its `min_produced` tokens produced)."""
    if table is None or produced < max(table.min_produced, 1):
        return None
    quantiles = table.quantiles(prefix, table_features(produced, tokens_pred, tokens_reserve))
    anchor = max(tokens_pred, produced)
    return [max(anchor * math.exp(table.at_score(quantiles, score)), produced + 1) for score in scores]
