"""Wire types of the predictor service, defined once and shared by service, client and tests.

A stage on the wire *is* a contract stage (`pipelines.contract.StageTrace`): /predict takes stages
without labels, /observe takes finished stages with their labels and timings. The limits below are
part of the protocol: the service refuses a request over them and the client splits its batches
to stay under them.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from pipelines.contract import StageTrace, derive_structure, prompt_text
from pipelines.predictor import FALLBACK_LEVELS

MAX_STAGES_PER_REQUEST = 256
MAX_PROMPT_CHARS = 100_000
MAX_PROMPT_MESSAGES = 2_048
LABEL_FIELDS = ("output_tokens", "is_tool_call")
SOURCES = ("model", "error-fallback", "local-fallback")


def _check_prompt_size(prompt: Any) -> Any:
    if isinstance(prompt, list) and len(prompt) > MAX_PROMPT_MESSAGES:
        raise ValueError(f"prompt has {len(prompt)} messages; the limit is {MAX_PROMPT_MESSAGES}")
    size = len(prompt_text(prompt))
    if size > MAX_PROMPT_CHARS:
        raise ValueError(f"prompt has {size} characters; the limit is {MAX_PROMPT_CHARS} "
                         "(send the tail the model will see, or raise MAX_PROMPT_CHARS on both sides)")
    return prompt


class StageIn(StageTrace):
    """A stage about to run: contract fields without labels (parents' outcomes may ride in `parent_output_tokens`)."""

    @model_validator(mode="before")
    @classmethod
    def _no_labels(cls, data: Any) -> Any:
        present = [f for f in LABEL_FIELDS if isinstance(data, dict) and data.get(f) is not None]
        if present:
            raise ValueError(f"{', '.join(present)} given: /predict takes stages before they run; "
                             "send finished stages to /observe")
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
    def _structure(self) -> "PredictRequest":
        # Order-dependent structure (call_index, depth) is fixed per request, before adaptive batching
        # mixes requests: a stage's features must not depend on whose request it was batched with.
        derive_structure(self.stages)
        return self


class PredictionOut(BaseModel):
    """One answer of /predict. tokens_pred / tokens_reserve already include the online factors shown."""

    workflow_id: str
    stage_id: str
    p_tool: float
    tokens_pred: int
    tokens_reserve: int
    fallback_level: str  # role | new_app | global | prior: which level of the fallback chain answered
    history: str = "full"  # full | partial | none: how much of the workflow's past the stage's input held
    model_version: str
    correction: float = 1.0  # online per-role factor applied to the model's tokens (1.0 = none)
    reserve_correction: float = 1.0  # online per-role factor applied to the model's reserve (1.0 = none)
    source: str = "model"  # model | error-fallback (model raised; prior) | local-fallback (client-side prior)


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
    return {"max_stages_per_request": MAX_STAGES_PER_REQUEST, "max_prompt_chars": MAX_PROMPT_CHARS,
            "max_prompt_messages": MAX_PROMPT_MESSAGES}
