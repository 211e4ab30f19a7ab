"""What one forwarded call produced: read from a vLLM JSON response or accumulated from its SSE stream."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field


@dataclass
class CallResult:
    """Output text, usage and timings of one call, filled as the response arrives."""

    started_s: float = field(default_factory=time.monotonic)
    first_token_s: float | None = None
    output_parts: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    num_tool_calls: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def output_text(self) -> str:
        return "".join(self.output_parts)

    @property
    def is_tool_call(self) -> bool:
        return self.num_tool_calls > 0 or self.finish_reason == "tool_calls"

    def mark_token(self) -> None:
        if self.first_token_s is None:
            self.first_token_s = time.monotonic()

    def read_usage(self, usage: dict | None) -> None:
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.output_tokens = usage.get("completion_tokens", self.output_tokens)

    def read_choice(self, choice: dict) -> None:
        """A choice of a full response (`message`/`text`) or of a stream chunk (`delta`/`text`)."""
        message = choice.get("message") or choice.get("delta") or {}
        text = message.get("content") if message else choice.get("text")
        if text:
            self.mark_token()
            self.output_parts.append(text)
        calls = message.get("tool_calls") if message else None
        if calls:
            self.mark_token()
            self.num_tool_calls = max(self.num_tool_calls, len(calls))
            self.output_parts.extend(json.dumps(c.get("function", c)) for c in calls if c.get("function", {}).get("name"))
        self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def read_response(self, body: dict) -> None:
        for choice in body.get("choices", [])[:1]:
            self.read_choice(choice)
        self.read_usage(body.get("usage"))
        if self.first_token_s is None:
            self.first_token_s = time.monotonic()

    def read_sse_line(self, line: str) -> None:
        """One `data: {...}` line of a vLLM stream; other lines are ignored."""
        if not line.startswith("data:"):
            return
        payload = line[5:].strip()
        if not payload or payload == "[DONE]":
            return
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError:
            return
        if "error" in chunk and not chunk.get("choices"):
            self.error = str(chunk["error"])
        for choice in chunk.get("choices") or []:
            self.read_choice(choice)
        self.read_usage(chunk.get("usage"))
