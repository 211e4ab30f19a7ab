"""A fault-injecting HTTP proxy for tests: in front of a real vLLM engine, on 127.0.0.1, in its own thread.

Each POST takes the first `Fault` that still has uses left and suffers it; every other request (GET /metrics,
/health, /v1/models, and POSTs once the faults are used up) is forwarded as it is. Faults:
- `status`: answer `status` (a 5xx) with a JSON error body, without forwarding;
- `cut`: forward the answer's first `after_events` SSE events (a JSON answer is one event), then half of the
  next one, then drop the connection;
- `stall`: after the status line and `after_events` events, send nothing for `stall_s`, then go on;
- `hang`: send nothing at all, not even the status line, for `stall_s`, then forward the answer.
The headers and body of each POST that is read are kept in `received`.
One proxy listens on one or more ports (`num_ports`): nodes behind it share its faults, so whichever node the
gateway tries first meets the fault, and a retry on another port goes through clean.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

KINDS = ("status", "cut", "stall", "hang")
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "host", "content-encoding"}


@dataclass
class Fault:
    """One rule; `hit_ports` records the port of each request it was applied to."""

    kind: str
    status: int = 503
    after_events: int = 0
    stall_s: float = 0.0
    times: int = 1
    hit_ports: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Fault.kind must be one of {KINDS}, got {self.kind!r}")
        if self.times < 1 or self.after_events < 0 or self.stall_s < 0:
            raise ValueError("Fault: times >= 1, after_events >= 0 and stall_s >= 0")

    @property
    def is_used_up(self) -> bool:
        return len(self.hit_ports) >= self.times


class FaultProxy:
    """`with FaultProxy(engine_url, [Fault(...)], num_ports=2) as proxy:` → `proxy.urls`, one per port."""

    def __init__(self, upstream_url: str, faults: list[Fault] | None = None, num_ports: int = 1):
        self.upstream_url = upstream_url.rstrip("/")
        self.faults = list(faults or [])
        self.num_ports = num_ports
        self.urls: list[str] = []
        self.num_forwarded = 0
        self.received: list[tuple[dict, bytes]] = []  # each POST's headers and body, as the proxy got them
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, handler_cancellation=True)
        await self._runner.setup()
        for _ in range(self.num_ports):
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    def _take_fault(self, request: web.Request) -> Fault | None:
        if request.method != "POST":
            return None
        fault = next((f for f in self.faults if not f.is_used_up), None)
        if fault is not None:
            fault.hit_ports.append(request.transport.get_extra_info("sockname")[1])
        return fault

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        fault = self._take_fault(request)
        if fault is not None and fault.kind == "status":
            return web.json_response(
                {"error": {"message": "injected fault", "type": "fault", "code": fault.status}}, status=fault.status
            )
        body = await request.read()
        if fault is not None and fault.kind == "hang":
            await asyncio.sleep(fault.stall_s)
        if request.method == "POST":
            self.received.append((dict(request.headers), body))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(
            request.method, f"{self.upstream_url}{request.path_qs}", data=body, headers=headers
        ) as upstream:
            self.num_forwarded += 1
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS},
            )
            await response.prepare(request)
            num_events = 0
            async for event in _events(upstream.content):
                if fault is not None and num_events == fault.after_events and fault.kind == "cut":
                    await response.write(event[: len(event) // 2])
                    request.transport.abort()  # no terminating chunk: the reader sees an incomplete payload
                    return response
                if fault is not None and num_events == fault.after_events and fault.kind == "stall":
                    await asyncio.sleep(fault.stall_s)
                await response.write(event)
                num_events += 1
            await response.write_eof()
            return response


async def _events(content: aiohttp.StreamReader):
    """The body as SSE events (each with its blank-line end); a body that is no SSE stream is one event."""
    buffer = b""
    async for raw in content.iter_any():
        buffer += raw
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            yield event + b"\n\n"
    if buffer:
        yield buffer
