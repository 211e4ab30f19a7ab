"""The ASGI app: OpenAI-compatible routes in front of the vLLM nodes, plus /health and /maestro/status.

With API keys configured every route but /health needs `Authorization: Bearer <key>` (401 otherwise).
"""

from __future__ import annotations

import contextlib

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from maestro.keys import ANONYMOUS, caller_key_id
from serving.gateway.call import StageCall, error_response
from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway
from serving.gateway.exposition import MEDIA_TYPE


def create_app(config: GatewayConfig, gateway: Gateway | None = None) -> Starlette:
    gateway = gateway or Gateway(config)
    keys = config.server.read_api_keys()

    def authorized(endpoint):
        """The endpoint, called with the caller's key id, or 401 for a call without a known key."""

        async def guarded(request: Request) -> Response:
            caller_id = caller_key_id(request.headers.get("authorization"), keys)
            if caller_id is None:
                refused = error_response(
                    401,
                    "missing or unknown API key; send `Authorization: Bearer <key>`",
                    "authentication_error",
                    param="Authorization",
                )
                refused.headers["WWW-Authenticate"] = "Bearer"
                return refused
            return await endpoint(request, "" if caller_id == ANONYMOUS else caller_id)

        return guarded

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    async def chat(request: Request, caller_id: str):
        return await StageCall(gateway, request, "/v1/chat/completions", caller_id).respond()

    async def completions(request: Request, caller_id: str):
        return await StageCall(gateway, request, "/v1/completions", caller_id).respond()

    async def models(request: Request, caller_id: str):
        for node in gateway.nodes:
            if node.is_healthy:
                response = await gateway.upstream.get(f"{node.url}/v1/models")
                return Response(response.content, response.status_code, media_type="application/json")
        return error_response(503, "no healthy vLLM node to list models from", "upstream_error", 1)

    async def ready(request: Request):
        readiness = gateway.readiness()
        return JSONResponse(readiness, 200 if readiness["ready"] else 503)

    async def metrics(request: Request):
        return Response(gateway.metrics.text(), media_type=MEDIA_TYPE)

    async def health(request: Request):
        ok = any(n.is_healthy for n in gateway.nodes)
        return JSONResponse({"healthy": ok}, 200 if ok else 503)

    async def status(request: Request, caller_id: str):
        return JSONResponse(gateway.status())

    routes = [
        Route("/v1/chat/completions", authorized(chat), methods=["POST"]),
        Route("/v1/completions", authorized(completions), methods=["POST"]),
        Route("/v1/models", authorized(models)),
        Route("/health", health),
        Route("/maestro/status", authorized(status)),
    ]
    routes += [Route("/ready", ready), Route("/metrics", metrics)]  # probes and scrapers: no key needed
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gateway = gateway
    return app
