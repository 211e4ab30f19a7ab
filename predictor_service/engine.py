"""What the service does, without HTTP: predict with the active model, learn from observations, swap models.

The active model, its source and its online correction are one immutable `ActiveModel`; a reload
builds a new one off the request path and replaces the reference in one assignment, so a request
runs start to finish on the model it began with and never sees half a swap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, replace

from maestro.contract import StageTrace
from maestro.keys import ANONYMOUS
from maestro.prediction import FallbackLevel, Prediction, Source
from pipelines.features import StageHistory
from pipelines.predictor import Predictor
from predictor_service import loading
from predictor_service.config import ServiceConfig
from predictor_service.online import OnlineCorrection, coverage_group
from predictor_service.schemas import (
    ObserveResponse,
    PredictionOut,
    ReloadResponse,
    RoleCorrection,
    StatsResponse,
    limits,
)
from predictor_service.tracelog import TraceLog, read_recent

logger = logging.getLogger(__name__)
WARMUP_STAGE = StageTrace(workflow_id="warmup", stage_id="0", role="warmup", prompt="warm up")


@dataclass(frozen=True)
class ActiveModel:
    predictor: Predictor
    source: loading.ModelSource
    loaded_at: float
    corrections: OnlineCorrection


def safe_predict(
    predictor: Predictor, stages: list[StageTrace], history: StageHistory | None = None
) -> list[tuple[Prediction, Source]]:
    """Model answers, or for a stage the model chokes on, its prior (`Source.ERROR_FALLBACK`)."""
    try:
        return [(p, Source.MODEL) for p in predictor.predict(stages, history)]
    except Exception:  # a stage the model cannot handle must not fail the batch it rides in
        if len(stages) == 1:
            logger.exception(
                "prediction failed for stage %s/%s; answered with the prior", stages[0].workflow_id, stages[0].stage_id
            )
            return [(predictor.prior(stages[0]), Source.ERROR_FALLBACK)]
        return [answer for stage in stages for answer in safe_predict(predictor, [stage], history)]


def oof_bias(predictor: Predictor, min_role_rows: int = 20) -> tuple[float, dict[str, float]]:
    """Mean log residual the model had out-of-fold in training, overall and per role with at least
    `min_role_rows` rows: its intended margin, not drift. Models saved without roles: overall only."""
    oof = getattr(predictor.model, "oof_", None)
    if oof is None or len(oof) == 0:
        return 0.0, {}
    residual = oof["log_true"] - oof["log_pred"]
    if "role" not in oof:
        return float(residual.mean()), {}
    by_role = residual.groupby(oof["role"].astype(str)).agg(["mean", "size"])
    return float(residual.mean()), by_role.loc[by_role["size"] >= min_role_rows, "mean"].astype(float).to_dict()


def promised_miss_rate(predictor: Predictor) -> float:
    """The share of stages the model's reserve is calibrated to miss (α), 0.05 for a prior-only predictor."""
    return predictor.model.config.alpha if predictor.model is not None else 0.05


