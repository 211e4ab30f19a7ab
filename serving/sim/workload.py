"""Workflows the simulator replays: DAGs of stages with true lengths, tool times and predictions.

Built from the workload catalog (pipelines.synth.WorkflowGenerator) or from any stage-trace file in
the contract. Prompt length is len(prompt text)/4 tokens; a stage that follows its own role's tool
call continues that session, so its prompt extends the parent's context (KV that may be kept).
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from maestro.contract import StageTrace, prompt_text
from maestro.prediction import NO_SIZE, OutputSize, WorkflowRemaining
from pipelines.catalog import APPS
from pipelines.synth import MAX_TOKENS, WorkflowGenerator

DEFAULT_SLO_S = {True: 30.0, False: 600.0}  # for trace apps the catalog does not know


@dataclass(eq=False, slots=True)
class SimStage:
    """A simulated stage: its place in its workflow, its true outcome, what is predicted of it and its runtime state.

    `size` is its output as sized for it (serving/sim/predictions.py sets it, through serving/core/admission/sizing.py);
    `tokens_pred` and `tokens_reserve` read it.
    """

    workflow: SimWorkflow
    index: int
    stage_id: str
    role: str
    model: str
    parents: list[int]
    output_tokens: int
    is_tool_call: bool
    tool_name: str = ""
    tool_exec_s: float = 0.0
    prompt_tokens: int = 0
    session_parent: int = -1  # parent whose context this stage extends (tool loop), else -1
    max_tokens: int = MAX_TOKENS
    source: dict | None = None  # the contract row it came from (what a predictor may see)
    size: OutputSize = NO_SIZE
    remaining: WorkflowRemaining | None = None  # its workflow's remaining work, predicted at readiness
    progressive: object = None  # its predictor's `maestro.progressive.ProgressiveTable`, set at readiness
    unseen_reserve: object = None  # its reserve's `UnseenReserve` where answered for an unseen app, set at readiness
    children: list[int] = field(default_factory=list)
    # Runtime state, owned by the engine.
    num_parents_left: int = 0
    generated_tokens: int = 0
    ready_s: float = -1.0
    first_start_s: float = -1.0
    queue_wait_s: float = 0.0
    peak_pages: int = 0
    maxlen_pages: int = 0
    node: object = None
    request: object = None
    reservation: object = None
    epoch: int = 0
    v_start: float = 0.0
    start_s: float = 0.0
    tool_submit_s: float = 0.0
    finished_s: float = -1.0  # when its LLM call ended (its outcome known to a live gateway)
    is_oom: bool = False

    @property
    def tokens_pred(self) -> int:
        return self.size.tokens_pred

    @property
    def tokens_reserve(self) -> int:
        return self.size.tokens_reserve


@dataclass(eq=False, slots=True)
class SimWorkflow:
    workflow_id: str
    app: str
    interactive: bool
    slo_s: float
    arrival_s: float = 0.0
    stages: list[SimStage] = field(default_factory=list)
    num_stages_left: int = 0
    num_ready: int = 0  # stages made ready so far (the position of the next one)
    done_s: float = -1.0
    is_dropped: bool = False
    attained_service_s: float = 0.0
    session_node: object = None  # the node whose AIMD window slot the session holds now
    source_id: str = ""  # the replayed file's workflow id (a replay's copies are suffixed `#pass`)


def _link(workflow: SimWorkflow, rows: list[dict]) -> SimWorkflow:
    by_id = {str(r["stage_id"]): i for i, r in enumerate(rows)}
    for i, row in enumerate(rows):
        parents = [by_id[str(p)] for p in row.get("parent_ids") or [] if str(p) in by_id]
        tools = row.get("tool_names") or []
        max_tokens = declared_max_tokens(row)
        output_tokens = min(int(row.get("output_tokens") or 1), max_tokens)
        stage = SimStage(
            workflow,
            i,
            str(row["stage_id"]),
            row.get("role", "unknown"),
            row["model"],
            parents,
            output_tokens,
            bool(row.get("is_tool_call")),
            tool_name=str(tools[0]) if tools else "tool",
            tool_exec_s=float(row.get("tool_exec_s") or 0.0),
            prompt_tokens=max(1, int(row.get("prompt_tokens") or len(prompt_text(row["prompt"])) // 4)),
            max_tokens=max_tokens,
        )
        stage.source = row
        if len(parents) == 1 and rows[parents[0]].get("is_tool_call") and rows[parents[0]].get("role") == stage.role:
            stage.session_parent = parents[0]
        workflow.stages.append(stage)
    for stage in workflow.stages:
        for p in stage.parents:
            workflow.stages[p].children.append(stage.index)
    workflow.num_stages_left = len(workflow.stages)
    return workflow


def declared_max_tokens(row: dict) -> int:
    """The output cap the stage's request is sent with: the trace's own `max_tokens` where it declares one, else the
    default cap. Never the recorded length: a stage whose recorded output is longer is replayed truncated to its cap
    (it ends by length there, as that request would)."""
    declared = row.get("max_tokens")
    if declared is None:
        return MAX_TOKENS
    if isinstance(declared, bool) or not isinstance(declared, (int, float)) or declared < 1:
        raise ValueError(
            f"stage {row.get('stage_id')!r} of workflow {row.get('workflow_id')!r}: max_tokens must be a positive "
            f"number of tokens, got {declared!r}; fix the trace row or leave the field out (default {MAX_TOKENS})"
        )
    return int(declared)


def _pick_tool(row: dict, rng: np.random.Generator) -> None:
    # synth writes the tool's JSON as output_text: {"name": ...}; keep the name that actually ran.
    text = row.get("output_text") or ""
    if row.get("is_tool_call") and '"name": "' in text:
        row["tool_names"] = [text.split('"name": "', 1)[1].split('"', 1)[0]]


def catalog_workflows(
    num_workflows: int, seed: int, apps: dict[str, float] | None = None, model_override: str | None = None
) -> list[SimWorkflow]:
    """Draw workflows from the catalog; `apps` maps app name → weight (default: all apps equally)."""
    rng = np.random.default_rng(seed)
    names = sorted(apps or APPS)
    weights = np.array([(apps or {}).get(n, 1.0) for n in names], dtype=float)
    picks = rng.choice(len(names), size=num_workflows, p=weights / weights.sum())
    workflows = []
    for index, pick in enumerate(picks):
        app = APPS[names[pick]]
        rows = WorkflowGenerator(app, rng, index).run()
        for row in rows:
            _pick_tool(row, rng)
            if model_override:
                row["model"] = model_override
        workflows.append(_link(SimWorkflow(rows[0]["workflow_id"], app.name, app.interactive, app.slo_s), rows))
    return workflows


def trace_workflows(
    stages: list[StageTrace], default_model: str, num_workflows: int | None = None, seed: int = 0
) -> list[SimWorkflow]:
    """Group contract stages into workflows (their DAGs, roles, prompts and real output lengths).

    With `num_workflows`, the file's workflows are replayed that many times in all: each pass over
    them in a fresh seeded order, a copy's id suffixed `#pass`.
    """
    groups: dict[str, list[dict]] = {}
    for stage in stages:
        if stage.output_tokens is None:
            continue
        row = stage.model_dump()
        row["model"] = row.get("model") or default_model
        groups.setdefault(stage.workflow_id, []).append(row)
    ids = list(groups)
    if num_workflows is None:
        return [_trace_workflow(wid, groups[wid]) for wid in ids]
    rng = np.random.default_rng(seed)
    order = [(p, ids[i]) for p in range(-(-num_workflows // max(1, len(ids)))) for i in rng.permutation(len(ids))]
    return [_trace_workflow(f"{wid}#{p}" if p else wid, groups[wid]) for p, wid in order[:num_workflows]]


def _trace_workflow(workflow_id: str, rows: list[dict]) -> SimWorkflow:
    app = APPS.get(rows[0].get("app") or "")
    interactive = bool(rows[0].get("interactive")) if app is None else app.interactive
    slo = app.slo_s if app else DEFAULT_SLO_S[interactive]
    workflow = SimWorkflow(
        workflow_id, rows[0].get("app") or "trace", interactive, slo, source_id=str(rows[0]["workflow_id"])
    )
    return _link(workflow, rows)


def map_models(
    workflows: list[SimWorkflow], known: set[str] | dict, default_model: str, model_map: dict[str, str] | None = None
) -> None:
    """Give every stage a model with a cost profile.

    A known name stays; a name in `model_map` becomes its profile; any other name becomes
    `default_model`, with one warning per name (how many stages, and how to map it).
    """
    model_map = dict(model_map or {})
    check_model_map(model_map, known)
    unknown: Counter = Counter()
    for stage in (s for w in workflows for s in w.stages):
        if stage.model in known:
            continue
        if stage.model not in model_map:
            unknown[stage.model] += 1
        stage.model = model_map.get(stage.model, default_model)
    for name, count in unknown.items():
        warnings.warn(
            f"no cost profile for model '{name}' ({count} stages): simulated as '{default_model}'; "
            f"map it with --model-map '{name}=PROFILE' (known: {', '.join(known)})",
            stacklevel=2,
        )


def check_model_map(model_map: dict[str, str], known: set[str] | dict) -> None:
    """Every profile a --model-map entry names must exist."""
    for name, profile in model_map.items():
        if profile not in known:
            raise ValueError(f"--model-map {name}={profile}: no cost profile '{profile}'; known: {', '.join(known)}")


def add_context(
    workflows: list[SimWorkflow],
    context_tokens: float,
    tool_result_tokens: float,
    seed: int,
    max_context_tokens: int = 131072,
) -> None:
    """Give agent loops a repository context and tool outputs (the mars-swe context-length regimes).

    The first stage of a session gets LogNormal(mean=context_tokens, σ=0.5) tokens of context;
    each tool loop round adds the parent's output plus LogNormal(mean=tool_result_tokens, σ=0.7).
    The draws are fixed by (seed, workflow id): a workflow grows the same wherever it is replayed.
    """
    for workflow in workflows:
        rng = np.random.default_rng([seed, zlib.crc32(workflow.workflow_id.encode())])
        for stage in workflow.stages:
            if stage.session_parent >= 0:
                parent = workflow.stages[stage.session_parent]
                grown = parent.prompt_tokens + parent.output_tokens + _lognormal(rng, tool_result_tokens, 0.7)
                stage.prompt_tokens = int(min(max_context_tokens - stage.max_tokens, grown))
            else:
                stage.prompt_tokens = int(
                    min(max_context_tokens // 2, stage.prompt_tokens + _lognormal(rng, context_tokens, 0.5))
                )


def _lognormal(rng: np.random.Generator, mean: float, sigma: float) -> float:
    return float(rng.lognormal(math.log(max(mean, 1.0)) - sigma * sigma / 2, sigma)) if mean > 0 else 0.0


LABELS = ("output_tokens", "is_tool_call", "output_text", "finish_reason", "tool_exec_s", "e2e_s", "ttft_s")


def to_contract(stage: SimStage) -> StageTrace:
    """The contract view of a stage before it runs (labels removed), for the trained predictor."""
    row = {k: v for k, v in (stage.source or {}).items() if k not in LABELS and v is not None}
    row.setdefault("prompt", "")
    return StageTrace.model_validate(row)


def reset(workflows: list[SimWorkflow]) -> None:
    """Clear runtime state so the same workload can be replayed under another policy."""
    for workflow in workflows:
        workflow.num_stages_left, workflow.done_s, workflow.is_dropped = len(workflow.stages), -1.0, False
        workflow.attained_service_s, workflow.session_node, workflow.num_ready = 0.0, None, 0
        for s in workflow.stages:
            s.num_parents_left, s.generated_tokens, s.ready_s, s.first_start_s = len(s.parents), 0, -1.0, -1.0
            s.queue_wait_s, s.peak_pages, s.maxlen_pages, s.node, s.request, s.reservation = 0.0, 0, 0, None, None, None
            s.epoch, s.v_start, s.start_s, s.tool_submit_s, s.is_oom = 0, 0.0, 0.0, 0.0, False
            s.finished_s, s.remaining = -1.0, None
