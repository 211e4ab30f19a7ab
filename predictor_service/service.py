"""The BentoML service: `bentoml serve predictor_service.service:PredictorService`.

POST /predict (adaptive batching across requests), POST /predict_unbatched (same answers, one
request at a time), POST /route_hints (the same predictions as an endpoint picker reads them),
POST /observe, GET /stats, GET /coverage, POST /admin/reload; BentoML adds /livez, /readyz and /metrics.
Configuration comes from the environment when the service starts (ServiceConfig.from_env).
"""

from __future__ import annotations

import functools
import gc
import logging
import sys
from collections import Counter
from http import HTTPStatus

import anyio
import bentoml
from bentoml.exceptions import BentoMLException, NotFound, UnprocessableEntity
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from maestro.keys import caller_key_id
from pipelines.artifact import ArtifactMismatch
from predictor_service.config import ServiceConfig
from predictor_service.coverage import coverage_report
from predictor_service.engine import PredictorEngine
from predictor_service.guard import Guard
from predictor_service.loading import LocationRefused
from predictor_service.route_hints import RouteHint, route_hint
from predictor_service.schemas import (
    MAX_STAGES_PER_REQUEST,
    ObservedStage,
    ObserveRequest,
    ObserveResponse,
    PredictionOut,
    PredictRequest,
    ReloadRequest,
    ReloadResponse,
    StageIn,
)

logger = logging.getLogger(__name__)


async def _stats(_: Request) -> JSONResponse:
    """GET /stats: model version, call and fallback counts, online corrections (StatsResponse)."""
    return JSONResponse(bentoml.get_current_service().engine.stats().model_dump())


async def _coverage(_: Request) -> JSONResponse:
    """GET /coverage: the active model's live coverage per group, and which groups drift (CoverageResponse)."""
    active = bentoml.get_current_service().engine.active
    return JSONResponse(coverage_report(active.source.version, active.corrections).model_dump())


# GET /stats and /coverage live on a mounted Starlette app: BentoML's own endpoints are POST only.
http_app = Starlette(routes=[Route("/stats", _stats, methods=["GET"]), Route("/coverage", _coverage, methods=["GET"])])


@functools.cache
def service_metrics() -> dict:
    """Prometheus counters, created once per process after BentoML has set up multiprocess metrics."""
    from prometheus_client import Counter, Gauge

    return {
        "share_above_reserve": Gauge(
            "maestro_predictor_share_above_reserve",
            "Recent share of observed stages above their served reserve (EWMA), by app, role and history condition",
            ["app", "role", "history"],
        ),
        "stages": Counter(
            "maestro_predictor_stages",
            "Stages predicted, by fallback level and answer source",
            ["fallback_level", "source"],
        ),
        "observed": Counter("maestro_predictor_observed_stages", "Finished stages observed"),
        "reloads": Counter("maestro_predictor_reloads", "Model reloads, by outcome", ["outcome"]),
    }


# One worker, one model thread: on 2 cores, batching concurrent requests beats running them side by side, and
# one worker keeps one workflow history and one online correction. No access log: at thousands of calls a second
# it costs more than it tells (/metrics counts requests). Bound to 127.0.0.1 unless `bentoml serve --host` says
# otherwise. Shared with the benchmark's framework-only service (benchmarks/service/framework.py).
SERVICE_OPTIONS = dict(
    workers=1,
    threads=1,
    traffic={"timeout": 30},
    http={"host": "127.0.0.1"},
    logging={"access": {"enabled": False}},
    tracing={"excluded_urls": "/predict,/predict_unbatched"},
)
# /predict's adaptive batching: concurrent requests join the batch after the one running.
PREDICT_BATCHING = dict(batchable=True, max_batch_size=MAX_STAGES_PER_REQUEST, max_latency_ms=5_000)


