"""Predictions made when a stage becomes ready, from what a live gateway has at that moment.

A stage is predicted from its own request and its finished ancestors' outcomes — the history the gateway's
`StageHistory` holds once their `/observe` has arrived — never from a stage that has not run, nor from its own
outcome. Answers are cached by (stage, finished ancestors): a replay cycles the same workflows many times, and in a
DAG a stage is ready only once every ancestor has finished, so the key repeats and predicting at readiness costs one
predictor call per distinct key. `prewarm` fills the cache in batches with that key; a readiness call computes a
miss on its own.

Sources (the referee's arms): `model` (the trained predictor, sized as the gateway sizes its answers), `prior` (its
per-role priors: median, (1 − α) quantile, × (1 + rho) as the gateway sizes a prior), `none` (one constant for every
stage: the no-model prior), `oracle` (the stage's true length, its reserve the true length × `margin`, the model's
own median reserve ÷ prediction where the referee has a model: the same calibrated margin), `noiseσ` (true ×
exp(ε), ε ~ N(0, σ²) drawn from the stage's key and the seed, so the same stage gets the same draw in every run).

Each source also sets the workflow's remaining work after the stage (`SimStage.remaining`, a `WorkflowRemaining`):
the model's workflow answer; for `prior`, the training side's median at the stage's (app, position) (a
`WorkflowPrior`; 0 where training never saw the cell); nothing (0) for `none`; the truth for `oracle` and the
noise arms (the workflow's stages with a larger call_index: the only reads of a future stage, and only in these arms).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from maestro.own_reserve import UnseenReserve, unseen_reserve
from maestro.prediction import OutputSize, WorkflowFallbackLevel, WorkflowRemaining
from serving.core.admission.sizing import DEFAULT_RHO, is_calibrated, reserve_output_tokens
from serving.sim.workload import SimStage, SimWorkflow, to_contract

SOURCES = ("model", "prior", "none", "oracle", "noise")


def base_id(workflow: SimWorkflow) -> str:
    """The replayed file's workflow id (the same for every copy a replay makes of it)."""
    return workflow.source_id or workflow.workflow_id


def finished_ancestors(stage: SimStage) -> frozenset[str]:
    """Ids of the stage's ancestors whose LLM call has ended (`finished_s`): at readiness, all of them."""
    out, frontier, stages = set(), list(stage.parents), stage.workflow.stages
    while frontier:
        parent = stages[frontier.pop()]
        if parent.stage_id not in out and parent.finished_s >= 0:
            out.add(parent.stage_id)
            frontier.extend(parent.parents)
    return frozenset(out)


