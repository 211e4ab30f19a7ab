"""The structural and prompt-text features of many stages at once, as columns: the batch path of
pipelines.stage_features, giving the same values as its per-stage rows (tests/pipelines/test_batch_features.py).

The text cues are searched once per batch instead of once per stage: the prompts' tails, lowercased, joined by a
NUL (a character no cue pattern matches, and not a word character, so no match spans two prompts and word
boundaries fall as at a text's ends), searched by each pattern compiled without IGNORECASE, each match counted
to its prompt by its offset. Lowercasing first finds what IGNORECASE finds wherever lowercasing keeps every
character one character and its word-character class (true of every code point: the test checks), except the few
non-ASCII letters IGNORECASE folds to ASCII ones (stage_features.ASCII_FOLDS): a prompt holding one is searched on
its own, as the per-stage path does.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from maestro.contract import TOOL_ROLES, StageTrace
from maestro.structure import derive_structure
from pipelines.stage_features import (
    ASCII_FOLDS,
    BREVITY_CUE,
    CUT_MARK,
    DETAIL_CUE,
    DONE_CUE,
    JSON_CUE,
    QUESTION_CUE,
    SUGGESTED_CALL_CUE,
    TOOL_RESPONSE_CUE,
    TOOL_RESULT_CUE,
    UNKNOWN,
    StageHistory,
    ancestors_of,
    parent_outcomes,
    stage_rows,
    tool_results_since_user,
)
from pipelines.turn_features import OWN_TURN_COLUMNS, own_turn_features

SEPARATOR = "\x00"
NAN = float("nan")


def _words_of(pattern: re.Pattern) -> list[str]:
    """The words of a pattern of the form \\b(word|word ...)\\b (or \\bword\\b)."""
    body = pattern.pattern.removeprefix(r"\b").removesuffix(r"\b")
    return body.removeprefix("(").removesuffix(")").split("|")


def _words(pattern: re.Pattern) -> re.Pattern:
    """\\b(w1|w2 ...)\\b for lowercased text, each word's leading \\b written as a look-behind after it: led by
    literals, the pattern lets re skip ahead to where a word may start (a leading \\b makes it try every position)."""
    words = [re.escape(word.lower()) for word in _words_of(pattern)]
    return re.compile("(?:" + "|".join(f"{word}(?<!\\w{word})" for word in words) + r")\b")


# The cue patterns as searched in lowercased, joined text: the same matches, led by literals (see _words)
_LOWERED = {
    JSON_CUE: _words(JSON_CUE),
    BREVITY_CUE: _words(BREVITY_CUE),
    DETAIL_CUE: _words(DETAIL_CUE),
    TOOL_RESULT_CUE: re.compile(
        r"tool[ _](?:result|response|output)|function[ _](?:result|response|output)"
        r"|response from calling tool|\"role\": \"tool\""
    ),
    DONE_CUE: re.compile(DONE_CUE.pattern.lower()),
    SUGGESTED_CALL_CUE: re.compile(r"suggested (?:tool|function) call"),
    TOOL_RESPONSE_CUE: re.compile(r"response from calling (?:tool|function)"),
}
_SMALL_INT = re.compile(r"\d(?<!\w\d)\d{0,2}\b")  # stage_features.SMALL_INT_CUE led by a digit, as in _words
_TAIL_FOUND = {"tail_mentions_json": JSON_CUE, "tail_tool_result": TOOL_RESULT_CUE, "tail_done_marker": DONE_CUE}
_TAIL_COUNTED = {"tail_brevity_words": BREVITY_CUE, "tail_detail_words": DETAIL_CUE}


class JoinedTexts:
    """Pieces of text (one per stage) joined for one search per pattern; counts of matches per piece."""

    def __init__(self, pieces: list[str], lower: bool):
        self.pieces, self.lower = pieces, lower
        searched = [p.lower() for p in pieces] if lower else pieces
        self.starts = np.cumsum([0] + [len(p) + 1 for p in searched[:-1]]) if pieces else np.zeros(0, np.int64)
        self.text = SEPARATOR.join(searched)
        self.folded = set()  # pieces IGNORECASE reads otherwise than lowercasing: searched one by one
        if lower and ASCII_FOLDS.search(self.text):
            self.folded = {i for i, p in enumerate(pieces) if ASCII_FOLDS.search(p)}

    def piece_of(self, positions: list[int]) -> np.ndarray:
        return np.searchsorted(self.starts, np.asarray(positions, np.int64), side="right") - 1

    def count(self, pattern: re.Pattern) -> np.ndarray:
        """len(pattern.findall(piece)) for each piece (`pattern` the IGNORECASE one where lowercased)."""
        search = _LOWERED[pattern] if self.lower else pattern
        positions = [m.start() for m in search.finditer(self.text)]
        counts = np.bincount(self.piece_of(positions), minlength=len(self.pieces)).astype(np.float64)
        for i in self.folded:
            counts[i] = len(pattern.findall(self.pieces[i]))
        return counts

    def found(self, pattern: re.Pattern) -> np.ndarray:
        return np.minimum(self.count(pattern), 1.0)


def _tail_numbers(tails: JoinedTexts) -> tuple[np.ndarray, np.ndarray]:
    """Per piece: the largest integer of 1-3 digits ≤ 100 (-1 without one) and how many there are."""
    n = len(tails.pieces)
    matches = [(m.start(), int(m.group())) for m in _SMALL_INT.finditer(tails.text)]
    small = [(position, value) for position, value in matches if value <= 100]
    largest, count = np.full(n, -1.0), np.zeros(n)
    if small:
        rows = tails.piece_of([position for position, _ in small])
        np.maximum.at(largest, rows, [value for _, value in small])
        np.add.at(count, rows, 1.0)
    return largest, count


def text_columns(stages: list[StageTrace], texts: list[str]) -> dict[str, np.ndarray | list]:
    """The prompt-text features of stage_features._text_features, a column each."""
    tails = JoinedTexts([t[-500:] for t in texts], lower=True)
    ends = [t[-300:] for t in texts]
    heads = [t[:200] for t in texts]
    cuts = np.array([t.rfind(CUT_MARK) for t in texts], np.float64)
    chars = np.array([len(t) for t in texts], np.float64)
    largest, count = _tail_numbers(JoinedTexts(tails.pieces, lower=False))
    out = {
        "prompt_chars": chars,
        "prompt_tokens_est": np.array(
            [s.prompt_tokens if s.prompt_tokens is not None else len(t) // 4 for s, t in zip(stages, texts)], np.float64
        ),
        **_message_columns(stages, texts),
        "tail_max_int": largest,
        "tail_num_ints": count,
        **{name: tails.found(p) for name, p in _TAIL_FOUND.items()},
        **{name: tails.count(p) for name, p in _TAIL_COUNTED.items()},
        "num_code_fences": np.array([t.count("```") for t in texts], np.float64),
        "num_lines": np.array([t.count("\n") for t in texts], np.float64),
        "tail_question": np.array([float("?" in e and QUESTION_CUE.search(e.rstrip()) is not None) for e in ends]),
        "tail_question_marks": np.array([e.count("?") for e in ends], np.float64),
        "tail_suggested_call": JoinedTexts(ends, lower=True).found(SUGGESTED_CALL_CUE),
        "prompt_is_tool_response": JoinedTexts(heads, lower=True).found(TOOL_RESPONSE_CUE),
        "prompt_truncated": (cuts >= 0).astype(np.float64),
        "tail_after_cut_chars": np.where(cuts >= 0, chars - cuts - len(CUT_MARK), chars),
    }
    openings = [t.lstrip()[:12].lower() for t in texts]
    out.update(
        head_code_fence=np.array([float("```" in h) for h in heads]),
        head_comment_tag=np.array([float(o.startswith("<comment>")) for o in openings]),
        head_bracket=np.array([float(o.startswith("[")) for o in openings]),
        head_info_tag=np.array([float("<info>" in h.lower()) for h in heads]),
    )
    out.update({name: out.pop(name) for name in OWN_TURN_COLUMNS})  # last, as in a stage's row
    return out


def _message_columns(stages: list[StageTrace], texts: list[str]) -> dict[str, np.ndarray | list]:
    """The features read from a chat prompt's messages (a plain-text prompt has none)."""
    n = len(stages)
    out = {
        name: np.zeros(n)
        for name in ("num_messages", "num_tool_messages", "tool_results_since_user", "num_user_messages")
    }
    out["last_message_role"] = ["text"] * n
    out["last_message_chars"] = np.array([len(t) for t in texts], np.float64)
    out.update({name: np.full(n, NAN) for name in OWN_TURN_COLUMNS})
    for i, stage in enumerate(stages):
        messages = stage.prompt if isinstance(stage.prompt, list) else None
        if not messages:
            continue
        roles = [m.get("role") for m in messages]
        last = messages[-1]
        out["num_messages"][i] = len(messages)
        out["num_tool_messages"][i] = sum(r in TOOL_ROLES for r in roles)
        out["tool_results_since_user"][i] = tool_results_since_user(messages)
        out["num_user_messages"][i] = roles.count("user")
        out["last_message_role"][i] = str(last.get("role", "text"))
        out["last_message_chars"][i] = len(str(last.get("content") or ""))
        for name, value in own_turn_features(messages).items():
            out[name][i] = value
    return out


