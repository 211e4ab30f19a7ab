"""What the gateway accepts before anything is queued: the body's size, its JSON, the fields it reads or forwards.

A body is checked against its endpoint's pydantic model (bodies.py), the X-Maestro-* headers and the body's
`metadata` keys against those the gateway knows. Every refusal is a `BadRequest` naming the field (`param`,
OpenAI-style: `messages[0].role`, `max_tokens`, `X-Maestro-Stage`) and saying what was expected.
"""

from __future__ import annotations

import difflib
import json
import re

from pydantic import ValidationError

from serving.gateway.bodies import BODIES, ID_PATTERN, MAX_ID_CHARS, MAX_PARENTS, BodyMetadata
from serving.gateway.metadata import BOOLEAN_KEYS, FALSE_WORDS, HEADERS, METADATA_KEYS, TRUE_WORDS
from serving.gateway.router_hints import HINT_HEADERS

SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class BadRequest(Exception):
    """A call refused before it was queued: the HTTP status, the field at fault (None: the body as a whole), why."""

    def __init__(self, status: int, param: str | None, message: str):
        super().__init__(message)
        self.status, self.param, self.message = status, param, message


EXPECTED = {  # what an error says was expected, by pydantic error type
    "int_type": "an integer",
    "greater_than": "a positive number",
    "bool_type": "true or false",
    "string_type": "a string",
    "float_type": "a number",
    "finite_number": "a finite number",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "too_short": "a non-empty list",
    "string_too_long": f"at most {MAX_ID_CHARS} characters",
    "string_too_short": "a non-empty string",
    "string_pattern_mismatch": "no control characters",
    "too_long": f"at most {MAX_PARENTS} items",
}


async def read_call(request, max_bytes: int) -> dict:
    """The body of a call as a JSON object, its X-Maestro-* headers and body metadata checked (BadRequest)."""
    body = await read_json(request, max_bytes)
    if not isinstance(body, dict):
        raise BadRequest(400, None, f"request body must be a JSON object, got {type(body).__name__}")
    check_headers(request.headers)
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise BadRequest(400, "metadata", f"metadata: expected an object, got {_short(body['metadata'])}")
    check_metadata_keys(body.get("metadata") or {})
    try:
        BodyMetadata.model_validate(body.get("metadata") or {})
    except ValidationError as error:
        raise bad_field(error, body.get("metadata"), prefix="metadata.") from None
    return body