class RecentPredictions:
    """The model's answers served lately, before the online correction, by (workflow_id, stage_id), bounded."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, str], Prediction] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, items: list[tuple[tuple[str, str], Prediction]]) -> None:
        with self._lock:
            self._items.update(items)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def pop(self, key: tuple[str, str]) -> Prediction | None:
        with self._lock:
            return self._items.pop(key, None)


class Counters:
    """Call, fallback and reload counts for /stats."""

    def __init__(self):
        self.lock = threading.Lock()
        self.num_predict_calls = self.num_stages_predicted = self.num_observed = self.num_reloads = 0
        self.fallback_counts: Counter[str] = Counter()
        self.source_counts: Counter[str] = Counter()

    def count_predictions(self, answers: list[PredictionOut]) -> None:
        with self.lock:
            self.num_predict_calls += 1
            self.num_stages_predicted += len(answers)
            self.fallback_counts.update(a.fallback_level for a in answers)
            self.source_counts.update(a.source for a in answers)


class PredictorEngine:
    """The served predictor: predict, observe, reload, stats."""

    def __init__(self, config: ServiceConfig):
        self.config = config
        self.counters = Counters()
        self.trace_log = TraceLog(config.trace) if config.trace else None
        self.started_at = time.time()
        self._recent = RecentPredictions(config.remember_predictions)
        self.history = StageHistory()  # observed stages: the ancestors of the stages predicted next
        if config.trace and config.rebuild_history_bytes:  # after a restart: what this replica had observed
            self.history.add(read_recent(config.trace, config.rebuild_history_bytes))
        self._reload_lock = threading.Lock()
        self.active = self._prepare(config.model, None)

    def _prepare(self, location: str, previous: ActiveModel | None) -> ActiveModel:
        source = loading.resolve(location, self.config.tracking_uri)
        predictor = loading.load(source, self.config.tracking_uri)
        loading.share_embedder(predictor, previous.predictor if previous else None)
        if self.config.warmup:
            safe_predict(predictor, [WARMUP_STAGE])
        baseline, role_baselines = oof_bias(predictor)
        corrections = OnlineCorrection(self.config.correction, baseline, role_baselines, promised_miss_rate(predictor))
        return ActiveModel(predictor, source, time.time(), corrections)

    # ---- predict ------------------------------------------------------------------------
    def predict(self, stages: list[StageTrace]) -> list[PredictionOut]:
        active = self.active  # one read: the whole batch is answered by one model
        raw = safe_predict(active.predictor, stages, self.history)
        self._recent.put([((s.workflow_id, s.stage_id), p) for s, (p, _) in zip(stages, raw)])
        answers = [self._out(p, source, stage, active) for (p, source), stage in zip(raw, stages)]
        self.counters.count_predictions(answers)
        return answers

    @staticmethod
    def _out(p: Prediction, source: Source, stage: StageTrace, active: ActiveModel) -> PredictionOut:
        tokens_pred, tokens_reserve, factor, reserve_factor = active.corrections.apply(
            stage.role,
            p.tokens_pred,
            p.tokens_reserve,
            coverage_group(stage.app, stage.role, p.history),
            p.fallback_level is FallbackLevel.NEW_APP,
        )
        return PredictionOut.of(
            replace(p, tokens_pred=tokens_pred, tokens_reserve=tokens_reserve),
            model_version=active.source.version,
            correction=round(factor, 4),
            reserve_correction=round(reserve_factor, 4),
            source=source,
        )

    # ---- observe ------------------------------------------------------------------------
    def observe(self, stages: list[StageTrace], api_key_id: str = ANONYMOUS) -> ObserveResponse:
        active = self.active
        served = self._served_predictions(stages, active)
        for stage, p in zip(stages, served):
            active.corrections.update(
                stage.role,
                p.tokens_pred,
                stage.output_tokens,
                p.tokens_reserve,
                coverage_group(stage.app, stage.role, p.history),
                p.fallback_level is FallbackLevel.NEW_APP,
            )
        self.history.add(stages)
        if self.trace_log is not None:
            extra = [
                {
                    "served_tokens_pred": p.tokens_pred,
                    "served_tokens_reserve": p.tokens_reserve,
                    "served_model_version": active.source.version,
                    "api_key_id": api_key_id,
                }
                for p in served
            ]
            self.trace_log.append(stages, extra)
        with self.counters.lock:
            self.counters.num_observed += len(stages)
        touched = {s.role for s in stages}
        corrections = {r: RoleCorrection(**c) for r, c in active.corrections.snapshot().items() if r in touched}
        return ObserveResponse(
            num_accepted=len(stages),
            trace_file=self.trace_log.path if self.trace_log else None,
            corrections=corrections,
        )

    def remember(self, stages: list[StageTrace]) -> None:
        """Add finished stages to the workflow history only (a replica's backup copy of another's workflows)."""
        self.history.add(stages)

    def _served_predictions(self, stages: list[StageTrace], active: ActiveModel) -> list[Prediction]:
        """The uncorrected answer each stage got; re-predicted when it was not served here lately."""
        served = [self._recent.pop((s.workflow_id, s.stage_id)) for s in stages]
        missing = [i for i, p in enumerate(served) if p is None]
        if missing:
            unlabelled = [stages[i].model_copy(update={"output_tokens": None, "is_tool_call": None}) for i in missing]
            for i, (p, _) in zip(missing, safe_predict(active.predictor, unlabelled, self.history)):
                served[i] = p
        return served

    # ---- reload -------------------------------------------------------------------------
    def reload(self, location: str) -> ReloadResponse:
        """Load `location` beside the active model, then swap; requests in flight finish on the old one.
        `location` must be a version of the registered model or a directory under the model root."""
        location = loading.check_reload_location(location, self.config.model_root)
        with self._reload_lock:
            previous = self.active
            started = time.perf_counter()
            candidate = self._prepare(location, previous)
            self.active = candidate  # the atomic swap
            with self.counters.lock:
                self.counters.num_reloads += 1
        logger.info(
            "reloaded predictor %s -> %s (%s)", previous.source.version, candidate.source.version, candidate.source.uri
        )
        return ReloadResponse(
            model_version=candidate.source.version,
            previous_version=previous.source.version,
            model_uri=candidate.source.uri,
            load_s=round(time.perf_counter() - started, 3),
        )

    # ---- stats --------------------------------------------------------------------------
    def stats(self) -> StatsResponse:
        active, c = self.active, self.counters
        with c.lock:
            return StatsResponse(
                model_version=active.source.version,
                model_uri=active.source.uri,
                model_loaded_at=active.loaded_at,
                uptime_s=round(time.time() - self.started_at, 3),
                num_predict_calls=c.num_predict_calls,
                num_stages_predicted=c.num_stages_predicted,
                fallback_counts=dict(c.fallback_counts),
                source_counts=dict(c.source_counts),
                num_observed=c.num_observed,
                num_reloads=c.num_reloads,
                corrections={r: RoleCorrection(**v) for r, v in active.corrections.snapshot().items()},
                trace_file=self.trace_log.path if self.trace_log else None,
                limits=limits(),
            )