def _mean(values: list) -> float:
    """np.mean of a short list of ints or bools, exactly (their float sum is exact), without numpy's overhead."""
    return float(sum(values)) / len(values)


def parent_columns(stages: list[StageTrace], ids: dict[tuple[str, str], StageTrace]) -> dict[str, np.ndarray]:
    """The parents' and ancestors' features of stage_features._parent_features, a column each."""
    rows = [_parent_values(stage, ids) for stage in stages]
    return {
        name: np.array([row[j] for row in rows], np.float64).reshape(len(rows)) for j, name in enumerate(PARENT_COLUMNS)
    }


PARENT_COLUMNS = (
    "parent_tokens_max",
    "parent_tokens_sum",
    "parent_was_tool",
    "same_role_ancestor_tokens",
    "same_role_prev2_tokens",
    "same_role_tokens_max",
    "same_role_tokens_mean",
    "role_turn",
    "num_ancestors",
    "num_ancestors_known",
    "ancestor_tokens_max",
    "ancestor_tool_calls",
    "ancestor_tool_rate",
    "same_role_prev_was_tool",
    "depth_gap",
)


def _parent_values(stage: StageTrace, ids: dict[tuple[str, str], StageTrace]) -> tuple:
    parents, tokens, tools = parent_outcomes(stage, ids)
    ancestors = ancestors_of(stage, ids) if stage.parent_ids else []
    same = [a for a in ancestors if a.role == stage.role]
    same_tokens = [a.output_tokens for a in same if a.output_tokens is not None]
    known = [a.output_tokens for a in ancestors if a.output_tokens is not None]
    history_tools = [a.is_tool_call for a in ancestors if a.is_tool_call is not None]
    same_tools = [a.is_tool_call for a in same if a.is_tool_call is not None]
    parent_depth = [p.depth for p in parents if p is not None and p.depth is not None]
    return (
        max(tokens) if tokens else NAN,
        sum(tokens) if tokens else NAN,
        float(any(tools)) if tools else NAN,
        same_tokens[0] if same_tokens else NAN,
        same_tokens[1] if len(same_tokens) > 1 else NAN,
        max(same_tokens) if same_tokens else NAN,
        _mean(same_tokens) if same_tokens else NAN,
        len(same),
        len(ancestors),
        len(known),
        max(known) if known else NAN,
        float(sum(history_tools)) if history_tools else NAN,
        _mean(history_tools) if history_tools else NAN,
        float(same_tools[0]) if same_tools else NAN,
        float(stage.depth - max(parent_depth)) if parent_depth and stage.depth is not None else NAN,
    )


