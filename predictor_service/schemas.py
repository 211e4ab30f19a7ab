"""Wire types of the predictor service, defined once and shared by service, client and tests.

A stage on the wire *is* a contract stage (`maestro.contract.StageTrace`): /predict takes stages
without labels, /observe takes finished stages with their labels and timings. The limits below are
part of the protocol: the service refuses a request over them and the client splits its batches
to stay under them.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, fields
from typing import Any, get_type_hints

from pydantic import BaseModel, Field, create_model, field_validator, model_validator

from maestro.contract import StageTrace, derive_structure, prompt_text
from maestro.prediction import Prediction, Source

MAX_STAGES_PER_REQUEST = 256
MAX_PROMPT_CHARS = 100_000
MAX_PROMPT_MESSAGES = 2_048
LABEL_FIELDS = ("output_tokens", "is_tool_call")


def _check_prompt_size(prompt: Any) -> Any:
    if isinstance(prompt, list) and len(prompt) > MAX_PROMPT_MESSAGES:
        raise ValueError(f"prompt has {len(prompt)} messages; the limit is {MAX_PROMPT_MESSAGES}")
    size = len(prompt_text(prompt))
    if size > MAX_PROMPT_CHARS:
        raise ValueError(
            f"prompt has {size} characters; the limit is {MAX_PROMPT_CHARS} "
            "(send the tail the model will see, or raise MAX_PROMPT_CHARS on both sides)"
        )
    return prompt


class StageIn(StageTrace):
    """A stage about to run: contract fields without labels (parents' outcomes may ride in `parent_output_tokens`)."""

    @model_validator(mode="before")
    @classmethod
    def _no_labels(cls, data: Any) -> Any:
        present = [f for f in LABEL_FIELDS if isinstance(data, dict) and data.get(f) is not None]
        if present:
            raise ValueError(
                f"{', '.join(present)} given: /predict takes stages before they run; send finished stages to /observe"
            )
        return data

    @field_validator("prompt")
    @classmethod
    def _prompt_size(cls, prompt: Any) -> Any:
        return _check_prompt_size(prompt)


class ObservedStage(StageTrace):
    """A finished stage: the contract fields, its labels (required) and whatever timings were measured."""

    output_tokens: int = Field(ge=0)
    is_tool_call: bool

    @field_validator("prompt")
    @classmethod
    def _prompt_size(cls, prompt: Any) -> Any:
        return _check_prompt_size(prompt)


class PredictRequest(BaseModel):
    """POST /predict: the stages to predict (up to MAX_STAGES_PER_REQUEST)."""

    stages: list[StageIn] = Field(min_length=1, max_length=MAX_STAGES_PER_REQUEST)

    @model_validator(mode="after")
    def _structure(self) -> PredictRequest:
        # Order-dependent structure (call_index, depth) is fixed per request, before adaptive batching
        # mixes requests: a stage's features must not depend on whose request it was batched with.
        derive_structure(self.stages)
        return self


def dataclass_fields(cls: type) -> dict[str, tuple[Any, Any]]:
    """A dataclass's fields as pydantic field definitions (type, default), so a wire model is built from them; the
    keyword-only ones (a `Prediction`'s workflow fields, declared on its base) last, as its __init__ takes them."""
    types = get_type_hints(cls)
    ordered = sorted(fields(cls), key=lambda f: f.kw_only)  # a stable sort: declaration order otherwise
    return {f.name: (types[f.name], ... if f.default is MISSING else f.default) for f in ordered}


PREDICTION_FIELDS = dataclass_fields(Prediction)


class ServedPrediction(BaseModel):
    """The way between /predict's answer (`PredictionOut`) and the one `Prediction` type it is built from."""

    @classmethod
    def of(cls, prediction: Prediction, **served: Any) -> ServedPrediction:
        """The answer that serves `prediction`; `served`: model_version and the service's other fields."""
        return cls(**asdict(prediction), **served)

    def prediction(self) -> Prediction:
        return Prediction(**{name: getattr(self, name) for name in PREDICTION_FIELDS})


PredictionOut = create_model(
    "PredictionOut",
    __base__=ServedPrediction,
    __doc__="One answer of /predict: a `Prediction`'s fields (the stage's, then its workflow's remaining work, "
    "`wf_*`), then which model served it, how, and the online factors its tokens_pred / tokens_reserve "
    "already include.",
    **PREDICTION_FIELDS,
    model_version=(str, ...),
    correction=(float, Field(1.0, description="online per-role factor applied to the model's tokens (1.0 = none)")),
    reserve_correction=(float, Field(1.0, description="online per-role factor applied to the model's reserve")),
    source=(Source, Source.MODEL),
)


class ObserveRequest(BaseModel):
    """POST /observe: finished stages with their actual outcomes."""

    stages: list[ObservedStage] = Field(min_length=1, max_length=MAX_STAGES_PER_REQUEST)


class RoleCorrection(BaseModel):
    """The online correction of one role: the factors applied to token predictions and reserves, and what
    they rest on."""

    factor: float
    reserve_factor: float = 1.0
    log_ratio: float
    num_observations: int
    age_s: float
    is_active: bool


class ObserveResponse(BaseModel):
    num_accepted: int
    trace_file: str | None
    corrections: dict[str, RoleCorrection]


class ReloadRequest(BaseModel):
    """POST /admin/reload: a predictor location (models:/stage-length/3, models:/stage-length@champion, or a path)."""

    model: str = Field(min_length=1, max_length=1_000)


class ReloadResponse(BaseModel):
    model_version: str
    previous_version: str
    model_uri: str
    load_s: float


class StatsResponse(BaseModel):
    model_version: str
    model_uri: str
    model_loaded_at: float
    uptime_s: float
    num_predict_calls: int
    num_stages_predicted: int
    fallback_counts: dict[str, int]
    source_counts: dict[str, int]
    num_observed: int
    num_reloads: int
    corrections: dict[str, RoleCorrection]
    trace_file: str | None
    limits: dict[str, int]


def limits() -> dict[str, int]:
    return {
        "max_stages_per_request": MAX_STAGES_PER_REQUEST,
        "max_prompt_chars": MAX_PROMPT_CHARS,
        "max_prompt_messages": MAX_PROMPT_MESSAGES,
    }
