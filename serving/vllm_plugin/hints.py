"""What a request tells Maestro's vLLM scheduler about itself: its prediction, carried in `extra_args["maestro"]`.

The OpenAI server takes it as `"vllm_xargs": {"maestro": "<JSON object>"}` (vLLM types `vllm_xargs` values as
str | int | float | list, so the object travels as JSON text); offline, `SamplingParams(extra_args={"maestro": {...}})`
may hold the dict itself. Both become `request.sampling_params.extra_args` inside the engine.

Plain Python (no vLLM), so the gateway, the tests and the scheduler share this one definition of the message.
The hints are a `StageRequest` (the scheduler's view of a stage) as the engine reads it, not the predictor's answer
(`maestro.prediction.Prediction`): they are the stage's `OutputSize` as sized for it (serving/core/admission/sizing.py),
so their tokens_reserve is the sized reserve, not the predictor's bound. `hints_for_stage` and `request_from_hints`
convert; maestro/README.md lists the shapes a prediction takes by layer.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from maestro.prediction import OutputSize
from maestro.progressive import UNKNOWN, ProgressiveTable, length_bounds
from serving.core.request import StageRequest

XARGS_KEY = "maestro"


@dataclass(frozen=True, slots=True)
class MaestroHints(OutputSize):
    """One stage's prediction as the engine sees it: its sized `OutputSize` (tokens_pred, and tokens_reserve, the
    output tokens to hold KV for; 0, as the wire may leave it out: tokens_pred), and what the scheduler orders it by.

    `deadline_s` counts seconds from the request's arrival at the engine (vLLM's `arrival_time`), so the sender's and
    the engine's clocks need not agree. `pred_service_s` and `workflow_remaining_s` (the workflow's predicted work
    after this stage) are in the unit of `StageRequest.pred_service_s` (the gateway's predicted seconds); without
    `pred_service_s` the scheduler derives it from `tokens_pred`. `remaining_tool_s`: the tool time the workflow is
    predicted to wait from this stage on (its own tool included), outside the engine, in the unit of `deadline_s`
    (`StageRequest.remaining_tool_s`, the sender's `RemainingWork.tool_ahead_s`); a sender that leaves it out means 0.
    `is_shed`: workflow triage shed the stage's workflow (serving/core/scheduler/triage.py), so it has no deadline and
    queues behind; `final`: the workflow's last stage.
    """

    pred_service_s: float | None = None
    workflow_remaining_s: float = 0.0
    remaining_tool_s: float = 0.0
    deadline_s: float = math.inf
    interactive: bool = False
    workflow: str = ""
    reserve_level: float = 0.95  # the quantile of the output length that tokens_reserve stands at
    is_shed: bool = False
    final: bool = False

    def __post_init__(self):
        if self.tokens_pred < 0 or self.tokens_reserve < 0:
            raise ValueError(f"maestro hints: tokens_pred and tokens_reserve must be >= 0, got {self}")
        if not 0.5 < self.reserve_level < 1:
            raise ValueError(f"maestro hints: reserve_level must be in (0.5, 1), got {self.reserve_level}")
        tool_s = self.remaining_tool_s
        if isinstance(tool_s, bool) or not isinstance(tool_s, int | float) or not 0 <= tool_s < math.inf:
            raise ValueError(
                f"maestro hints: remaining_tool_s must be a finite number of seconds >= 0 (0 where no tool time is "
                f"predicted ahead), got {self.remaining_tool_s!r}"
            )
        if self.tokens_reserve == 0:
            object.__setattr__(self, "tokens_reserve", self.tokens_pred)

    def to_xargs(self) -> dict[str, str]:
        """The `vllm_xargs` field of an OpenAI request that carries these hints."""
        fields = {k: v for k, v in asdict(self).items() if v is not None and v != math.inf}
        return {XARGS_KEY: json.dumps(fields, separators=(",", ":"))}


def hints_from_extra_args(extra_args: dict | None) -> MaestroHints | None:
    """The request's hints, or None when it carries none; ValueError (naming the field) when they are malformed."""
    raw = (extra_args or {}).get(XARGS_KEY)
    if raw is None:
        return None
    try:
        fields = json.loads(raw) if isinstance(raw, str) else dict(raw)
        return MaestroHints(**{"tokens_reserve": 0, **fields})
    except (TypeError, ValueError) as error:
        raise ValueError(f"extra_args[{XARGS_KEY!r}] is not a valid Maestro prediction ({error}): {raw!r}") from None


def request_from_hints(
    request_id: str,
    arrival_s: float,
    num_prompt_tokens: int,
    max_tokens: int,
    hints: MaestroHints,
    decode_s_per_token: float,
) -> StageRequest:
    """The policy's view of a waiting vLLM request (times on the clock of vLLM's `arrival_time`)."""
    pred_service_s = hints.pred_service_s
    if pred_service_s is None:
        pred_service_s = min(max_tokens, hints.tokens_pred) * decode_s_per_token
    return StageRequest(
        workflow_id=hints.workflow or request_id,
        stage_id=request_id,
        interactive=hints.interactive,
        workflow_arrival_s=arrival_s,
        ready_s=arrival_s,
        deadline_s=arrival_s + hints.deadline_s,
        prompt_tokens=num_prompt_tokens,
        size=hints.size,
        max_tokens=max_tokens,
        pred_service_s=pred_service_s,
        workflow_remaining_s=hints.workflow_remaining_s,
        remaining_tool_s=hints.remaining_tool_s,
        is_shed=hints.is_shed,
    )


def hints_for_stage(stage: StageRequest, now_s: float, final: bool = False) -> MaestroHints:
    """The hints a stage is sent to an engine with (the inverse of `request_from_hints`); its deadline counted from
    `now_s`, on the stage's own clock; `final`: the workflow's last stage."""
    return MaestroHints(
        tokens_pred=stage.tokens_pred,
        tokens_reserve=stage.tokens_reserve,
        pred_service_s=stage.pred_service_s,
        workflow_remaining_s=stage.workflow_remaining_s,
        remaining_tool_s=stage.remaining_tool_s,
        deadline_s=stage.deadline_s - now_s,
        interactive=stage.interactive,
        workflow=stage.workflow_id,
        is_shed=stage.is_shed,
        final=final,
    )


def output_bounds(
    num_output_tokens: int, hints: MaestroHints, table: ProgressiveTable | None = None, prefix: str = UNKNOWN
) -> tuple[float, float]:
    """(median, reserve) of the request's output length given that it has produced `num_output_tokens`: the learned
    re-prediction where the plugin has its predictor's `table` (`prefix`: the class of its first output tokens), else
    the prediction read as a log-normal and conditioned on what it produced (`maestro.progressive.length_bounds`)."""
    bounds = length_bounds(
        num_output_tokens, hints.tokens_pred, hints.tokens_reserve, hints.reserve_level, table, prefix
    )
    return bounds.median, bounds.upper


def footprint_tokens(
    num_prompt_tokens: int,
    num_output_tokens: int,
    max_tokens: int,
    hints: MaestroHints,
    table: ProgressiveTable | None = None,
    prefix: str = UNKNOWN,
) -> int:
    """Tokens of KV the request is predicted to hold when it ends: its prompt and its reserve given what it has
    produced (`output_bounds`), never beyond its max_tokens."""
    reserve = output_bounds(num_output_tokens, hints, table, prefix)[1]
    return num_prompt_tokens + min(max_tokens, max(math.ceil(reserve), num_output_tokens))


def remaining_tokens(
    num_output_tokens: int, hints: MaestroHints, table: ProgressiveTable | None = None, prefix: str = UNKNOWN
) -> int:
    """Predicted output tokens still to come: the median given what it has produced, less that."""
    return max(math.ceil(output_bounds(num_output_tokens, hints, table, prefix)[0]) - num_output_tokens, 0)
