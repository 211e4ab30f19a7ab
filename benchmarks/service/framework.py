"""BentoML's share of the predictor service's latency: the service's BentoML settings, schemas and Guard
around a constant answer, no model (`bentoml serve benchmarks.service.framework:FrameworkOnly`).

benchmarks/service/serve.py measures it beside the service and the bare route: the service minus this is
the model's share, this minus the bare route is the framework's."""

from __future__ import annotations

import copy

import bentoml

from predictor_service.config import ServiceConfig
from predictor_service.guard import Guard
from predictor_service.schemas import PredictionOut, PredictRequest, StageIn
from predictor_service.service import PREDICT_BATCHING, SERVICE_OPTIONS, set_json_media_type


@bentoml.service(name="maestro_predictor_framework_only", **copy.deepcopy(SERVICE_OPTIONS))
class FrameworkOnly:
    """/predict with the service's batching, answering every stage with the same prediction-shaped object."""

    @bentoml.api(route="/predict", input_spec=PredictRequest, **PREDICT_BATCHING)
    def predict(self, stages: list[StageIn]) -> list[PredictionOut]:
        return [
            PredictionOut(
                workflow_id=s.workflow_id,
                stage_id=s.stage_id,
                p_tool=0.5,
                tokens_pred=256,
                tokens_reserve=1024,
                fallback_level="role",
                model_version="framework-only",
            )
            for s in stages
        ]


FrameworkOnly.add_asgi_middleware(Guard, config=ServiceConfig(trace=None))
set_json_media_type(FrameworkOnly, ("predict",))
