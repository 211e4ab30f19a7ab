"""Structural and prompt-text features of a stage, and the history of finished stages they read live.

Everything here is known before the stage runs. Parent outputs count as known: a stage is
submitted only after its parents finished, so their `output_tokens` / `is_tool_call` are
facts by then (taken from ancestor stages in the same batch, from a `StageHistory` of finished
stages on the live path, or from an explicit `parent_output_tokens` field a live caller sends).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

import numpy as np
import pandas as pd

from maestro.contract import TOOL_ROLES, StageTrace
from maestro.structure import derive_structure
from pipelines.turn_features import own_turn_features

CATEGORICAL = ("role", "app", "model", "last_message_role")
UNKNOWN = "unknown"
SMALL_INT_CUE = re.compile(r"\b\d{1,3}\b")
JSON_CUE = re.compile(r"\bjson\b", re.I)
TOOL_RESULT_CUE = re.compile(
    r"(tool|function)[ _](result|response|output)|response from calling tool"
    r"|\"role\": \"tool\"",
    re.I,
)
DONE_CUE = re.compile(r"<INFO>|finished|terminate|final answer|only one line|one word", re.I)
BREVITY_CUE = re.compile(r"\b(brief|short|concise|one line|single word|only)\b", re.I)
DETAIL_CUE = re.compile(r"\b(detailed|full|complete|all|every|comprehensive|code)\b", re.I)
QUESTION_CUE = re.compile(r"\?\s*\S{0,40}$")
SUGGESTED_CALL_CUE = re.compile(r"suggested (tool|function) call", re.I)
TOOL_RESPONSE_CUE = re.compile(r"response from calling (tool|function)", re.I)
# Literals one of which (lowercased) every match of a pattern above holds: where the lowercased text holds
# none of them the pattern cannot match, and `in` is ~50× cheaper than a case-insensitive regex scan.
_NEEDLES = {
    JSON_CUE: ("json",),
    TOOL_RESULT_CUE: ("tool", "function"),
    DONE_CUE: ("<info>", "finished", "terminate", "final answer", "only one line", "one word"),
    BREVITY_CUE: ("brief", "short", "concise", "one line", "single word", "only"),
    DETAIL_CUE: ("detailed", "full", "complete", "all", "every", "comprehensive", "code"),
    SUGGESTED_CALL_CUE: ("suggested",),
    TOOL_RESPONSE_CUE: ("response from calling",),
    QUESTION_CUE: ("?",),
}
CUT_MARK = "[...]"  # where a trace producer cut the middle out of a long prompt
MAX_ANCESTORS = 256  # deep loops: the history that matters is near, don't walk the whole chain


def _messages(stage: StageTrace) -> list[dict]:
    return stage.prompt if isinstance(stage.prompt, list) else []


def tool_results_since_user(messages: list[dict]) -> int:
    count = 0
    for message in reversed(messages):
        if message.get("role") == "user":
            break
        count += message.get("role") in TOOL_ROLES
    return count


# The non-ASCII letters a case-insensitive pattern matches to ASCII ones (re's docs); text holding one is
# scanned by every pattern, as lowercasing would not show the needle they stand in.
ASCII_FOLDS = re.compile("[\u0130\u0131\u017f\u212a]")


class _Cues:
    """The cue patterns over one piece of text: each run only where its needles leave a match possible."""

    def __init__(self, text: str):
        self.text, self.lower = text, None if ASCII_FOLDS.search(text) else text.lower()

    def _possible(self, pattern: re.Pattern) -> bool:
        return self.lower is None or any(needle in self.lower for needle in _NEEDLES[pattern])

    def found(self, pattern: re.Pattern) -> int:
        return int(self._possible(pattern) and pattern.search(self.text) is not None)

    def count(self, pattern: re.Pattern) -> int:
        return len(pattern.findall(self.text)) if self._possible(pattern) else 0


def _text_features(stage: StageTrace, text: str) -> dict:
    messages = _messages(stage)
    last = messages[-1] if messages else {}
    last_content = str(last.get("content") or "") if messages else text
    tail = _Cues(text[-500:])
    end = _Cues(text[-300:])
    cut = text.rfind(CUT_MARK)
    numbers = [int(n) for n in SMALL_INT_CUE.findall(tail.text) if int(n) <= 100]
    head, opening = text[:200], text.lstrip()[:12].lower()
    return {
        "prompt_chars": len(text),
        "prompt_tokens_est": stage.prompt_tokens if stage.prompt_tokens is not None else len(text) // 4,
        "num_messages": len(messages),
        "num_tool_messages": sum(1 for m in messages if m.get("role") in TOOL_ROLES),
        # The turn: how many tool results the agent has gathered since the user last spoke (an agent
        # looks things up, then answers), and how many times the user has spoken.
        "tool_results_since_user": tool_results_since_user(messages),
        "num_user_messages": sum(1 for m in messages if m.get("role") == "user"),
        "last_message_role": str(last.get("role", "text")) if messages else "text",
        "last_message_chars": len(last_content),
        "tail_max_int": max(numbers) if numbers else -1,
        "tail_num_ints": len(numbers),
        "tail_mentions_json": tail.found(JSON_CUE),
        "tail_tool_result": tail.found(TOOL_RESULT_CUE),
        "tail_done_marker": tail.found(DONE_CUE),
        "tail_brevity_words": tail.count(BREVITY_CUE),
        "tail_detail_words": tail.count(DETAIL_CUE),
        "num_code_fences": text.count("```"),
        "num_lines": text.count("\n"),
        "tail_question": _Cues(end.text.rstrip()).found(QUESTION_CUE),
        "tail_question_marks": end.text.count("?"),
        "tail_suggested_call": end.found(SUGGESTED_CALL_CUE),
        "prompt_is_tool_response": _Cues(head).found(TOOL_RESPONSE_CUE),
        "prompt_truncated": int(cut >= 0),
        "tail_after_cut_chars": len(text) - cut - len(CUT_MARK) if cut >= 0 else len(text),
        # What the prompt opens with says which turn of a phase this is: a role's bracketed system
        # preamble, code handed over (a rewrite follows), a review comment, a done marker.
        "head_code_fence": int("```" in head),
        "head_comment_tag": int(opening.startswith("<comment>")),
        "head_bracket": int(opening.startswith("[")),
        "head_info_tag": int("<info>" in head.lower()),
        **own_turn_features(messages),
    }


def parent_outcomes(stage: StageTrace, ids: dict[tuple[str, str], StageTrace]) -> tuple[list, list, list]:
    """The stage's parents as known (None: not seen), their output tokens (else the trace's own
    `parent_output_tokens`) and their tool-call flags."""
    parents = [ids.get((stage.workflow_id, p)) for p in (stage.parent_ids or [])]
    tokens = [p.output_tokens for p in parents if p is not None and p.output_tokens is not None]
    explicit = (stage.model_extra or {}).get("parent_output_tokens")
    if explicit is not None and not tokens:
        tokens = list(explicit) if isinstance(explicit, list) else [explicit]
    tools = [p.is_tool_call for p in parents if p is not None and p.is_tool_call is not None]
    return parents, tokens, tools


def _parent_features(stage: StageTrace, ids: dict[tuple[str, str], StageTrace]) -> dict:
    parents, tokens, tools = parent_outcomes(stage, ids)
    ancestors = ancestors_of(stage, ids)
    history = _history_features(stage, ancestors, parents)
    return {
        "parent_tokens_max": max(tokens) if tokens else np.nan,
        "parent_tokens_sum": sum(tokens) if tokens else np.nan,
        "parent_was_tool": float(any(tools)) if tools else np.nan,
        "same_role_ancestor_tokens": history.pop("_same_role_last"),
        **history,
    }


def ancestors_of(stage: StageTrace, ids: dict[tuple[str, str], StageTrace]) -> list[StageTrace]:
    """Ancestors in the same workflow, nearest first (breadth-first through parent_ids)."""
    out, frontier, seen = [], list(stage.parent_ids or []), set()
    while frontier and len(seen) < MAX_ANCESTORS:
        parent = ids.get((stage.workflow_id, frontier.pop(0)))
        if parent is None or parent.stage_id in seen:
            continue
        seen.add(parent.stage_id)
        out.append(parent)
        frontier.extend(parent.parent_ids or [])
    return out


def _history_features(stage: StageTrace, ancestors: list[StageTrace], parents: list) -> dict:
    """What the workflow did before this stage: the role's earlier turns (how long, whether tool calls),
    the longest output so far, the tool-call history, and how many non-LLM steps (tool runs, user
    messages) separate the stage from its parent (the depth gap)."""
    same = [a for a in ancestors if a.role == stage.role]
    same_tokens = [a.output_tokens for a in same if a.output_tokens is not None]
    known = [a.output_tokens for a in ancestors if a.output_tokens is not None]
    tools = [a.is_tool_call for a in ancestors if a.is_tool_call is not None]
    same_tools = [a.is_tool_call for a in same if a.is_tool_call is not None]
    parent_depth = [p.depth for p in parents if p is not None and p.depth is not None]
    return {
        "_same_role_last": same_tokens[0] if same_tokens else np.nan,
        "same_role_prev2_tokens": same_tokens[1] if len(same_tokens) > 1 else np.nan,
        "same_role_tokens_max": max(same_tokens) if same_tokens else np.nan,
        "same_role_tokens_mean": float(np.mean(same_tokens)) if same_tokens else np.nan,
        "role_turn": len(same),
        "num_ancestors": len(ancestors),
        "num_ancestors_known": len(known),  # with num_ancestors: the history condition (pipelines.history)
        "ancestor_tokens_max": max(known) if known else np.nan,
        "ancestor_tool_calls": float(sum(tools)) if tools else np.nan,
        "ancestor_tool_rate": float(np.mean(tools)) if tools else np.nan,
        "same_role_prev_was_tool": float(same_tools[0]) if same_tools else np.nan,
        "depth_gap": float(stage.depth - max(parent_depth)) if parent_depth and stage.depth is not None else np.nan,
    }


class StageHistory:
    """Finished stages of live workflows, so that a stage predicted on its own gets the features it
    would get in a trace file beside its ancestors: their outputs, its depth, its place in call order.

    Offline, a stage's parents are in the same file. Live, a stage is predicted alone once its parents
    have finished; whoever sees the outcomes (the service's /observe, the gateway) adds them here.
    Bounded: the workflows seen longest ago are forgotten first. Only what features read is kept."""

    def __init__(self, max_workflows: int = 20_000):
        self.max_workflows = max_workflows
        self._workflows: OrderedDict[str, dict[str, StageTrace]] = OrderedDict()
        self._lock = threading.Lock()  # observe and predict run on different threads

    def add(self, stages: list[StageTrace]) -> None:
        with self._lock:
            self._add(stages)

    def _add(self, stages: list[StageTrace]) -> None:
        for stage in stages:
            if stage.output_tokens is None:  # not finished: nothing to learn from it yet
                continue
            workflow = self._workflows.setdefault(stage.workflow_id, {})
            if stage.stage_id in workflow:  # a repeat (a retried observe): the first one stands
                continue
            self._workflows.move_to_end(stage.workflow_id)
            slim = stage.model_copy(update={"prompt": "", "output_text": None})
            derive_structure([slim], {stage.workflow_id: workflow})
            workflow[stage.stage_id] = slim
        while len(self._workflows) > self.max_workflows:
            self._workflows.popitem(last=False)

    def known(self, stages: list[StageTrace]) -> dict[str, dict[str, StageTrace]]:
        """The finished stages of the workflows in `stages`, minus those stages themselves."""
        batch = {(s.workflow_id, s.stage_id) for s in stages}
        with self._lock:
            return {
                w: {i: s for i, s in self._workflows[w].items() if (w, i) not in batch}
                for w in {s.workflow_id for s in stages}
                if w in self._workflows
            }

    def __len__(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._workflows.values())


def stage_rows(
    stages: list[StageTrace], known: dict[str, dict[str, StageTrace]] | None = None, texts: list[str] | None = None
) -> list[dict]:
    """One dict per stage of structure + prompt-text features (categoricals as plain strings), each value of its
    own type (ints stay ints): what frames read, and the live path for one stage (batch_features.structural_columns
    for more). `known`: finished stages of the same workflows that are not in `stages` (StageHistory.known);
    `texts`: their prompt_text(), where the caller has them already."""
    derive_structure(stages, known)
    ids = {(w, i): s for w, members in (known or {}).items() for i, s in members.items()}
    ids.update({(s.workflow_id, s.stage_id): s for s in stages})
    rows = []
    for stage, text in zip(stages, texts or [s.prompt_text() for s in stages]):
        rows.append(
            {
                "role": stage.role,
                "app": stage.app or UNKNOWN,
                "model": stage.model or UNKNOWN,
                "depth": stage.depth,
                "in_degree": stage.in_degree,
                "call_index": stage.call_index,
                "n_tools": stage.n_tools if stage.n_tools is not None else len(stage.tool_names or []),
                "interactive": np.nan if stage.interactive is None else float(stage.interactive),
                **_text_features(stage, text),
                **_parent_features(stage, ids),
            }
        )
    return rows


def structural_frame(stages: list[StageTrace], texts: list[str] | None = None) -> pd.DataFrame:
    """stage_rows as a frame: what training and evaluation read."""
    return pd.DataFrame(stage_rows(stages, texts=texts))


# The seed recipe's structural features; "full" adds prompt-text and parent signals on top.
BASIC_COLUMNS = ("role", "app", "model", "depth", "in_degree", "call_index", "n_tools", "interactive", "prompt_chars")