class ReadyPredictions:
    """Sets a ready stage's `tokens_pred` / `tokens_reserve` from one source (see the module docstring)."""

    def __init__(
        self,
        source: str,
        model_dir: str | Path | None = None,
        seed: int = 0,
        margin: float = 1.0,
        rho: float = DEFAULT_RHO,
        workflow_prior: WorkflowPrior | None = None,
    ):
        name = "noise" if source.startswith("noise") else source
        if name not in SOURCES:
            raise ValueError(f"unknown prediction source '{source}'; known: {', '.join(SOURCES)} (noise as noiseσ)")
        if name in ("model", "prior") and not model_dir:
            raise ValueError(f"prediction source '{source}' needs a trained predictor (model_dir)")
        self.source, self.name, self.seed, self.margin, self.rho = source, name, seed, margin, rho
        self.sigma = float(source[len("noise") :] or 0.5) if name == "noise" else 0.0
        self.cache: dict[tuple, tuple[int, int, WorkflowRemaining, UnseenReserve | None]] = {}
        self.workflow_prior = workflow_prior
        if name == "prior" and workflow_prior is None:
            raise ValueError("prediction source 'prior' needs the training side's WorkflowPrior")
        self.num_calls = 0
        self._predictor = self._priors = None
        if name == "model":
            from pipelines.predictor import Predictor  # lazily: the trained predictor is optional here

            self._predictor = Predictor.load(model_dir)
        # a running stage's re-prediction: the model's table where it has one, else (and for every other source)
        # the parametric bounds
        self.progressive = self._predictor.progressive if self._predictor is not None else None
        if name in ("prior", "none"):
            from pipelines.predictor import NO_MODEL_PRIOR, Prior

            priors = {}
            if name == "prior":
                priors = {r: Prior(**v) for r, v in json.loads((Path(model_dir) / "priors.json").read_text()).items()}
            self._priors, self._no_model = priors, NO_MODEL_PRIOR

    def __call__(self, stage: SimStage) -> None:
        key = (base_id(stage.workflow), stage.stage_id, finished_ancestors(stage))
        answer = self.cache.get(key)
        if answer is None:
            answer = self.cache[key] = self._answer([stage], [key[2]])[0]
        tokens_pred, tokens_reserve, stage.remaining, stage.unseen_reserve = answer
        stage.size = OutputSize(tokens_pred=tokens_pred, tokens_reserve=tokens_reserve)
        stage.progressive = self.progressive

    def prewarm(self, stages: list[SimStage], batch_size: int = 2048) -> None:
        """Answer every distinct stage once, keyed as at readiness (all its ancestors finished)."""
        todo: dict[tuple, SimStage] = {}
        for stage in stages:
            key = (base_id(stage.workflow), stage.stage_id, all_ancestors(stage))
            if key not in self.cache:
                todo.setdefault(key, stage)
        keys = list(todo)
        for start in range(0, len(keys), batch_size):
            chunk = keys[start : start + batch_size]
            answers = self._answer([todo[k] for k in chunk], [k[2] for k in chunk])
            self.cache.update(zip(chunk, answers))

    def answers_sha256(self) -> str:
        """A digest of the answers held (`answers_digest`): after `prewarm` on a replayed side, which predictor
        answered, whatever directory it was loaded from."""
        return answers_digest(self.cache)

    # --- the sources ---------------------------------------------------------------------------
    def _answer(self, stages: list[SimStage], known: list[frozenset[str]]) -> list[tuple[int, int, WorkflowRemaining]]:
        self.num_calls += len(stages)
        if self.name == "model":
            return self._from_model(stages, known)
        return [(*pair, self._workflow_answer(stage), None) for pair, stage in zip(self._stage_answers(stages), stages)]

    def _workflow_answer(self, stage: SimStage) -> WorkflowRemaining:
        if self.name == "none":
            return NOTHING_LEFT
        if self.name == "prior":
            return self.workflow_prior.lookup(stage)
        return true_remaining(stage)

    def _stage_answers(self, stages: list[SimStage]) -> list[tuple[int, int]]:
        out = []
        for stage in stages:
            if self.name in ("prior", "none"):
                prior = self._priors.get(stage.role) or self._priors.get("") or self._no_model
                pred, reserve, calibrated = round(prior.tokens_median), math.ceil(prior.tokens_upper), False
            else:
                pred = reserve = stage.output_tokens
                if self.name == "noise":
                    pred = stage.output_tokens * math.exp(self.sigma * _normal(stage, self.seed))
                reserve = pred * self.margin
                calibrated = True
            out.append(self._sized(stage, pred, reserve, calibrated))
        return out

    def _sized(self, stage: SimStage, pred: float, reserve: float, calibrated: bool) -> tuple[int, int]:
        tokens_pred = int(min(stage.max_tokens, max(1, round(pred))))
        return tokens_pred, reserve_output_tokens(
            tokens_pred, math.ceil(reserve), stage.max_tokens, is_calibrated=calibrated, rho=self.rho
        )

    def _from_model(self, stages: list[SimStage], known: list[frozenset[str]]) -> list[tuple]:
        """One predictor call for the batch: each stage in a workflow of its own (`@` its index in the batch) that
        holds its finished ancestors as history (`StageHistory`), as the gateway's history holds them live. A NEW_APP
        answer also carries its `UnseenReserve` (rescaled at readiness by the app's own level, `OwnReserveLevels`)."""
        from pipelines.stage_features import StageHistory

        history, rows = StageHistory(max_workflows=len(stages) + 1), []
        for i, (stage, ancestors) in enumerate(zip(stages, known)):
            alias = f"{base_id(stage.workflow)}@{i}"
            finished = [s for s in stage.workflow.stages if s.stage_id in ancestors]
            history.add([labelled(s, alias) for s in finished])
            rows.append(to_contract(stage).model_copy(update={"workflow_id": alias}))
        answers = self._predictor.predict(rows, history)
        alpha = self._predictor.model.config.alpha if self._predictor.model is not None else None
        out = []
        for s, a in zip(stages, answers):
            tokens_pred, reserve = self._sized(s, a.tokens_pred, a.tokens_reserve, is_calibrated(a))
            unseen = unseen_reserve(a.fallback_level, reserve, alpha)
            out.append((tokens_pred, reserve, WorkflowRemaining(**a.remaining_fields()), unseen))
        return out


