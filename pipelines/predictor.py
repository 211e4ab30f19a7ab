"""The stage-length predictor as used at run time: one loader, shared by CLI, service, simulator and tests."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import joblib
import numpy as np
import pandas as pd

from maestro.contract import StageTrace
from maestro.prediction import WORKFLOW_PRIOR, FallbackLevel, Prediction, WorkflowRemaining
from maestro.progressive import TABLE_FILE, ProgressiveTable, load_table
from pipelines import compiled_trees, row_walker

# ArtifactMismatch: what load() raises on changed files, importable with the loader
from pipelines.artifact import WORKFLOW_DIR, ArtifactMismatch, artifact_digest, verify_artifact  # noqa: F401
from pipelines.batch_features import StageInputs
from pipelines.features import UNKNOWN, Featurizer, FeaturizerConfig, StageHistory
from pipelines.model import ModelConfig, TwoStageModel
from pipelines.new_app import NewAppLevels, fit_new_app_levels, model_frame, new_app_reserves

# The priors (pipelines/priors.py) and the training frames (pipelines/training_frames.py) were defined here: still
# importable from here, for the code that imports them so and for a pickle that names pipelines.predictor.Prior
from pipelines.priors import NO_MODEL_PRIOR, Prior, fit_priors  # noqa: F401
from pipelines.progressive import ProgressiveConfig, fit_for
from pipelines.training_frames import evaluation_frame, label_frame, select_stages, training_frame  # noqa: F401
from pipelines.workflow_remaining import WorkflowConfig, WorkflowRemainingModel

MIN_STAGES_FOR_MODEL = 50  # below this a LightGBM fit is noise: answer from the priors only

RUN_TIMES = ("train_seconds",)  # meta keys that time a run: not saved (without_run_times)


class Predictor:
    """Featurizer + two-stage model + priors, and the workflow-level model; predicts for any contract stages,
    labelled or not."""

    def __init__(
        self,
        featurizer: Featurizer | None,
        model: TwoStageModel | None,
        priors: dict[str, Prior],
        meta: dict | None = None,
        new_app: NewAppLevels | None = None,
        workflow: WorkflowRemainingModel | None = None,
        progressive: ProgressiveTable | None = None,
    ):
        self.featurizer, self.model, self.priors, self.new_app = featurizer, model, priors, new_app
        self.workflow = workflow  # None: every answer's workflow fields are WORKFLOW_PRIOR
        self.progressive = progressive  # None: a running stage is re-predicted by the parametric bounds
        self.meta = meta or {}

    @classmethod
    def train(
        cls,
        stages: list[StageTrace],
        featurizer_config: FeaturizerConfig | None = None,
        model_config: ModelConfig | None = None,
        progress: bool = False,
        workflow_config: WorkflowConfig | None = None,
    ) -> Predictor:
        """Fit featurizer, model and priors, and the workflow-level model, on the labelled stages among `stages`."""
        labelled = [s for s in stages if s.is_labelled and s.is_tool_call is not None]
        if not labelled:
            raise ValueError("no labelled stages: training needs output_tokens and is_tool_call on each stage")
        labels = label_frame(labelled)
        if len(labelled) < MIN_STAGES_FOR_MODEL:
            predictor = cls.fit(None, None, labels, model_config)
        else:
            featurizer = Featurizer(featurizer_config).fit(labelled, progress=progress)
            seed = model_config.seed if model_config is not None else 0
            predictor = cls.fit(featurizer, *training_frame(featurizer, labelled, seed, progress), model_config)
        return predictor.fit_workflow(labelled, workflow_config).fit_progressive(labelled)

    def fit_workflow(self, stages: list[StageTrace], config: WorkflowConfig | None = None) -> Predictor:
        """Fit the workflow-level model on finished, labelled workflows (the stage model's training stages) and keep
        it: predict() answers the `wf_*` fields from it. The DVC train stage calls it after fit()."""
        started = time.perf_counter()
        self.workflow = WorkflowRemainingModel(config).fit(stages)
        self.meta["workflow"] = {
            "model": "boosters" if self.workflow.boosters_ is not None else "position-table",
            "num_train_stages": len(stages),
            "train_seconds": round(time.perf_counter() - started, 2),
        }
        return self

    def fit_progressive(self, stages: list[StageTrace], config: ProgressiveConfig | None = None) -> Predictor:
        """Fit the progressive re-predictor (pipelines/progressive.py) on the stage model's training stages, in its
        training order, and keep it: saved as progressive.json. Stages without an output_text leave it unfitted."""
        if any(s.output_text for s in stages):
            self.progressive, self.meta["progressive"] = fit_for(self, stages, config)
        return self

    @classmethod
    def fit(
        cls,
        featurizer: Featurizer | None,
        X: pd.DataFrame | None,
        labels: pd.DataFrame,
        model_config: ModelConfig | None = None,
        model: TwoStageModel | None = None,
    ) -> Predictor:
        """Fit model and priors on a feature frame (the DVC train stage starts here); `labels` may carry
        the history copies of training_frame (`copy`, `calibrate_only`). `model`: an unfitted TwoStageModel
        (a subclass) to fit instead of TwoStageModel(model_config)."""
        model_config = model.config if model is not None else model_config or ModelConfig()
        stages = labels[labels["copy"].eq("full")] if "copy" in labels else labels
        priors = fit_priors(stages, model_config.alpha)
        meta = {"num_train_stages": len(stages), "num_train_rows": len(labels), "alpha": model_config.alpha}
        if featurizer is None or len(stages) < MIN_STAGES_FOR_MODEL:
            return cls(None, None, priors, {**meta, "model": "priors-only"})
        model = (model or TwoStageModel(model_config)).fit(
            model_frame(X),
            labels["tokens"].to_numpy(),
            labels["is_tool"].to_numpy(),
            labels["group"].to_numpy(),
            labels.get("calibrate_only"),
        )
        new_app = fit_new_app_levels(model, X, labels)
        meta = {**meta, "model": "two-stage", **({"new_app": new_app.describe()} if new_app else {})}
        return cls(featurizer, model, priors, meta, new_app)

    def predict(self, stages: list[StageTrace], history: StageHistory | None = None) -> list[Prediction]:
        """Answers for `stages`; their ancestors' outcomes come from the same list or from `history`."""
        if not stages:
            return []
        inputs = StageInputs(stages, history)  # structure, history and text: made once for both models
        remaining = self.remaining(inputs)
        if self.model is None:
            return [
                self.priors.get(s.role, self.priors[""]).answer(s.workflow_id, s.stage_id, w)
                for s, w in zip(stages, remaining)
            ]
        names, columns = self.model.feature_names, self.read_columns
        matrix, roles = self.featurizer.inputs_matrix(inputs, columns)
        out = self.model.predict_matrix(matrix[:, : len(names)] if len(columns) > len(names) else matrix, roles)
        apps = self.featurizer.categories_["app"]
        is_new = np.array([s.app is not None and (s.app not in apps or s.app == UNKNOWN) for s in stages])
        if self.new_app is not None and is_new.any():
            reserve = out["tokens_reserve"].copy()
            reserve[is_new] = new_app_reserves(self.new_app, matrix, columns, out, is_new)
            out = {**out, "tokens_reserve": reserve}
        return [self._answer(s, out, i, is_new[i], remaining[i]) for i, s in enumerate(stages)]

    def remaining(self, inputs: StageInputs) -> list[WorkflowRemaining]:
        """The workflow fields of each stage's answer: the workflow model's, WORKFLOW_PRIOR where there is none."""
        if self.workflow is None:
            return [WORKFLOW_PRIOR] * len(inputs.stages)
        return self.workflow.predict_inputs(inputs)

    @property
    def read_columns(self) -> list[str]:
        """The featurizer's columns a prediction reads: the model's, then the new-app bound's others."""
        columns = self.__dict__.get("_read_columns")
        if columns is None:  # asked on every live call
            names = self.model.feature_names
            extra = [c for c in self.new_app.columns if c not in set(names)] if self.new_app is not None else []
            columns = self.__dict__["_read_columns"] = names + extra
        return columns

    def _answer(
        self, stage: StageTrace, out: dict, i: int, is_new_app: bool, remaining: WorkflowRemaining
    ) -> Prediction:
        level = (
            FallbackLevel.NEW_APP
            if is_new_app
            else FallbackLevel.ROLE
            if self.featurizer.known_role(stage.role)
            else FallbackLevel.GLOBAL
        )
        return Prediction(
            stage.workflow_id,
            stage.stage_id,
            round(float(out["p_tool"][i]), 4),
            level,
            str(out["history"][i]),
            tokens_pred=int(round(out["tokens_pred"][i])),
            tokens_reserve=int(np.ceil(out["tokens_reserve"][i])),
            **remaining.remaining_fields(),
        )

    def prior(self, stage: StageTrace) -> Prediction:
        """The answer without a model (also where the model failed on the stage): the role's empirical quantiles,
        else the global ones; the workflow fields from the workflow model's per-position table, which reads the
        stage's position alone, else WORKFLOW_PRIOR."""
        remaining = self.workflow.fallback(stage) if self.workflow is not None else WORKFLOW_PRIOR
        return self.priors.get(stage.role, self.priors[""]).answer(stage.workflow_id, stage.stage_id, remaining)

    # ---- persistence ------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = self.featurizer.state() if self.featurizer is not None else None
        joblib.dump({"featurizer": state, "model": self.model, "new_app": self.new_app}, directory / "predictor.joblib")
        (directory / "priors.json").write_text(json.dumps({k: asdict(v) for k, v in self.priors.items()}, indent=1))
        shutil.rmtree(directory / WORKFLOW_DIR, ignore_errors=True)  # an earlier save's
        if self.workflow is not None:
            self.workflow.save(directory / WORKFLOW_DIR)
        (directory / TABLE_FILE).unlink(missing_ok=True)  # an earlier save's
        if self.progressive is not None:
            (directory / TABLE_FILE).write_text(self.progressive.to_json())
        meta = {**self.meta, "artifact_sha256": artifact_digest(directory)}
        shutil.rmtree(directory / compiled_trees.DIRECTORY, ignore_errors=True)  # a library of an earlier save
        if self.model is not None and getattr(self.model.config, "compile_trees", False):
            boosters = {**compiled_trees.model_boosters(self.model), **compiled_trees.workflow_boosters(self.workflow)}
            manifest = compiled_trees.compile_boosters(
                boosters, directory / compiled_trees.DIRECTORY, meta["artifact_sha256"]
            )
            meta["compiled_trees"] = {k: manifest[k] for k in ("compile_s", "tl2cgen", "treelite", "machine")}
        if self.model is not None and getattr(self.model.config, "row_walker", False):
            row_walker.save(self.model, self.workflow, directory / row_walker.DIRECTORY, meta["artifact_sha256"])
        else:
            shutil.rmtree(directory / row_walker.DIRECTORY, ignore_errors=True)  # an earlier save's
        (directory / "meta.json").write_text(json.dumps(without_run_times(meta), indent=1, default=str))
        return directory

    @classmethod
    def load(
        cls, location: str | Path, expected_sha256: str | None = None, require_checksum: bool = False
    ) -> Predictor:
        """Load from a directory written by save(), or an MLflow URI such as models:/stage-length@champion.

        The files are checked against `expected_sha256` and the checksum save() recorded before
        anything is unpickled; a mismatch raises ArtifactMismatch. A directory saved before predictors had a
        workflow model (no `workflow/`) loads without one: its answers carry WORKFLOW_PRIOR; one without
        progressive.json, without a progressive table (runtimes then re-predict by the parametric bounds)."""
        directory = _resolve(str(location))
        digest = verify_artifact(directory, expected_sha256, require_checksum)
        state = joblib.load(directory / "predictor.joblib")
        featurizer = Featurizer.from_state(state["featurizer"]) if state["featurizer"] is not None else None
        priors = {k: Prior(**v) for k, v in json.loads((directory / "priors.json").read_text()).items()}
        meta = json.loads((directory / "meta.json").read_text())
        has_workflow = (directory / WORKFLOW_DIR).exists()
        workflow = WorkflowRemainingModel.load(directory / WORKFLOW_DIR) if has_workflow else None
        if state["model"] is not None:  # the compiled boosters saved beside it, where usable on this machine
            compiled_trees.attach(state["model"], directory / compiled_trees.DIRECTORY, digest, workflow)
            row_walker.attach(state["model"], workflow, directory / row_walker.DIRECTORY, digest)
        return cls(featurizer, state["model"], priors, meta, state.get("new_app"), workflow, load_table(directory))


def without_run_times(meta: dict) -> dict:
    """The meta a predictor is saved with: all but how long this run took (RUN_TIMES, kept in memory and printed), so
    the same inputs save the same bytes and `dvc repro` on them leaves dvc.lock as it was."""
    return {k: without_run_times(v) if isinstance(v, dict) else v for k, v in meta.items() if k not in RUN_TIMES}


def _resolve(location: str) -> Path:
    if location.startswith(("models:/", "runs:/")):
        import mlflow

        local = Path(mlflow.artifacts.download_artifacts(location))
        return local / "artifacts" / "predictor" if (local / "artifacts" / "predictor").exists() else local
    path = Path(location)
    if not (path / "predictor.joblib").exists():
        raise FileNotFoundError(
            f"{path} is not a predictor directory (no predictor.joblib): train one with "
            "`maestro train --traces FILE --out DIR` or `dvc repro`"
        )
    return path
