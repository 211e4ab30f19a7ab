"""The gateway's HTTP client towards its vLLM nodes, on aiohttp.

Profiled on the real path, httpx's async client cost ≈ 1 ms of CPU per forwarded call and aiohttp
≈ 0.4 ms; on two shared cores that difference is most of what the gateway adds to a call.
Closing a response before its end closes the connection, which is what makes vLLM abort.

Two timeouts bound a call: the node's (`sock_read`: no byte for node_timeout_s, aiohttp raises a
`ServerTimeoutError`, a `ClientError`) and the stage's deadline (`total`: a bare `asyncio.TimeoutError`).
`is_deadline` tells them apart, so that a call cut by its deadline is not retried.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass

import aiohttp

# What a node failing at the transport level raises: connection refused/reset, timeouts, bad answers.
UpstreamError = (aiohttp.ClientError, asyncio.TimeoutError)
# A pooled connection idle this long is not reused: vLLM (uvicorn) closes idle keep-alive connections after
# 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE), and a call sent on one it is closing fails (ServerDisconnectedError).
KEEPALIVE_S = 4.0


@dataclass(frozen=True)
class Reply:
    """A whole (non-streamed) answer: status and body bytes, relayed as they came."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self):
        return json.loads(self.content)


class Upstream:
    """One connection pool for all nodes; `start()` inside the event loop, `close()` at the end."""

    def __init__(self, node_timeout_s: float, connect_timeout_s: float, max_connections: int = 1024):
        self.timeout = aiohttp.ClientTimeout(total=None, sock_read=node_timeout_s, sock_connect=connect_timeout_s)
        self.max_connections = max_connections
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_S)
        self.session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def get(self, url: str, timeout_s: float | None = None) -> Reply:
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
        async with self.session.get(url, timeout=timeout) as response:
            return Reply(response.status, await response.read())

    def call_timeout(self, remaining_s: float | None) -> aiohttp.ClientTimeout:
        """The pool's stall and connect timeouts, the whole call (body included) bounded by `remaining_s`.

        A call with no time left raises the deadline's `asyncio.TimeoutError` unsent: aiohttp reads a `total`
        of 0 as no limit at all, so it would wait out node_timeout_s. `ceil_threshold=inf`: aiohttp would
        otherwise round a `total` of 5 s or more up to the loop clock's next whole second."""
        if remaining_s is None:
            return self.timeout
        if remaining_s <= 0:
            raise TimeoutError
        return aiohttp.ClientTimeout(
            total=remaining_s,
            sock_read=self.timeout.sock_read,
            sock_connect=self.timeout.sock_connect,
            ceil_threshold=math.inf,
        )

    async def post_json(self, url: str, body: dict, headers: dict, remaining_s: float | None = None) -> Reply:
        async with self.session.post(
            url, data=json.dumps(body).encode(), headers=_json(headers), timeout=self.call_timeout(remaining_s)
        ) as response:
            return Reply(response.status, await response.read())

    async def open_stream(
        self, url: str, body: dict, headers: dict, remaining_s: float | None = None
    ) -> aiohttp.ClientResponse:
        """The response once its headers are in; the caller reads `.content` and must `release()` or `close()` it."""
        return await self.session.post(
            url, data=json.dumps(body).encode(), headers=_json(headers), timeout=self.call_timeout(remaining_s)
        )


def is_deadline(error: BaseException) -> bool:
    """The call was cut by its `total` (the stage's deadline), not by the node's stall or connect timeout."""
    return isinstance(error, asyncio.TimeoutError) and not isinstance(error, aiohttp.ClientError)


def _json(headers: dict) -> dict:
    return {"Content-Type": "application/json", **headers}
