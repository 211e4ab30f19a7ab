"""The predictor service's one config, read from the environment when the service starts (never at import)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from maestro.keys import read_keys
from predictor_service.online import CorrectionConfig
from predictor_service.tracelog import TraceLogConfig

DEFAULT_MODEL = "models:/stage-length@champion"
DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"  # the project's store (pipelines/registry.py)


@dataclass(frozen=True)
class ServiceConfig:
    model: str = DEFAULT_MODEL
    tracking_uri: str = DEFAULT_TRACKING_URI
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    trace: TraceLogConfig | None = field(default_factory=TraceLogConfig)  # None: observed stages are not kept
    remember_predictions: int = 100_000  # recent answers kept so /observe compares against what was served
    # At start, workflow history is rebuilt from up to this many bytes of the newest trace files (0: start empty),
    # so a restarted replica predicts its workflows' next stages with the history it had observed.
    rebuild_history_bytes: int = 32 << 20
    warmup: bool = True  # predict one stage at load so the first request does not pay for lazy loading
    # /admin/reload needs `Authorization: Bearer <admin_token>`; without a token it is off unless admin_open.
    admin_token: str | None = None
    admin_open: bool = False  # explicit opt-in: admin endpoints open to any caller (a trusted network only)
    model_root: str | None = None  # reload may load directories under this root (else only models:/ URIs)
    api_keys: tuple[str, ...] = ()  # when set, /predict, /observe and /stats need `Authorization: Bearer <key>`
    max_body_bytes: int = 16 * 1024 * 1024  # larger request bodies get 413
    # /predict, /predict_unbatched and /observe calls in flight per worker; more get 503 + Retry-After (0 = no cap)
    max_inflight: int = 64

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError(
                "model must name a predictor: models:/stage-length@champion, models:/stage-length/N "
                "or a directory (MAESTRO_MODEL)"
            )
        if self.rebuild_history_bytes < 0:
            raise ValueError(
                f"rebuild_history_bytes must be ≥ 0 (0 = off), got {self.rebuild_history_bytes} "
                "(MAESTRO_REBUILD_HISTORY_BYTES)"
            )
        if self.remember_predictions < 0:
            raise ValueError(f"remember_predictions must be ≥ 0, got {self.remember_predictions}")
        if self.max_inflight < 0:
            raise ValueError(f"max_inflight must be ≥ 0 (0 = no cap), got {self.max_inflight} (MAESTRO_MAX_INFLIGHT)")
        if self.max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be > 0, got {self.max_body_bytes} (MAESTRO_MAX_BODY_BYTES)")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServiceConfig:
        """MAESTRO_MODEL, MLFLOW_TRACKING_URI, MAESTRO_TRACE_DIR ('off' disables), MAESTRO_TRACE_MAX_BYTES,
        MAESTRO_TRACE_MAX_FILES, MAESTRO_TRACE_MAX_TOTAL_BYTES (retention; 0 keeps all),
        MAESTRO_CORRECTION_{WEIGHT,BOUND,HALF_LIFE_S,MIN_OBSERVATIONS,SIGNIFICANCE,RESERVE_STEP}, MAESTRO_ADMIN_TOKEN,
        MAESTRO_ADMIN_OPEN (1 = admin endpoints without a token), MAESTRO_MODEL_ROOT, MAESTRO_API_KEYS (comma-separated)
        and/or MAESTRO_API_KEYS_FILE (one per line), MAESTRO_MAX_BODY_BYTES, MAESTRO_MAX_INFLIGHT,
        MAESTRO_REBUILD_HISTORY_BYTES."""
        env = os.environ if env is None else env
        trace_dir = env.get("MAESTRO_TRACE_DIR", TraceLogConfig.directory)
        trace = (
            None
            if trace_dir.lower() in ("", "off", "none")
            else TraceLogConfig(
                directory=trace_dir,
                max_bytes=_number(env, "MAESTRO_TRACE_MAX_BYTES", TraceLogConfig.max_bytes, int),
                max_files=_number(env, "MAESTRO_TRACE_MAX_FILES", TraceLogConfig.max_files, int),
                max_total_bytes=_number(env, "MAESTRO_TRACE_MAX_TOTAL_BYTES", TraceLogConfig.max_total_bytes, int),
            )
        )
        base = CorrectionConfig()
        correction = CorrectionConfig(
            weight=_number(env, "MAESTRO_CORRECTION_WEIGHT", base.weight, float),
            bound=_number(env, "MAESTRO_CORRECTION_BOUND", base.bound, float),
            half_life_s=_number(env, "MAESTRO_CORRECTION_HALF_LIFE_S", base.half_life_s, float),
            min_observations=_number(env, "MAESTRO_CORRECTION_MIN_OBSERVATIONS", base.min_observations, int),
            significance=_number(env, "MAESTRO_CORRECTION_SIGNIFICANCE", base.significance, float),
            reserve_step=_number(env, "MAESTRO_CORRECTION_RESERVE_STEP", base.reserve_step, float),
        )
        return cls(
            model=env.get("MAESTRO_MODEL", DEFAULT_MODEL),
            tracking_uri=env.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI),
            correction=correction,
            trace=trace,
            admin_token=env.get("MAESTRO_ADMIN_TOKEN") or None,
            admin_open=env.get("MAESTRO_ADMIN_OPEN", "").lower() in ("1", "true", "yes"),
            model_root=env.get("MAESTRO_MODEL_ROOT") or None,
            api_keys=read_keys(env.get("MAESTRO_API_KEYS"), env.get("MAESTRO_API_KEYS_FILE")),
            max_body_bytes=_number(env, "MAESTRO_MAX_BODY_BYTES", cls.max_body_bytes, int),
            max_inflight=_number(env, "MAESTRO_MAX_INFLIGHT", cls.max_inflight, int),
            rebuild_history_bytes=_number(env, "MAESTRO_REBUILD_HISTORY_BYTES", cls.rebuild_history_bytes, int),
        )


def _number(env: Mapping[str, str], name: str, default, kind):
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a {kind.__name__}") from None
