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
    released_s: float | None = None  # when the KV reservation went back (streamed from vLLM: its last chunk)
    has_final_usage: bool = False  # a stream's usage-only chunk (vLLM's last) was read
    is_stream_done: bool = False  # a stream's `data: [DONE]` was read: it ended as it should

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
            self.output_parts.extend(
                json.dumps(c.get("function", c)) for c in calls if c.get("function", {}).get("name")
            )
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
        self.is_stream_done = self.is_stream_done or payload == "[DONE]"
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
        # (a client may ask for usage in every chunk: only the usage-only one ends the stream)
        self.has_final_usage = self.has_final_usage or bool(chunk.get("usage") and not chunk.get("choices"))


def has_content(chunk: dict) -> bool:
    """Whether a stream chunk carries output (text, content, reasoning or a tool call), not just a role or usage."""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if choice.get("text") or any(delta.get(k) for k in ("content", "reasoning_content", "tool_calls")):
            return True
    return False


# Request fields whose non-streamed answer carries what the assembler does not rebuild: those go to vLLM unstreamed.
NOT_ASSEMBLED = ("logprobs", "top_logprobs", "prompt_logprobs", "echo", "best_of", "return_tokens_as_token_ids")


def can_assemble(body: dict) -> bool:
    """Whether a non-streaming client's call may go to vLLM streamed and be answered from the assembled chunks."""
    return not any(body.get(k) for k in NOT_ASSEMBLED)


class StreamAssembler:
    """A vLLM SSE stream (`stream: true`, usage included) → the non-streamed OpenAI answer it stands for.

    Content, reasoning and tool-call deltas are joined per choice (tool calls by their `index`, arguments
    concatenated); finish/stop reasons and usage are taken as they come. `is_finished` is true once every
    expected choice has its finish_reason or the usage-only chunk (vLLM's last) arrived: vLLM has freed the request.
    """

    def __init__(self, is_chat: bool, num_choices: int = 1):
        self.is_chat, self.num_choices = is_chat, max(1, num_choices)
        self.head: dict = {}
        self.choices: dict[int, dict] = {}
        self.usage: dict | None = None  # the latest (with continuous usage stats, every chunk has one)
        self.has_final_usage = False  # the usage-only chunk that ends a vLLM stream
        self.error: object = None

    @property
    def is_finished(self) -> bool:
        finished = sum(c["finish_reason"] is not None for c in self.choices.values())
        return self.has_final_usage or finished >= self.num_choices

    def feed_line(self, line: str) -> dict | None:
        """One SSE line; returns its chunk (None for other lines, [DONE] or bad JSON)."""
        if not line.startswith("data:"):
            return None
        payload = line[5:].strip()
        if not payload or payload == "[DONE]":
            return None
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError:
            return None
        self.feed(chunk)
        return chunk

    def feed(self, chunk: dict) -> None:
        if "error" in chunk and not chunk.get("choices"):
            self.error = chunk["error"]
            return
        if not self.head:
            self.head = {
                k: chunk[k] for k in ("id", "created", "model", "system_fingerprint") if chunk.get(k) is not None
            }
        for part in chunk.get("choices") or []:
            choice = self.choices.setdefault(
                part.get("index", 0),
                {"text": [], "reasoning": [], "tools": {}, "finish_reason": None, "stop_reason": None},
            )
            delta = part.get("delta") if self.is_chat else None
            text = (delta or {}).get("content") if self.is_chat else part.get("text")
            if text:
                choice["text"].append(text)
            reasoning = (delta or {}).get("reasoning_content") or (delta or {}).get("reasoning")
            if reasoning:
                choice["reasoning"].append(reasoning)
            for call in (delta or {}).get("tool_calls") or []:
                tool = choice["tools"].setdefault(
                    call.get("index", len(choice["tools"])),
                    {"id": None, "type": "function", "name": [], "arguments": []},
                )
                tool["id"] = call.get("id") or tool["id"]
                tool["type"] = call.get("type") or tool["type"]
                function = call.get("function") or {}
                if function.get("name"):
                    tool["name"].append(function["name"])
                if function.get("arguments"):
                    tool["arguments"].append(function["arguments"])
            if part.get("finish_reason") is not None:
                choice["finish_reason"] = part["finish_reason"]
            if part.get("stop_reason") is not None:
                choice["stop_reason"] = part["stop_reason"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
            self.has_final_usage = self.has_final_usage or not chunk.get("choices")

    def response(self) -> dict:
        """The assembled answer, shaped like vLLM's non-streamed one."""
        choices = []
        for index, c in sorted(self.choices.items()):
            out: dict = {"index": index}
            if self.is_chat:
                message: dict = {"role": "assistant", "content": "".join(c["text"]) or None}
                if c["reasoning"]:
                    message["reasoning_content"] = "".join(c["reasoning"])
                message["tool_calls"] = [
                    {
                        "id": t["id"],
                        "type": t["type"],
                        "function": {"name": "".join(t["name"]), "arguments": "".join(t["arguments"])},
                    }
                    for _, t in sorted(c["tools"].items())
                ]
                out["message"] = message
            else:
                out["text"] = "".join(c["text"])
            out.update(logprobs=None, finish_reason=c["finish_reason"], stop_reason=c["stop_reason"])
            choices.append(out)
        body = {
            "id": self.head.get("id"),
            "object": "chat.completion" if self.is_chat else "text_completion",
            "created": self.head.get("created"),
            "model": self.head.get("model"),
            "choices": choices,
            "usage": self.usage,
        }
        if "system_fingerprint" in self.head:
            body["system_fingerprint"] = self.head["system_fingerprint"]
        return body
