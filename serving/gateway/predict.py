"""The predictor as the gateway sees it: start() makes it ready, predict(stages) answers within a deadline,
observe(finished stage) feeds it; every answer says who gave it (`maestro.prediction.Source`) and is counted.

Stages travel as `maestro.contract.StageRow`s, plain dicts with `StageTrace`'s field names, so the event loop
builds no pydantic object. `LocalPredictor` answers in-process: a trained `pipelines.predictor.Predictor` runs
on its own thread (`ModelWorker`), loaded and warmed before the gateway takes calls; without one, its priors
answer. `http_predictor.HttpPredictor` calls predictor_service/ instead; `create_predictor` picks one by name.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time

from maestro.contract import StageRow, StageTrace
from maestro.prediction import Prediction
from maestro.structure import derive_structure
from pipelines.features import StageHistory
from pipelines.predictor import NO_MODEL_PRIOR, Predictor
from predictor_service.client import LocalFallback
from predictor_service.engine import WARMUP_STAGE, promised_miss_rate
from serving.gateway.answers import AnswerCounts, Source, StageAnswer, StagePredictor, observed_row
from serving.gateway.config import PredictorConfig
from serving.gateway.http_predictor import HttpPredictor
from serving.gateway.model_source import load_model
from serving.gateway.model_thread import ModelWorker

log = logging.getLogger(__name__)
# The GIL switch interval while a model thread shares the process with the event loop: a thread waiting for
# the GIL gets it after at most this long (Python's default, 5 ms, is paid at every one of the model's
# GIL hand-backs while the loop is busy: serving/gateway/README.md, "The trained predictor live").
SWITCH_INTERVAL_S = 0.0005


class LocalPredictor:
    """In-process predictor: a trained model on its own thread (`ModelWorker`) within `timeout_s`, else the priors."""

    def __init__(
        self, predictor: Predictor | None = None, timeout_s: float = 0.5, what: str = "local", version: str = ""
    ):
        self.predictor = predictor or Predictor(None, None, {"": NO_MODEL_PRIOR})
        self.version = version  # the model's version (model_source.load_model), "" for none
        self.fallback = LocalFallback(self.predictor.priors)
        self.timeout_s = timeout_s
        self.num_observed = 0
        self.history = StageHistory()  # finished stages: the ancestors of the stages predicted next
        self.counts = AnswerCounts(what)
        self.has_model = self.predictor.model is not None
        # an app training never saw: the model's answer as is, rescaled by the gateway from the app's own finished
        # stages (`Gateway.own_reserves`), as the simulator rescales the same answer
        self.new_app_alpha = promised_miss_rate(self.predictor) if self.has_model else None
        self.worker = ModelWorker(self._parse, self._predict_batch) if self.has_model else None
        self.is_ready = not self.has_model  # a model is ready once start() has warmed it
        self.warmup_s: float | None = None

    @classmethod
    def from_location(cls, location: str, timeout_s: float) -> LocalPredictor:
        if not location:
            return cls(timeout_s=timeout_s)
        predictor, version = load_model(location)
        return cls(predictor, timeout_s=timeout_s, what=f"local model {location}", version=version)

    async def start(self) -> None:
        """Warm the model on its thread (MiniLM and the trees load lazily: seconds) before the first call."""
        if self.worker is None or self.is_ready:
            return
        started = time.monotonic()
        try:
            await asyncio.wrap_future(self.worker.start(self._warm_up))
        except Exception as error:
            raise RuntimeError(
                f"gateway config 'predictor_model': {self.counts.what} failed its warm-up prediction "
                f"({type(error).__name__}: {error}); retrain it or fix the path"
            ) from error
        self.warmup_s = round(time.monotonic() - started, 3)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self.is_ready = True

    def _warm_up(self) -> None:
        featurizer = self.predictor.featurizer
        if featurizer is not None and featurizer.config.use_embedding:
            import torch

            torch.set_num_threads(1)  # one stage's MiniLM pass: more threads only contend with vLLM for cores
        self.predictor.predict([WARMUP_STAGE.model_copy()])

    async def predict(self, stages: list[StageRow]) -> list[StageAnswer]:
        if self.worker is None:
            return self._prior(stages, Source.NO_MODEL)
        if not self.is_ready:
            return self._prior(stages, Source.ERROR, "the model is not warmed up: the gateway was not started")
        deadline_s = time.monotonic() + self.timeout_s
        try:
            answers, done_s = await asyncio.wait_for(self.worker.submit(stages, deadline_s), self.timeout_s)
        except TimeoutError:
            done_s = math.inf
        except Exception as error:  # noqa: BLE001 — any model failure falls back to the priors
            return self._prior(stages, Source.ERROR, f"{type(error).__name__}: {error}")
        if done_s > deadline_s:  # (also where the loop, starved of CPU, got back to this call after the model)
            return self._prior(stages, Source.TIMEOUT, f"no model answer within {self.timeout_s} s", deadline_s)
        self.counts.add(Source.MODEL, len(answers))
        return [StageAnswer(p, Source.MODEL, done_s) for p in answers]

    def _parse(self, stage_dicts: list[StageRow]) -> list[StageTrace]:
        # Order-dependent structure (call_index, depth) is fixed per call, before the model thread batches calls:
        # a stage's features do not depend on whose call it was predicted with (as predictor_service does).
        stages = [StageTrace.model_validate(s) for s in stage_dicts]
        return derive_structure(stages, self.history.known(stages))

    def _predict_batch(self, stages: list[StageTrace]) -> list[Prediction]:
        return self.predictor.predict(stages, self.history)

    def _prior(
        self, stages: list[StageRow], source: Source, cause: str = "", answered_s: float | None = None
    ) -> list[StageAnswer]:
        self.counts.add(source, len(stages), cause)
        return [StageAnswer(self.fallback.predict(s), source, answered_s) for s in stages]

    def observe(self, stage: StageRow) -> None:
        self.num_observed += 1
        if self.has_model:
            try:
                finished = StageTrace.model_validate(observed_row(stage))
                self.history.add([finished])
            except ValueError as error:  # a trace line the contract refuses: its successors lose history only
                log.warning(
                    "finished stage %s/%s not kept for history: %s",
                    stage.get("workflow_id"),
                    stage.get("stage_id"),
                    error,
                )

    async def settled(self) -> None:
        return  # observe() adds to the history at once

    def snapshot(self) -> dict:
        worker = self.worker
        return {
            "kind": "local",
            "model": self.counts.what,
            "version": self.version or None,
            "ready": self.is_ready,
            "warmup_s": self.warmup_s,
            "timeout_s": self.timeout_s,
            **self.counts.snapshot(),
            **(
                {
                    "model_batches": worker.num_batches,
                    "skipped_past_deadline": worker.num_expired,
                    "model_batch_time": worker.time_summary(),
                }
                if worker
                else {}
            ),
        }

    async def aclose(self) -> None:
        if self.worker is not None:
            await asyncio.to_thread(self.worker.stop)


def create_predictor(config: PredictorConfig) -> StagePredictor:
    if config.source == "local":
        return LocalPredictor.from_location(config.model, config.timeout_s)
    if config.source.startswith(("http://", "https://")):
        return HttpPredictor.from_url(config.source, config.model, config.timeout_s, config.startup_timeout_s)
    raise ValueError(f"gateway config predictor.source: expected 'local' or an http(s) URL, got {config.source!r}")
