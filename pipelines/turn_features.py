"""Features of a chat prompt that mean the same in every app: how long the called model's own earlier turns were.

A chat prompt carries the conversation so far, and in it the called model's earlier answers (the
`assistant` messages): how verbose this model is in this app shows there before the stage runs, in
characters, whatever the app, its roles or its model are named. Its tool calls show as assistant
messages with `tool_calls` (the length of their arguments). A prompt given as plain text has no turns:
every value is missing (NaN) there.
"""

from __future__ import annotations

import json

import numpy as np

OWN_TURN_COLUMNS = (
    "own_text_turns",
    "own_tool_turns",
    "own_text_chars_last",
    "own_text_chars_mean",
    "own_text_chars_max",
    "own_tool_chars_mean",
)


def _tool_call_chars(message: dict) -> int:
    calls = message.get("tool_calls") or []
    return sum(len(json.dumps(call.get("function", call), default=str)) for call in calls if isinstance(call, dict))


def own_turn_features(messages: list[dict]) -> dict:
    """Counts and lengths (characters) of the assistant's earlier text answers and tool calls in `messages`."""
    if not messages:
        return dict.fromkeys(OWN_TURN_COLUMNS, np.nan)
    own = [m for m in messages if m.get("role") == "assistant"]
    text = [len(str(m.get("content") or "")) for m in own if m.get("content")]
    tools = [_tool_call_chars(m) for m in own if m.get("tool_calls")]
    return {
        "own_text_turns": len(text),
        "own_tool_turns": len(tools),
        "own_text_chars_last": text[-1] if text else np.nan,
        "own_text_chars_mean": float(np.mean(text)) if text else np.nan,
        "own_text_chars_max": max(text) if text else np.nan,
        "own_tool_chars_mean": float(np.mean(tools)) if tools else np.nan,
    }