@bentoml.asgi_app(http_app, path="/")
@bentoml.service(name="maestro_predictor", **SERVICE_OPTIONS)
class PredictorService:
    """Stage-length predictions for the scheduler, online correction from observed stages, hot model reload."""

    def __init__(self) -> None:
        # The model thread holds the GIL through long pandas stretches; a shorter switch interval lets the
        # event loop parse and answer other requests in between instead of queueing behind it for 5 ms.
        sys.setswitchinterval(0.001)
        self.engine = PredictorEngine(ServiceConfig.from_env())
        self.metrics = service_metrics()
        # The loaded model is hundreds of thousands of long-lived objects; frozen, the collector stops
        # rescanning them in every full collection (pauses on the request path).
        gc.freeze()
        logger.info(
            "serving predictor version %s from %s", self.engine.active.source.version, self.engine.active.source.uri
        )

    # Sync, so a batch runs on BentoML's model thread: a batch of new prompts (embedding 256 of them) can take
    # seconds, and on the event loop it would stall /livez and every other call meanwhile.
    @bentoml.api(route="/predict", input_spec=PredictRequest, **PREDICT_BATCHING)
    def predict(self, stages: list[StageIn]) -> list[PredictionOut]:
        """Predict tool-call probability and output tokens; batches of concurrent requests run together."""
        return self._predict(stages)

    @bentoml.api(route="/predict_unbatched", input_spec=PredictRequest)
    def predict_unbatched(self, stages: list[StageIn]) -> list[PredictionOut]:
        """The same answers as /predict, without waiting for other requests to batch with."""
        return self._predict(stages)

    @bentoml.api(route="/route_hints", input_spec=PredictRequest)
    def route_hints(self, stages: list[StageIn]) -> list[RouteHint]:
        """For an external endpoint picker: per stage, expected output tokens, their bucket, the reserve and p_tool."""
        return [route_hint(answer) for answer in self._predict(stages)]

    def _predict(self, stages: list[StageIn]) -> list[PredictionOut]:
        answers = self.engine.predict(stages)
        for (level, source), count in Counter((a.fallback_level, a.source) for a in answers).items():
            self.metrics["stages"].labels(level, source).inc(count)
        return answers

    @bentoml.api(route="/observe", input_spec=ObserveRequest)
    async def observe(self, stages: list[ObservedStage], ctx: bentoml.Context) -> ObserveResponse:
        """Record finished stages: update the per-role correction and append them to the trace file
        (each line says which API key sent it)."""
        caller = caller_key_id(ctx.request.headers.get("authorization"), self.engine.config.api_keys)
        response = await anyio.to_thread.run_sync(self.engine.observe, stages, caller)
        self.metrics["observed"].inc(len(stages))
        for group, coverage in self.engine.active.corrections.coverage().items():
            if isinstance(group, tuple):  # (app, role, history); the engine always observes with one
                self.metrics["share_above_reserve"].labels(*group).set(coverage["share_above_reserve"])
        return response

    @bentoml.api(route="/history", input_spec=ObserveRequest)
    async def history(self, stages: list[ObservedStage]) -> ObserveResponse:
        """Keep finished stages as workflow history only (no trace line, no correction): what a client sends the
        replica its workflows fail over to (predictor_service/replicas.py)."""
        await anyio.to_thread.run_sync(self.engine.remember, stages)
        return ObserveResponse(num_accepted=len(stages), trace_file=None, corrections={})

    @bentoml.api(route="/admin/reload", input_spec=ReloadRequest)
    async def reload(self, model: str) -> ReloadResponse:
        """Load another predictor off the request path and swap it in; in-flight requests are unaffected.
        Only the admin may call it (Guard); it loads registry versions or directories under the model root."""
        try:
            response = await anyio.to_thread.run_sync(self.engine.reload, model)
        except Exception as error:
            self.metrics["reloads"].labels("failed").inc()
            raise _reload_error(error, self.engine.active.source.version) from None
        self.metrics["reloads"].labels("ok").inc()
        gc.freeze()  # the new model's objects too (see __init__)
        return response


PredictorService.add_asgi_middleware(Guard)


def set_json_media_type(service, routes: tuple[str, ...]) -> None:
    """Left unset, BentoML derives the media type from the output's JSON schema on every response (~0.5 ms)."""
    for route in routes:
        service.apis[route].output_spec.media_type = "application/json"


set_json_media_type(PredictorService, ("predict", "predict_unbatched", "route_hints"))


def _reload_error(error: Exception, serving: str) -> Exception:
    """The caller's reply names what went wrong but never echoes a filesystem path (no probing the host)."""
    logger.warning("reload failed: %s: %s", type(error).__name__, error)
    if isinstance(error, LocationRefused):
        return BentoMLException(f"{error}. Still serving version {serving}", error_code=HTTPStatus.FORBIDDEN)
    text = str(error)
    if isinstance(error, FileNotFoundError) or "not found" in text.lower() or "RESOURCE_DOES_NOT_EXIST" in text:
        return NotFound(
            f"no predictor at that location. Still serving version {serving}; check the version, "
            "or that the directory holds a saved predictor"
        )
    reason = str(error) if isinstance(error, ArtifactMismatch) else type(error).__name__
    return UnprocessableEntity(
        f"could not load that model ({reason}). Still serving version {serving}; the node's log has the details"
    )