def answers_digest(cache: dict) -> str:
    """sha256 of a source's answers — each key (workflow, stage, its finished ancestors) with the stage's point, its
    reserve and its workflow's remaining calls and tokens — in key order: two predictors that answer alike digest
    alike, wherever they were trained or loaded from."""
    digest = hashlib.sha256()
    for (workflow, stage, known), (pred, reserve, remaining, _) in sorted(
        cache.items(), key=lambda item: (item[0][0], item[0][1], sorted(item[0][2]))
    ):
        calls = getattr(remaining, "wf_remaining_calls", None)
        tokens = getattr(remaining, "wf_remaining_tokens", None)
        row = [workflow, stage, sorted(known), int(pred), int(reserve), calls, tokens]
        digest.update(json.dumps(row).encode())
    return digest.hexdigest()


def known_remaining(calls: float, tokens: float, level: WorkflowFallbackLevel) -> WorkflowRemaining:
    """A workflow answer with no spread: its upper bound is its median."""
    return WorkflowRemaining(
        wf_remaining_calls=calls,
        wf_remaining_tokens=tokens,
        wf_remaining_calls_upper=math.ceil(calls),
        wf_remaining_tokens_upper=math.ceil(tokens),
        wf_fallback_level=level,
    )


NOTHING_LEFT = known_remaining(0.0, 0.0, WorkflowFallbackLevel.PRIOR)  # the `none` source reads no workflow


def true_remaining(stage: SimStage) -> WorkflowRemaining:
    """The workflow's stages after this one (a larger call_index): how many, and their output tokens."""
    index = (stage.source or {}).get("call_index", stage.index)
    later = [s.output_tokens for s in stage.workflow.stages if (s.source or {}).get("call_index", s.index) > index]
    return known_remaining(float(len(later)), float(sum(later)), WorkflowFallbackLevel.APP)


class WorkflowPrior:
    """The no-model workflow answer: the training side's median remaining calls and tokens at the stage's
    (app, position), 0 where training never saw the cell."""

    def __init__(self, training_stages: list):
        from pipelines.workflow_features import remaining_targets
        from pipelines.workflow_table import AppPositionMedians

        calls, tokens = remaining_targets(training_stages)
        self.table = AppPositionMedians.fit(
            [s.app or "" for s in training_stages],
            [s.call_index for s in training_stages],
            {"calls": calls, "tokens": tokens},
        )

    def lookup(self, stage: SimStage) -> WorkflowRemaining:
        """The cell's medians, at level APP where training saw the cell; else 0 at level POSITION (where the app's
        own ended workflows then answer, `remaining_after_s`)."""
        position = (stage.source or {}).get("call_index", stage.index)
        cell = self.table.cells_.get((stage.workflow.app or "", position))
        if cell is None:
            return known_remaining(0.0, 0.0, WorkflowFallbackLevel.POSITION)
        return known_remaining(*cell, WorkflowFallbackLevel.APP)


def all_ancestors(stage: SimStage) -> frozenset[str]:
    """Every ancestor's id: the finished ancestors of a stage that is ready."""
    out, frontier, stages = set(), list(stage.parents), stage.workflow.stages
    while frontier:
        parent = stages[frontier.pop()]
        if parent.stage_id not in out:
            out.add(parent.stage_id)
            frontier.extend(parent.parents)
    return frozenset(out)


def labelled(stage: SimStage, workflow_id: str):
    """A finished stage as the gateway observes it: its request and its outcome (the trace row's labels)."""
    from maestro.contract import StageTrace

    row = {k: v for k, v in (stage.source or {}).items() if v is not None}
    row.update(workflow_id=workflow_id, output_tokens=stage.output_tokens, is_tool_call=stage.is_tool_call)
    row.setdefault("prompt", "")
    return StageTrace.model_validate(row)


def _normal(stage: SimStage, seed: int) -> float:
    """A standard normal draw fixed by the stage and the seed (not by the order stages are asked in)."""
    digest = hashlib.sha256(f"{seed}:{base_id(stage.workflow)}:{stage.stage_id}".encode()).digest()
    return float(np.random.default_rng(int.from_bytes(digest[:8], "little")).normal())


def reserve_margin(model_dir: str | Path | None, workflows: list[SimWorkflow]) -> float:
    """The trained model's median reserve ÷ prediction over `workflows` — the training side's, never the replayed
    one, whose later stages would otherwise move every oracle reserve: the oracle's and the noise arms' margin."""
    if model_dir is None:
        return 1.0
    model = ReadyPredictions("model", model_dir)
    model.prewarm([s for w in workflows for s in w.stages])
    return float(np.median([reserve / max(1, pred) for pred, reserve, *_ in model.cache.values()]))
