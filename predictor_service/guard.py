"""The service's front door, as ASGI middleware: body size limit (413), API keys (401), admin gate (401/403),
load shedding (503 + Retry-After).

It runs before BentoML parses a request, so an oversized or unauthorised call costs no parsing and
reaches no endpoint. The rules come from the running service's ServiceConfig.
"""

from __future__ import annotations

import json

import bentoml

from maestro.keys import bearer, caller_key_id, matches
from predictor_service.config import ServiceConfig

# Need an API key when keys are configured.
KEYED_PATHS = ("/predict", "/predict_unbatched", "/route_hints", "/observe", "/history", "/stats", "/coverage")
# The admin token reads these too: `maestro deploy` verifies nodes through /stats, `maestro retrain` reads /coverage.
ADMIN_READABLE = ("/stats", "/coverage")
ADMIN_PREFIX = "/admin/"
# Calls that queue for the model thread: over `max_inflight` of them at once, more are turned away (503) at
# once rather than queued without bound. /livez, /readyz, /metrics and /stats are never shed.
SHED_PATHS = ("/predict", "/predict_unbatched", "/route_hints", "/observe", "/history")
BUSY_STATUSES = (429, 503)
RETRY_AFTER = (b"retry-after", b"1")


def refusal(config: ServiceConfig, path: str, authorization: str | None) -> tuple[int, str] | None:
    """Why a call to `path` is refused (status, reason), or None when it may go on."""
    is_admin = bool(config.admin_token) and matches(bearer(authorization), config.admin_token)
    if path.startswith(ADMIN_PREFIX):
        if is_admin or (config.admin_open and not config.admin_token):
            return None
        if config.admin_token:
            return 401, "admin endpoints need `Authorization: Bearer <MAESTRO_ADMIN_TOKEN>`"
        return 403, (
            "admin endpoints are off on this node: start it with MAESTRO_ADMIN_TOKEN set "
            "(or MAESTRO_ADMIN_OPEN=1 on a trusted network)"
        )
    if path in ADMIN_READABLE and is_admin:
        return None
    if path in KEYED_PATHS and caller_key_id(authorization, config.api_keys) is None:
        return 401, "this node needs an API key: send `Authorization: Bearer <key>`"
    return None


class Guard:
    """ASGI middleware applying `refusal` and the body size limit to every HTTP call."""

    def __init__(self, app, config: ServiceConfig | None = None):
        self.app, self._config = app, config
        self.num_inflight = 0  # calls to SHED_PATHS in this worker

    @property
    def config(self) -> ServiceConfig:
        return self._config or bentoml.get_current_service().engine.config

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        config = self.config
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refused = refusal(config, scope["path"], headers.get("authorization"))
        if refused is None:
            refused, receive = await _within_limit(headers, receive, config.max_body_bytes)
        if refused is not None:
            return await _reply(send, *refused)
        if scope["path"] not in SHED_PATHS:
            return await self.app(scope, receive, send)
        return await self._shed_or_call(scope, receive, send, config.max_inflight)

    async def _shed_or_call(self, scope, receive, send, max_inflight: int):
        if max_inflight and self.num_inflight >= max_inflight:
            return await _reply(
                send,
                503,
                f"this node is at its limit of {max_inflight} calls in flight "
                "(MAESTRO_MAX_INFLIGHT): retry after 1 s or ask another node",
            )
        self.num_inflight += 1
        try:
            return await self.app(scope, receive, _with_retry_after(send))
        finally:
            self.num_inflight -= 1


def _with_retry_after(send):
    """`send`, adding Retry-After to a 429/503 from inside (BentoML's batcher answers 503 without it when a
    request would wait past max_latency_ms)."""

    async def wrapped(message):
        if (
            message["type"] == "http.response.start"
            and message["status"] in BUSY_STATUSES
            and not any(name.lower() == RETRY_AFTER[0] for name, _ in message.get("headers", ()))
        ):
            message = {**message, "headers": [*message.get("headers", ()), RETRY_AFTER]}
        await send(message)

    return wrapped


async def _within_limit(headers: dict, receive, limit: int):
    """(refusal or None, the receive to pass on): a declared length is checked up front, an undeclared
    (chunked) body is read here up to the limit and replayed."""
    declared = headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            return (400, "Content-Length is not a number"), receive
        if int(declared) > limit:
            return (
                413,
                f"request body of {declared} bytes is over this node's limit of {limit} "
                "(MAESTRO_MAX_BODY_BYTES): send fewer stages per call",
            ), receive
        return None, receive
    if "chunked" not in headers.get("transfer-encoding", ""):
        return None, receive
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None, _replay([message])
        chunks.append(message.get("body", b""))
        size, more = size + len(chunks[-1]), message.get("more_body", False)
        if size > limit:
            return (413, f"request body is over this node's limit of {limit} bytes (MAESTRO_MAX_BODY_BYTES)"), receive
    return None, _replay([{"type": "http.request", "body": b"".join(chunks), "more_body": False}])


def _replay(messages: list[dict]):
    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return receive


async def _reply(send, status: int, reason: str) -> None:
    body = json.dumps({"error": reason}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if status in BUSY_STATUSES:
        headers.append(RETRY_AFTER)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
