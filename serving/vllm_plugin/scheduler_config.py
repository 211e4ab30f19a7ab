"""MaestroScheduler's configuration, from vLLM's `--additional-config '{"maestro_scheduler": {...}}'` (no vLLM here)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from serving.core.scheduler import SchedulerConfig
from serving.core.systems import DEFAULT_SYSTEM, get_system
from serving.gateway.config import SessionsConfig
from serving.gateway.workflows import DECODE_S_PER_TOKEN

CONFIG_KEY = "maestro_scheduler"
VICTIM_RULES = ("remaining", "order")  # victims.py: remaining_ranks, order_ranks
ADMISSIONS = ("hold", "vllm", "adaptive")  # MaestroSchedulerConfig.admission
# "vllm" by measurement (serving/EXPERIMENTS.md, 2026-12-05): on the engine referee neither "hold" nor "adaptive" beat
# it at any rate, and "hold" lost up to 4.8 pp to vLLM's priority fed the deadline where "vllm" tied it or lost 1-2 pp.
DEFAULT_ADMISSION = "vllm"


@dataclass
class MaestroSchedulerConfig:
    # The queue order is the system's (serving/core/systems.py, the gateway's and the simulator's table); `scheduler`
    # sets the policy's knobs, or another policy.
    system: str = DEFAULT_SYSTEM
    scheduler: SchedulerConfig | None = None
    # pred_service_s of a request whose hints do not say: its predicted tokens at the gateway's pace
    decode_s_per_token: float = DECODE_S_PER_TOKEN
    log_period_s: float = 5.0  # at most one decisions line this often (and one when the engine goes idle)
    # The policy's clock. wall: time.time(), vLLM's `arrival_time` clock (the OpenAI server sets it). step: the
    # scheduler's step count, for a caller that gives each request its arrival step as `arrival_time` (a step-clock
    # benchmark: the same inputs then give the same decisions); deadlines and predicted service are then in steps.
    clock: str = "wall"
    # A predicted request held back this long (on the clock above) makes admission drain the running requests for it
    # (wait_bound.py); None: no bound.
    max_hold_s: float | None = 30.0
    # A session's KV across its tool call (session_kv.py), by the system's tool-KV policy: re-prefilling a context
    # costs this much per token (the gateway's figure, on the clock above), and where the policy keeps it until the
    # tool returns, it is held for hold_factor × the predicted tool time (a prediction is a typical time: a tool
    # somewhat slower still finds its context).
    prefill_s_per_token: float = field(default_factory=lambda: SessionsConfig().prefill_s_per_token)
    tool_hold_factor: float = 2.0
    # A running request's re-prediction (progress.py): the predictor directory (or its progressive.json) whose
    # learned table to read; None: the parametric bounds.
    progressive: str | None = None
    # How a predicted request is admitted (admission.py; ADMISSIONS). "hold": it starts only once its predicted
    # footprint fits beside the running ones', so vLLM preempts only a request that outgrew its prediction, and then
    # the one with the most predicted work left. "vllm": it starts whenever vLLM can allocate its prompt, and when a
    # running request cannot grow, vLLM preempts the running request that Maestro's queue order would serve last (its
    # slack counted from its predicted work left). "adaptive": as "vllm", but a request whose footprint does not fit
    # is held back where the re-prefill a preemption would then cost exceeds the wait for room it saves (adaptive.py).
    # None: DEFAULT_ADMISSION, or what `preemptive` says.
    admission: str | None = None
    # The older switch, kept for configs that set it: true is admission "vllm", false "hold".
    preemptive: bool | None = None
    # Which predicted running request vLLM's preemption takes (victims.py): "remaining", the most predicted work left;
    # "order", the last in Maestro's queue order. None: "remaining" under admission "hold", else "order". Set apart
    # from the admission, it tells the engine referee which of the two changes carries an arm's gain.
    victim: str | None = None

    def __post_init__(self):
        try:
            system = get_system(self.system)
        except ValueError as error:
            raise ValueError(f"{CONFIG_KEY}: system: {error}") from None
        if self.scheduler is None:
            self.scheduler = SchedulerConfig(policy=system.scheduler)
        if self.decode_s_per_token <= 0 or self.log_period_s < 0:
            raise ValueError(f"{CONFIG_KEY}: decode_s_per_token must be > 0 and log_period_s >= 0")
        if self.max_hold_s is not None and self.max_hold_s <= 0:
            raise ValueError(f"{CONFIG_KEY}: max_hold_s must be > 0 or null, got {self.max_hold_s}")
        if self.prefill_s_per_token < 0 or self.tool_hold_factor <= 0:
            raise ValueError(f"{CONFIG_KEY}: prefill_s_per_token must be >= 0 and tool_hold_factor > 0")
        self.admission = self._resolved_admission()
        if self.victim not in (None, *VICTIM_RULES):
            raise ValueError(f"{CONFIG_KEY}: victim must be one of {list(VICTIM_RULES)} or null, got {self.victim!r}")
        if self.clock not in ("wall", "step"):
            raise ValueError(f"{CONFIG_KEY}: clock must be 'wall' or 'step', got {self.clock!r}")

    def _resolved_admission(self) -> str:
        """`admission`, or the one `preemptive` names, or the default; a wrong value or a disagreement is refused."""
        if self.preemptive is not None and not isinstance(self.preemptive, bool):
            raise ValueError(f"{CONFIG_KEY}: preemptive must be true, false or null, got {self.preemptive!r}")
        if self.admission not in (None, *ADMISSIONS):
            raise ValueError(
                f"{CONFIG_KEY}: admission must be one of {list(ADMISSIONS)} or null, got {self.admission!r}"
            )
        implied = None if self.preemptive is None else ("vllm" if self.preemptive else "hold")
        if implied is not None and self.admission not in (None, implied):
            raise ValueError(
                f"{CONFIG_KEY}: admission {self.admission!r} and preemptive {self.preemptive} disagree "
                f"(preemptive {self.preemptive} means admission {implied!r}): drop preemptive"
            )
        return self.admission or implied or DEFAULT_ADMISSION

    @property
    def victim_rule(self) -> str:
        """The victim rule in force: `victim`, or the one the admission implies."""
        return self.victim or ("remaining" if self.admission == "hold" else "order")

    @classmethod
    def from_additional_config(cls, additional_config) -> MaestroSchedulerConfig:
        """From vLLM's `additional_config` (a dict, or a platform's own object, which holds nothing for us)."""
        raw = dict(additional_config.get(CONFIG_KEY, {})) if isinstance(additional_config, dict) else {}
        unknown = set(raw) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"{CONFIG_KEY}: unknown keys {sorted(unknown)}; known: {[f.name for f in fields(cls)]}")
        if "scheduler" in raw:
            raw["scheduler"] = SchedulerConfig(**raw["scheduler"])
        return cls(**raw)
