"""The workflow-level predictor: when a stage becomes ready, its workflow's remaining LLM calls and output tokens,
as a median and a calibrated (1 − α) upper bound.

Targets and features: pipelines.workflow_features. Per target, two LightGBM quantile regressors on log(1 + target),
the median and the (1 − α) quantile; the upper one's out-of-fold misses (folds grouped by task) are calibrated by
split conformal per history condition × app, falling back to the condition, then to all rows
(pipelines.calibration), so that at most α of stages exceed it in each. The prompt's tail is read through the
hashed n-grams of pipelines.lexical, scored by ridges fitted to these targets: out of fold for training rows. Training
rows come twice, as they are and, for stages with parents, with every label of the workflow hidden ("none"),
so both history conditions are fitted and calibrated.

Answers are `maestro.prediction.WorkflowRemaining` (the `wf_*` fields every `Prediction` carries). Who answers
(`wf_fallback_level`): "app", the model, for an app seen in training; "position", for an app training never saw (or
too little data for a model), the per-position table over all apps (PositionTable: no coverage promise for an app
it never saw); "prior", with no model at all, maestro.prediction.WORKFLOW_PRIOR.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field, replace

import lightgbm as lgb
import numpy as np
from sklearn.model_selection import GroupKFold

from maestro.contract import StageTrace, parse_record, task_id
from maestro.prediction import WorkflowFallbackLevel, WorkflowRemaining
from maestro.structure import derive_structure
from pipelines.batch_features import StageInputs
from pipelines.boosters import RowPredictor
from pipelines.calibration import calibrate_groups
from pipelines.features import UNKNOWN, StageHistory
from pipelines.history import history_conditions, without_labels
from pipelines.lexical import LexicalConfig
from pipelines.workflow_features import RowEncoder, TailScores, remaining_targets, so_far_columns, workflow_rows
from pipelines.workflow_head import HeadSignal
from pipelines.workflow_store import load_state, save_state
from pipelines.workflow_table import AppPositionMedians, PositionTable

TARGETS = ("calls", "tokens")
MIN_STAGES_FOR_MODEL = 50  # below this (or under 2 tasks) the position table answers every stage


@dataclass(frozen=True)
class WorkflowConfig:
    alpha: float = 0.045  # the share of stages allowed above the upper bound (as params.yaml train.alpha)
    folds: int = 5  # task-grouped folds for the upper bound's out-of-fold misses
    min_group_calibration: int = 100  # rows a (condition, app) group needs for its own conformal level
    min_position_count: int = 20  # stages a position of the fallback table needs (later ones are pooled)
    lexical: bool = True  # the prompt tail's lexical scores fitted to the targets
    position_medians: bool = False  # the per-(app, position) medians and the app's median length as features
    tail_chars: int = 1024  # the prompt's last characters the tail scores read
    head_chars: int = 0  # > 0: the task as the prompt's head shows it, this many characters (pipelines.workflow_head)
    head_counts: bool = True  # with the head: its characters, commas and lines as features too
    head_centred: bool = False  # the head's ridges fitted to the targets less their (app, position) mean
    # the upper bound's conformal levels aim at this share of alpha: new tasks miss more than the training side's
    # task folds show (a workflow's stages miss together, and an app has a few dozen tasks)
    calibration_share: float = 0.75
    # call_index bounds of the position bands the upper bound is also calibrated per (within condition × app);
    # empty: no bands
    calibration_bands: tuple[int, ...] = (3, 10, 25)
    booster: dict = field(
        default_factory=lambda: dict(
            n_estimators=300,
            learning_rate=0.05,
            num_leaves=15,
            min_child_samples=20,
            subsample=0.8,
            subsample_freq=1,
            colsample_bytree=0.8,
        )
    )
    seed: int = 0
    num_threads: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"WorkflowConfig.alpha must be in (0, 0.5), got {self.alpha}")
        if not 0 < self.calibration_share <= 1:
            raise ValueError(f"WorkflowConfig.calibration_share must be in (0, 1], got {self.calibration_share}")
        if self.folds < 2 or self.min_group_calibration < 1 or self.min_position_count < 1:
            raise ValueError(
                f"invalid WorkflowConfig: folds ≥ 2, min_group_calibration ≥ 1 and "
                f"min_position_count ≥ 1 (got {self.folds}, {self.min_group_calibration}, "
                f"{self.min_position_count})"
            )


def as_stages(stages: list) -> list[StageTrace]:
    """Stages as given, or dicts validated by the contract (an error names the field at fault)."""
    return [s if isinstance(s, StageTrace) else parse_record(s) for s in stages]


class WorkflowRemainingModel:
    """fit(stages) → predict(stages, history) → list[WorkflowRemaining]; save(dir) / load(dir)."""

    def __init__(self, config: WorkflowConfig | None = None):
        self.config = config or WorkflowConfig()

    # ---- fitting ------------------------------------------------------------------------
    def fit(self, stages: list[StageTrace], progress: bool = False) -> WorkflowRemainingModel:
        """Fit on finished workflows: every stage labelled (`output_tokens`), whole workflows only."""
        stages = derive_structure(as_stages(stages))
        targets = dict(zip(TARGETS, remaining_targets(stages)))
        self.table_ = PositionTable.fit([s.call_index for s in stages], targets, self.config)
        groups = np.array([task_id(s) for s in stages])
        self.boosters_ = None
        if len(stages) < MIN_STAGES_FOR_MODEL or len(set(groups)) < 2:
            return self
        texts = [s.prompt_text() for s in stages]
        log_targets = np.column_stack([np.log1p(targets[k]) for k in TARGETS])
        self.lexical_ = (
            TailScores(LexicalConfig(tail_chars=self.config.tail_chars, folds=self.config.folds)).fit(
                texts, log_targets, groups
            )
            if self.config.lexical
            else None
        )
        apps, positions = [s.app or UNKNOWN for s in stages], [s.call_index for s in stages]
        self.head_ = HeadSignal.of(self.config)
        head = self.head_.fit([s.prompt for s in stages], log_targets, groups, apps, positions) if self.head_ else None
        self.medians_ = AppPositionMedians.fit(apps, positions, targets) if self.config.position_medians else None
        folds = list(GroupKFold(n_splits=min(self.config.folds, len(set(groups)))).split(stages, groups=groups))
        extra = [
            self.lexical_.oof_ if self.lexical_ is not None else None,
            AppPositionMedians.out_of_fold(apps, positions, targets, folds) if self.medians_ else None,
            head,
        ]
        has_parents = np.array([bool(s.parent_ids) for s in stages])
        hidden = [without_labels(s) for s in stages]
        rows = workflow_rows(stages, texts=texts) + [
            r for r, p in zip(workflow_rows(hidden, texts=texts), has_parents) if p
        ]
        self.encoder_ = RowEncoder().fit(rows)
        copies = np.concatenate([np.arange(len(stages)), np.flatnonzero(has_parents)])
        X = np.column_stack([self.encoder_.matrix(rows), *(e[copies] for e in extra if e is not None)])
        self._fit_boosters(X, {k: np.log1p(v[copies]) for k, v in targets.items()}, groups[copies])
        return self

    def _fit_boosters(self, X: np.ndarray, y_log: dict[str, np.ndarray], groups: np.ndarray) -> None:
        cfg = self.config
        params = {
            "verbosity": -1,
            "seed": cfg.seed,
            "num_threads": cfg.num_threads,
            "objective": "quantile",
            **{k: v for k, v in cfg.booster.items() if k != "n_estimators"},
        }
        rounds, categorical = cfg.booster["n_estimators"], self.encoder_.categorical_indices
        fit = lambda idx, y, q: lgb.train(
            {**params, "alpha": q},
            lgb.Dataset(X[idx], y[idx], categorical_feature=categorical, free_raw_data=False),
            num_boost_round=rounds,
        )
        conditions = self._conditions(X)
        keys = self._keys(X, conditions)
        folds = list(GroupKFold(n_splits=min(cfg.folds, len(set(groups)))).split(X, groups=groups))
        everything = np.arange(len(X))
        self.boosters_, self.levels_ = {}, {}
        for name, y in y_log.items():
            upper_oof = np.zeros(len(X))
            for train, held in folds:
                upper_oof[held] = fit(train, y, 1 - cfg.alpha).predict(X[held])
            self.boosters_[name] = (fit(everything, y, 0.5), fit(everything, y, 1 - cfg.alpha))
            self.levels_[name] = calibrate_groups(
                y - upper_oof, keys, replace(cfg, alpha=cfg.calibration_share * cfg.alpha)
            )

    def _keys(self, X: np.ndarray, conditions: np.ndarray) -> list[np.ndarray]:
        column = lambda name: X[:, self.encoder_.columns_.index(name)]
        return calibration_keys(conditions, column("app"), column("call_index"), self.config.calibration_bands)

    def _conditions(self, X: np.ndarray) -> np.ndarray:
        index = {c: i for i, c in enumerate(self.encoder_.columns_)}
        return history_conditions(lambda c: X[:, index[c]] if c in index else None, len(X))

    # ---- prediction -----------------------------------------------------------------------
    def predict(self, stages: list[StageTrace], history: StageHistory | None = None) -> list[WorkflowRemaining]:
        """Answers for `stages`, in their order (contract stages, or dicts validated as such); their finished
        ancestors come from the same list or from `history` (the finished stages of live workflows)."""
        self._check_fitted()
        stages = as_stages(stages)
        if self.boosters_ is None or not stages:  # the table reads the position alone: no history
            return [self.fallback(s) for s in stages]
        return self.predict_inputs(StageInputs(stages, history))

    def predict_inputs(self, inputs: StageInputs) -> list[WorkflowRemaining]:
        """predict() of stages whose structure, history and prompt-text columns may be made already: the stage
        model's (Predictor.predict makes them once for both)."""
        self._check_fitted()
        stages = inputs.stages
        if self.boosters_ is None or not stages:
            return [self.fallback(s) for s in stages]
        columns = {**inputs.columns, **so_far_columns(stages, inputs.ids)}
        extra = [
            self.lexical_.score(inputs.texts) if self.lexical_ is not None else None,
            self.medians_.lookup([s.app or UNKNOWN for s in stages], [s.call_index for s in stages])
            if self.medians_ is not None
            else None,
            head.columns([s.prompt for s in stages]) if (head := getattr(self, "head_", None)) is not None else None,
        ]
        X = np.column_stack([self.encoder_.columns_matrix(columns, len(stages)), *(e for e in extra if e is not None)])
        out = self.predict_matrix(X, self._conditions(X))
        return [self._answer(s, out, i) for i, s in enumerate(stages)]

    def predict_matrix(self, X: np.ndarray, conditions: np.ndarray) -> dict[str, np.ndarray]:
        """Median and calibrated upper bound of each target for feature rows (the encoder's columns, then the
        tail scores, the position medians and the head's columns where the config asks for them)."""
        keys = self._keys(X, conditions)
        out = {}
        for name, (median, upper) in self._rows.items():
            global_level, groups = self.levels_[name]
            level = np.array([next((groups[k] for k in row if k in groups), global_level) for row in zip(*keys)])
            out[name] = np.maximum(np.expm1(median(X)), 0.0)
            out[f"{name}_upper"] = np.maximum(np.expm1(upper(X) + level), out[name])
        return out

    @property
    def _rows(self) -> dict:
        """The boosters as RowPredictors (one row through LightGBM's single-row C API), made on first use."""
        rows = self.__dict__.get("_row_predictors")
        if rows is None:
            rows = self.__dict__["_row_predictors"] = {
                name: tuple(RowPredictor(b) for b in pair) for name, pair in self.boosters_.items()
            }
        return rows

    def use_row_predictors(self, rows: dict) -> None:
        """Answer through these callables (target → (median, upper), each a float64 matrix → predictions, as
        RowPredictor), e.g. the compiled boosters of pipelines.compiled_trees."""
        self.__dict__["_row_predictors"] = rows

    def _answer(self, stage: StageTrace, out: dict, i: int) -> WorkflowRemaining:
        if not self.encoder_.knows("app", stage.app or UNKNOWN):
            return self.fallback(stage)
        return WorkflowRemaining(
            wf_remaining_calls=round(float(out["calls"][i]), 2),
            wf_remaining_tokens=round(float(out["tokens"][i]), 1),
            wf_remaining_calls_upper=int(np.ceil(out["calls_upper"][i] - 1e-9)),
            wf_remaining_tokens_upper=int(np.ceil(out["tokens_upper"][i] - 1e-9)),
            wf_fallback_level=WorkflowFallbackLevel.APP,
        )

    def fallback(self, stage: StageTrace) -> WorkflowRemaining:
        """The per-position table's answer, read from the stage's call_index alone (no history, no model): for an
        app training never saw, and where the model cannot answer."""
        self._check_fitted()
        calls, tokens = self.table_.lookup(stage.call_index or 0)
        return WorkflowRemaining(
            wf_remaining_calls=calls.median,
            wf_remaining_tokens=tokens.median,
            wf_remaining_calls_upper=int(np.ceil(calls.upper)),
            wf_remaining_tokens_upper=int(np.ceil(tokens.upper)),
            wf_fallback_level=WorkflowFallbackLevel.POSITION,
        )

    def _check_fitted(self) -> None:
        if not hasattr(self, "table_"):
            raise RuntimeError("WorkflowRemainingModel is not fitted: call fit() or load() first")

    # ---- persistence ------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_row_predictors"}

    def save(self, directory) -> None:
        """Into a predictor's model directory, beside the stage model (pipelines.workflow_store's files)."""
        if not hasattr(self, "table_"):
            raise RuntimeError("WorkflowRemainingModel is not fitted: nothing to save")
        save_state(self, directory, {"config": asdict(self.config), "has_model": self.boosters_ is not None})

    @classmethod
    def load(cls, directory) -> WorkflowRemainingModel:
        """What save() wrote, checked against its recorded checksum before it is unpickled."""
        model = load_state(directory)
        if not isinstance(model, cls):
            raise TypeError(f"{directory} holds a {type(model).__name__}, not a WorkflowRemainingModel")
        return model


def calibration_keys(
    conditions: np.ndarray, apps: np.ndarray, positions: np.ndarray | None = None, bands: tuple[int, ...] = ()
) -> list[np.ndarray]:
    """Conformal groups from most to least specific: history condition × app × position band (where `bands`
    are given: call_index below each bound, then beyond the last), condition × app, then the condition."""
    by_app = [f"{c}|app={'-' if a != a else int(a)}" for c, a in zip(conditions, apps.tolist())]
    keys = [by_app, [str(c) for c in conditions]]
    if bands and positions is not None:  # a missing position counts as 0
        band = [bisect.bisect_right(bands, 0.0 if p != p else p) for p in positions.tolist()]
        keys.insert(0, [f"{k}|band={b}" for k, b in zip(by_app, band)])
    return [np.array(k, dtype=object) for k in keys]