async def read_json(request, max_bytes: int) -> object:
    """The body as JSON, read no further than `max_bytes` (413), whatever its Content-Length says or omits."""
    length = request.headers.get("content-length")
    if length is not None and not length.isdigit():
        raise BadRequest(400, "Content-Length", f"Content-Length: expected a number of bytes, got {_short(length)}")
    if length is not None and int(length) > max_bytes:
        raise BadRequest(413, None, f"request body of {length} bytes; the limit is {max_bytes} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BadRequest(413, None, f"request body over the limit of {max_bytes} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:  # not UTF-8, not JSON, or nested deeper than the parser goes
        raise BadRequest(
            400, None, f"request body is not valid JSON ({type(error).__name__}: {str(error)[:120]})"
        ) from error
    if isinstance(body, dict) and SURROGATE_ESCAPE.search(raw):
        check_unicode(body)
    return body


def check_unicode(body: dict) -> None:
    """JSON may escape half a UTF-16 pair (`\\ud800`), which no UTF-8 text (a trace line) can hold: refused."""
    for key, value in body.items():
        try:
            json.dumps([key, value], ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise BadRequest(
                400, key, f"{key}: holds a lone UTF-16 surrogate (\\ud800-\\udfff); send valid Unicode"
            ) from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def check_body(path: str, body: dict) -> None:
    """Raise BadRequest naming the first field of the body that the endpoint cannot take."""
    if path == "/v1/completions" and "messages" in body:  # the gateway reads a call's prompt from `messages` first
        raise BadRequest(
            400,
            "messages",
            "messages: not taken by /v1/completions (it reads `prompt`); send chat messages to /v1/chat/completions",
        )
    try:
        BODIES[path].model_validate(body)
    except ValidationError as error:
        raise bad_field(error, body) from None


def check_headers(headers) -> None:
    """X-Maestro-* headers: each one the gateway knows; ids without control characters (≤ 256), a boolean word, a
    bounded parents list."""
    check_header_names(headers.keys())
    for key, name in HEADERS.items():
        value = headers.get(name)
        if value is None:
            continue
        if key in BOOLEAN_KEYS:
            expected = (
                None if value.strip().lower() in TRUE_WORDS + FALSE_WORDS else f"one of {TRUE_WORDS + FALSE_WORDS}"
            )
        elif key == "slo":
            expected = None if _is_positive_number(value) else "a positive number of seconds"
        elif key == "parents":
            ids = [p.strip() for p in value.split(",") if p.strip()]
            expected = (
                None
                if len(ids) <= MAX_PARENTS and all(map(is_id, ids))
                else (f"at most {MAX_PARENTS} comma-separated ids of at most {MAX_ID_CHARS} characters")
            )
        else:
            expected = None if is_id(value) else f"an id of 1 to {MAX_ID_CHARS} characters, no control characters"
        if expected:
            canonical = header_name(name)
            raise BadRequest(400, canonical, f"header {canonical}: expected {expected}, got {_short(value)}")


def check_header_names(names) -> None:
    """Refuse an X-Maestro-* header the gateway does not know (names are case-insensitive): misspelt, it would be
    ignored, and every call of its workflow would become a one-stage workflow of its own. The router hints a gateway
    sends on (hints.py) pass, for a gateway behind another."""
    known, prefix = (*HEADERS.values(), *HINT_HEADERS), "x-maestro-"
    for name in (n.lower() for n in names):
        if name.startswith(prefix) and name not in known:
            suffixes = {header_name(h): h.removeprefix(prefix) for h in HEADERS.values()}
            raise unknown_name(
                f"header {header_name(name)}",
                header_name(name),
                "a Maestro header",
                name.removeprefix(prefix),
                suffixes,
            )


def check_metadata_keys(metadata: dict) -> None:
    """Refuse a body `metadata` key the gateway does not know: it reads only its own (metadata.METADATA_KEYS) and
    forwards none, so a misspelt one (`workflowId`) would be lost as a misspelt header would."""
    known = {key: key for keys in METADATA_KEYS.values() for key in keys}
    for key in metadata:
        if key not in known:
            raise unknown_name(f"metadata.{key}", f"metadata.{key}", "a Maestro metadata key", str(key), known)


def unknown_name(where: str, param: str, what: str, name: str, known: dict[str, str]) -> BadRequest:
    """A 400 for a name the gateway does not know: the closest known one (`known`: display name → what is compared
    with `name`) and all of them."""
    close = difflib.get_close_matches(name, list(known.values()), n=1)
    guess = next((f" (did you mean {shown}?)" for shown, compared in known.items() if close == [compared]), "")
    return BadRequest(400, param, f"{where}: not {what}{guess}; the known ones are {', '.join(known)}")


def header_name(name: str) -> str:
    """A header's name as people write it: x-maestro-stage → X-Maestro-Stage."""
    return "-".join(part.capitalize() for part in name.split("-"))


def _is_positive_number(value: str) -> bool:
    try:
        number = float(value)
    except ValueError:
        return False
    return 0 < number < float("inf")


def is_id(value: str) -> bool:
    return 0 < len(value) <= MAX_ID_CHARS and re.match(ID_PATTERN, value) is not None


def bad_field(error: ValidationError, data, prefix: str = "") -> BadRequest:
    """A validation error as a 400 naming the deepest field at fault (`messages[0].content[1].text`) and what it
    may be (every alternative of a union: "a string or a list")."""
    errors = [(prefix + _param(e["loc"], data, e["type"] == "missing"), e) for e in error.errors()]
    param = max((p for p, _ in errors), key=lambda p: p.count(".") + p.count("["))
    at_param = [e for p, e in errors if p == param]
    if any(e["type"] == "missing" for e in at_param):
        return BadRequest(400, param, f"{param}: required")
    expected = " or ".join(dict.fromkeys(_expected(e) for e in at_param))
    return BadRequest(400, param, f"{param}: expected {expected}, got {_short(at_param[0].get('input'))}")


def _expected(error: dict) -> str:
    return EXPECTED.get(error["type"]) or str((error.get("ctx") or {}).get("error") or error["msg"])


def _param(loc: tuple, data, is_missing: bool) -> str:
    """The location of an error in the request's own terms: pydantic's `loc` walked through the data, leaving
    out the union members it names (`str`, `list[int]`): steps the data does not have, but a missing field."""
    parts = []
    for i, step in enumerate(loc):
        if isinstance(data, list) and isinstance(step, int) and step < len(data):
            data = data[step]
        elif isinstance(data, dict) and step in data:
            data = data[step]
        elif not (is_missing and i == len(loc) - 1):
            continue  # a union member's name
        parts.append(f"[{step}]" if isinstance(step, int) else f".{step}")
    return "".join(parts).lstrip(".")


def _short(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
