"""A stage's prediction: the one type every part passes on, from `Predictor.predict` to the scheduler and the engine.

Pure dataclasses and enums (no pandas, LightGBM or pydantic), so the training side, the predictor service, the
gateway, the simulator and the vLLM plugin (which runs in vLLM's own environment) all import this one definition.
The enums are `StrEnum`s: what travels (JSON, traces, metric labels) is their value, the same string as a plain
str, and a plain str is accepted wherever one is built.

Where a layer needs another shape, it holds or converts this one (maestro/README.md lists them by layer).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum


class FallbackLevel(StrEnum):
    """Which level of the predictor's fallback chain answered a stage."""

    ROLE = "role"  # the model, with the stage's role and app seen in training
    # an app that training never saw: the reserve from its own bound model, lifted to the level that held for the
    # worst training app left out (pipelines/new_app.py); where training held fewer than two apps, the global
    # reserve, without a coverage promise
    NEW_APP = "new_app"
    GLOBAL = "global"  # the model without the role: a role that training never saw
    PRIOR = "prior"  # no usable model input: the role's empirical quantiles, else the global ones

    @property
    def is_calibrated(self) -> bool:
        """Whether a reserve answered at this level is already a calibrated upper bound.

        A model's is: its tokens_reserve is the conformal bound (or, for a model trained with reserve_method
        "rho", a bound with its margin already in). A prior's is not: it is a role's empirical quantile or the
        no-model prior, with no conformal calibration behind it, so sizing adds the margin rho to it
        (serving/core/admission/sizing.py).
        """
        return self is not FallbackLevel.PRIOR


class Source(StrEnum):
    """Who answered a stage's prediction: the model, or a prior and why.

    The predictor service says `model` or `error-fallback`, its client `local-fallback`; the gateway, which sees
    both its own predictor and the service's answers, names the reason for every prior it serves.
    """

    MODEL = "model"
    ERROR_FALLBACK = "error-fallback"  # the service's model raised on this stage: the service answered with its prior
    LOCAL_FALLBACK = "local-fallback"  # the service was slow, down or refused: its client answered with the prior
    TIMEOUT = "timeout"  # the model gave no answer within the gateway's predictor.timeout_s
    ERROR = "error"  # the model or the service failed on this call
    UNAVAILABLE = "unavailable"  # the service failed lately: its client answers locally during its cooldown
    NO_MODEL = "no_model"  # no trained model configured (or the service serves priors only)


class WorkflowFallbackLevel(StrEnum):
    """Which level of the workflow-level predictor (pipelines/workflow_remaining.py) answered."""

    APP = "app"  # the model, for an app seen in training
    POSITION = "position"  # an app training never saw (or too little data): the per-position table over all apps
    PRIOR = "prior"  # no workflow model at all: WORKFLOW_PRIOR


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputSize:
    """A stage's output length as one layer holds it: the point estimate `tokens_pred` and `tokens_reserve`, the
    output tokens to hold KV for.

    The one declaration of the pair. The frozen shapes that carry one are one (`Prediction`, the engine's
    `MaestroHints`, the batch-cost gate's `RunningStage` and `Candidate`); the mutable ones hold one as `size`
    (`StageRequest`, `SimStage`). What the numbers stand for is the holder's: a `Prediction`'s are the predictor's
    answer, a `StageRequest`'s the pair as sized for the stage (serving/core/admission/sizing.py). Keyword-only, so
    the two ints are never swapped by position, and a shape that is one keeps its own fields positional.
    """

    tokens_pred: int
    tokens_reserve: int

    @property
    def size(self) -> OutputSize:
        """The pair alone (of a shape that is one, too): what a mutable shape holds as its `size`."""
        return OutputSize(tokens_pred=self.tokens_pred, tokens_reserve=self.tokens_reserve)


NO_SIZE = OutputSize(tokens_pred=0, tokens_reserve=0)  # what a mutable shape holds before its stage is sized


@dataclass(frozen=True, kw_only=True)
class WorkflowRemaining:
    """A workflow's remaining work seen from one of its stages when it becomes ready: the stages after it (a larger
    call_index, any role) and their output tokens, median and (1 − α) upper bound, and which level answered.

    The defaults are the answer with no workflow model: a guess, not calibrated on anything (WORKFLOW_PRIOR).
    Keyword-only, so `Prediction`, which carries these fields after its own, is still built positionally.
    """

    wf_remaining_calls: float = 4.0
    wf_remaining_tokens: float = 400.0
    wf_remaining_calls_upper: int = 32
    wf_remaining_tokens_upper: int = 8000
    wf_fallback_level: WorkflowFallbackLevel = WorkflowFallbackLevel.PRIOR

    def __post_init__(self):
        object.__setattr__(self, "wf_fallback_level", WorkflowFallbackLevel(self.wf_fallback_level))

    def remaining_fields(self) -> dict:
        """The workflow fields alone (of a `Prediction`, too), by name: `Prediction(..., **w.remaining_fields())`."""
        return {name: getattr(self, name) for name in WORKFLOW_FIELDS}

    def to_dict(self) -> dict:
        """The fields as plain JSON values: a prediction's positional ones first, then its size, then the workflow's."""
        ordered = sorted(fields(self), key=lambda f: f.kw_only)  # a stable sort: declaration order otherwise
        return {f.name: _plain(getattr(self, f.name)) for f in ordered}


WORKFLOW_FIELDS = tuple(f.name for f in fields(WorkflowRemaining))
# The answer with no workflow model (a predictor saved before it had one, the client's local fallback).
WORKFLOW_PRIOR = WorkflowRemaining()


def _plain(value):
    return value.value if isinstance(value, StrEnum) else value


@dataclass(frozen=True)
class Prediction(WorkflowRemaining, OutputSize):
    """What the scheduler learns about a stage before it runs.

    Its `OutputSize` (keyword-only): tokens_pred, the point estimate of output tokens, and tokens_reserve, the
    calibrated upper bound to reserve KV for (see `FallbackLevel.is_calibrated`). fallback_level says which level
    answered. history says what the stage's input held of its workflow's past (pipelines/history.py): "full",
    "partial" or "none" (also for a prior, which reads no history); the reserve is calibrated per condition. The
    `wf_*` fields (WorkflowRemaining, keyword-only) are the stage's workflow's remaining work; left out, they are
    WORKFLOW_PRIOR's. Built as `Prediction(workflow_id, stage_id, p_tool, fallback_level, tokens_pred=...,
    tokens_reserve=...)`.
    """

    workflow_id: str
    stage_id: str
    p_tool: float
    fallback_level: FallbackLevel
    history: str = "full"

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "fallback_level", FallbackLevel(self.fallback_level))

    @property
    def is_calibrated(self) -> bool:
        return self.fallback_level.is_calibrated