def structural_columns(
    stages: list[StageTrace], known: dict[str, dict[str, StageTrace]] | None = None, texts: list[str] | None = None
) -> dict[str, np.ndarray | list]:
    """stage_features.stage_rows as columns (the live path, Featurizer.matrix): numbers as float64 arrays, the
    categoricals as lists of text. One stage alone goes through stage_rows: its dict costs less than the arrays."""
    if len(stages) < 2:
        rows = stage_rows(stages, known, texts)
        return {name: [value] for name, value in rows[0].items()} if rows else {}
    derive_structure(stages, known)
    ids = {(w, i): s for w, members in (known or {}).items() for i, s in members.items()}
    ids.update({(s.workflow_id, s.stage_id): s for s in stages})
    texts = texts if texts is not None else [s.prompt_text() for s in stages]
    number = lambda values: np.array([NAN if v is None else v for v in values], np.float64)
    return {
        "role": [s.role for s in stages],
        "app": [s.app or UNKNOWN for s in stages],
        "model": [s.model or UNKNOWN for s in stages],
        "depth": number([s.depth for s in stages]),
        "in_degree": number([s.in_degree for s in stages]),
        "call_index": number([s.call_index for s in stages]),
        "n_tools": number([s.n_tools if s.n_tools is not None else len(s.tool_names or []) for s in stages]),
        "interactive": number([s.interactive for s in stages]),
        **text_columns(stages, texts),
        **parent_columns(stages, ids),
    }


class StageInputs:
    """What a predictor's models read of a batch of stages, each part made once on first use and shared by the
    stage model and the workflow model: the finished stages of their workflows the history holds (`known`), the
    prompt texts, the structural and prompt-text columns (structural_columns, which derives the stages' structure
    in place), and every stage by (workflow, stage id)."""

    def __init__(self, stages: list[StageTrace], history: StageHistory | None = None):
        self.stages = stages
        self.known = history.known(stages) if history is not None else None

    @functools.cached_property
    def texts(self) -> list[str]:
        return [s.prompt_text() for s in self.stages]

    @functools.cached_property
    def columns(self) -> dict[str, np.ndarray | list]:
        """structural_columns of the stages: read them, never change them (copy the dict to add columns)."""
        return structural_columns(self.stages, self.known, self.texts)

    @functools.cached_property
    def ids(self) -> dict[tuple[str, str], StageTrace]:
        """The known stages and the batch's, by (workflow_id, stage_id)."""
        ids = {(w, i): s for w, members in (self.known or {}).items() for i, s in members.items()}
        ids.update({(s.workflow_id, s.stage_id): s for s in self.stages})
        return ids
