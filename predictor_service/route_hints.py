"""What an external router reads of a prediction: the expected output length, its bucket, the reserve and the
tool-call probability. One home for the bucket bounds, used by the service's /route_hints and by the gateway's
request headers (serving/gateway/router_hints.py), so both say the same bucket for the same stage."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from predictor_service.schemas import PredictionOut

SHORT_MAX_TOKENS = 256  # predicted output up to this: "short"
MEDIUM_MAX_TOKENS = 1024  # ... up to this: "medium"; above: "long"
Bucket = Literal["short", "medium", "long"]


def osl_bucket(tokens_pred: int) -> Bucket:
    """The output-length bucket of a predicted number of output tokens."""
    if tokens_pred <= SHORT_MAX_TOKENS:
        return "short"
    return "medium" if tokens_pred <= MEDIUM_MAX_TOKENS else "long"


class RouteHint(BaseModel):
    """One stage's answer of /route_hints."""

    workflow_id: str
    stage_id: str
    osl: int  # expected output tokens (Dynamo's `osl`)
    bucket: Bucket
    reserve: int  # output tokens to reserve KV for (the calibrated upper quantile)
    p_tool: float  # probability that the stage ends in a tool call
    model_version: str


def route_hint(prediction: PredictionOut) -> RouteHint:
    return RouteHint(
        workflow_id=prediction.workflow_id,
        stage_id=prediction.stage_id,
        osl=prediction.tokens_pred,
        bucket=osl_bucket(prediction.tokens_pred),
        reserve=prediction.tokens_reserve,
        p_tool=prediction.p_tool,
        model_version=prediction.model_version,
    )
