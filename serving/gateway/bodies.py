"""The call bodies the gateway takes, as pydantic models: one per endpoint and the workflow metadata in either.

`ChatBody` (/v1/chat/completions) and `CompletionBody` (/v1/completions) type the fields the gateway reads or
forwards; fields it neither reads nor types are allowed and forwarded as they came. `BodyMetadata` is the body's
`metadata`: the same workflow facts as the X-Maestro-* headers. validation.py checks a call against them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from serving.gateway.metadata import FALSE_WORDS, TRUE_WORDS

MAX_ID_CHARS = 256
MAX_PARENTS = 1024
ID_PATTERN = r"^[^\x00-\x1f\x7f]+$"  # no control characters


def _bool_word(value: str) -> str:
    if value.strip().lower() not in TRUE_WORDS + FALSE_WORDS:
        raise ValueError(f"one of {TRUE_WORDS + FALSE_WORDS}")
    return value


Id = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS, pattern=ID_PATTERN)]
IdList = Annotated[list[Id | int], Field(max_length=MAX_PARENTS)]
BoolWord = Annotated[str, AfterValidator(_bool_word)]
PositiveInt = Annotated[int, Field(gt=0)]
Number = Annotated[float, Field(allow_inf_nan=False)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ContentPart(_Open):
    type: str
    text: str | None = None


class Message(_Open):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict] | None = None


class FunctionDef(_Open):
    name: str


class Tool(_Open):
    type: str = "function"
    function: FunctionDef


class StreamOptions(_Open):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class CallBody(_Open):
    """The fields both endpoints share; null means "not given", as in OpenAI's API."""

    model: str | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    n: PositiveInt | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stream_interval: PositiveInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    tools: list[Tool] | None = None
    metadata: dict | None = None  # its fields: BodyMetadata


class ChatBody(CallBody):
    messages: Annotated[list[Message], Field(min_length=1)]


class CompletionBody(CallBody):
    prompt: str | list[str] | list[int] | list[list[int]]


class BodyMetadata(_Open):
    """The body's `metadata`: the same workflow facts as the X-Maestro-* headers (ids may be numbers)."""

    workflow: Id | int | None = None
    workflow_id: Id | int | None = None
    stage: Id | int | None = None
    stage_id: Id | int | None = None
    role: Id | None = None
    app: Id | None = None
    interactive: bool | BoolWord | None = None
    final: bool | BoolWord | None = None
    tool_call: bool | BoolWord | None = None
    parents: IdList | Id | None = None
    parent_ids: IdList | Id | None = None
    slo_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None


BODIES = {"/v1/chat/completions": ChatBody, "/v1/completions": CompletionBody}
