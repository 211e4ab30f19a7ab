"""API keys and admin tokens, shared by the predictor service and the gateway.

A caller sends `Authorization: Bearer <key>`. Keys are compared in constant time; what is logged,
traced or used to scope state is the key's id (a short hash), never the key itself.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

ANONYMOUS = "-"  # the key id of calls on a node without API keys


def key_id(key: str) -> str:
    """A stable, non-secret name for a key: the first 8 hex digits of its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, None when there is none."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def matches(token: str | None, secret: str) -> bool:
    """Constant-time comparison of a presented token with a configured secret."""
    return token is not None and hmac.compare_digest(token.encode(), secret.encode())


def caller_key_id(authorization: str | None, keys: tuple[str, ...]) -> str | None:
    """The id of the configured key the header presents; ANONYMOUS when no keys are configured; None when refused."""
    if not keys:
        return ANONYMOUS
    token = bearer(authorization)
    found = [key for key in keys if matches(token, key)]  # every key compared: no early exit to time
    return key_id(found[0]) if found else None


def read_keys(inline: str | None = None, file: str | None = None) -> tuple[str, ...]:
    """Keys from a comma-separated string and/or a file of one key per line (# comments allowed)."""
    keys = [k.strip() for k in (inline or "").split(",")]
    if file:
        path = Path(file)
        if not path.is_file():
            raise ValueError(f"API key file {file} does not exist: create it with one key per line")
        keys += [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    keys = tuple(dict.fromkeys(k for k in keys if k))
    if any(len(k) < 16 for k in keys):
        raise ValueError(
            "API keys must be at least 16 characters (e.g. `python -c 'import secrets; "
            "print(secrets.token_urlsafe(24))'`)"
        )
    return keys
