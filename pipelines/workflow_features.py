"""What a workflow's remaining work is, and what is known about it when one of its stages becomes ready.

Target, per stage: the workflow's stages with a larger `call_index` (any role: a user simulator's calls count),
and the sum of their output tokens. Features, per stage: the stage model's structure and prompt-text rows
(pipelines.stage_features.stage_rows), plus the workflow so far as its known history shows it.

The known history of a stage is what had surely finished when it became ready: its ancestors (through
`parent_ids`), and, where the trace has times, every stage of the workflow that ended (`arrival_s + e2e_s`) no
later than this one arrived. A stage with a smaller `call_index` that is neither may be a parallel branch still
running, so its outcome is not read. Only stages whose outcome is known (labelled) count: a hidden history (labels
stripped, or a stage sent alone) leaves the history features empty, as it leaves the stage model's.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
from sklearn.linear_model import Ridge
from sklearn.model_selection import GroupKFold

from maestro.contract import StageTrace
from pipelines.boosters import column_matrix
from pipelines.lexical import BucketScores, LexicalConfig, design_matrix
from pipelines.stage_features import ancestors_of, stage_rows

CATEGORICAL = ("role", "app", "model", "last_message_role")
SO_FAR_COLUMNS = (
    "history_calls",
    "history_tool_calls",
    "history_tool_rate",
    "history_tokens_sum",
    "history_tokens_mean",
    "history_tokens_last",
    "history_same_role_calls",
    "history_recent_tool_rate",
    "elapsed_s",
)
RECENT_CALLS = 3  # the last calls whose tool-call rate is read: an agent mid-lookup keeps calling


def remaining_targets(stages: list[StageTrace]) -> tuple[np.ndarray, np.ndarray]:
    """Each stage's remaining calls and remaining output tokens in its workflow (the stages of `stages` with a
    larger call_index). Every stage needs `call_index` (read_traces derives it) and `output_tokens`."""
    by_workflow: dict[str, list[tuple[int, int]]] = {}
    for stage in stages:
        for name in ("call_index", "output_tokens"):
            if getattr(stage, name) is None:
                raise ValueError(
                    f"stage '{stage.stage_id}' of workflow '{stage.workflow_id}' has no '{name}': the "
                    "workflow target needs every stage of a workflow finished and ordered (read the "
                    "file with maestro.contract.read_traces, or leave unfinished workflows out)"
                )
        by_workflow.setdefault(stage.workflow_id, []).append((stage.call_index, stage.output_tokens))
    calls, tokens = np.zeros(len(stages)), np.zeros(len(stages))
    for i, stage in enumerate(stages):
        later = [t for c, t in by_workflow[stage.workflow_id] if c > stage.call_index]
        calls[i], tokens[i] = len(later), sum(later)
    return calls, tokens


def clock_s(stage: StageTrace) -> float | None:
    """When a stage started, in seconds: `arrival_s`, else a producer's ISO-8601 `timestamp` (the tau2 traces')."""
    if stage.arrival_s is not None:
        return stage.arrival_s
    stamp = (stage.model_extra or {}).get("timestamp")
    try:
        return datetime.fromisoformat(str(stamp)).timestamp() if stamp else None
    except ValueError:
        return None


def known_history(stage: StageTrace, ids: dict[tuple[str, str], StageTrace]) -> list[StageTrace]:
    """The finished stages whose outcome a stage could know when it became ready, in call order: its labelled
    ancestors, and labelled stages of its workflow the trace shows ended before it arrived."""
    history = {s.stage_id: s for s in ancestors_of(stage, ids) if s.output_tokens is not None}
    if stage.arrival_s is not None:
        for (workflow, _), other in ids.items():
            if (
                workflow == stage.workflow_id
                and other.output_tokens is not None
                and other.arrival_s is not None
                and other.e2e_s is not None
                and other.arrival_s + other.e2e_s <= stage.arrival_s
                and other.stage_id != stage.stage_id
            ):
                history.setdefault(other.stage_id, other)
    return sorted(history.values(), key=lambda s: s.call_index if s.call_index is not None else -1)


def elapsed_s(stage: StageTrace, history: list[StageTrace]) -> float:
    """Seconds from the workflow's first known start to this stage's arrival (else its last known start)."""
    clocks = [c for c in map(clock_s, history) if c is not None]
    now = stage.arrival_s if stage.arrival_s is not None else max(clocks, default=None)
    return float(now - min(clocks + [now])) if now is not None else np.nan


def so_far_features(stage: StageTrace, history: list[StageTrace]) -> dict:
    """The workflow so far, from the stage's known history (SO_FAR_COLUMNS; NaN where nothing is known)."""
    tokens = [s.output_tokens for s in history]
    tools = [bool(s.is_tool_call) for s in history if s.is_tool_call is not None]
    recent = tools[-RECENT_CALLS:]
    mean = lambda values: sum(values) / len(values) if values else np.nan  # a live call: plain floats
    return {
        "history_calls": len(history),
        "history_tool_calls": float(sum(tools)) if tools else np.nan,
        "history_tool_rate": mean(tools),
        "history_tokens_sum": float(sum(tokens)) if tokens else np.nan,
        "history_tokens_mean": mean(tokens),
        "history_tokens_last": float(tokens[-1]) if tokens else np.nan,
        "history_same_role_calls": sum(s.role == stage.role for s in history),
        "history_recent_tool_rate": mean(recent),
        "elapsed_s": elapsed_s(stage, history),
    }


def workflow_rows(
    stages: list[StageTrace], known: dict[str, dict[str, StageTrace]] | None = None, texts: list[str] | None = None
) -> list[dict]:
    """One dict of features per stage: stage_rows' structure and prompt text, then the workflow so far.
    `known`: finished stages of the same workflows not in `stages` (StageHistory.known); `texts`: the
    stages' prompt_text(), where the caller has them."""
    rows = stage_rows(stages, known, texts)
    ids = {(w, i): s for w, members in (known or {}).items() for i, s in members.items()}
    ids.update({(s.workflow_id, s.stage_id): s for s in stages})
    for row, stage in zip(rows, stages):
        row.update(so_far_features(stage, known_history(stage, ids)))
    return rows


def so_far_columns(stages: list[StageTrace], ids: dict[tuple[str, str], StageTrace]) -> dict[str, list]:
    """so_far_features of each stage as columns (SO_FAR_COLUMNS), its known history read from `ids` (the stages
    and the finished ones of their workflows, by (workflow_id, stage_id): StageInputs.ids)."""
    rows = [so_far_features(stage, known_history(stage, ids)) for stage in stages]
    return {name: [row[name] for row in rows] for name in SO_FAR_COLUMNS}


class RowEncoder:
    """Feature dicts as the float matrix LightGBM reads: the columns fixed at fit, categoricals as codes of the
    values seen in training (an unseen value: NaN, which the trees send down their missing-value branch)."""

    def fit(self, rows: list[dict]) -> RowEncoder:
        if not rows:
            raise ValueError("RowEncoder.fit needs at least one feature row")
        self.columns_ = list(rows[0])
        self.codes_ = {
            c: {v: float(i) for i, v in enumerate(sorted({str(r[c]) for r in rows}))}
            for c in CATEGORICAL
            if c in self.columns_
        }
        return self

    @property
    def categorical_indices(self) -> list[int]:
        return [self.columns_.index(c) for c in self.codes_]

    def matrix(self, rows: list[dict]) -> np.ndarray:
        out = np.empty((len(rows), len(self.columns_)), np.float64)
        for i, row in enumerate(rows):
            out[i] = [
                self.codes_[c].get(str(row[c]), np.nan) if c in self.codes_ else _number(row[c]) for c in self.columns_
            ]
        return out

    def columns_matrix(self, columns: dict[str, np.ndarray | list], n: int) -> np.ndarray:
        """matrix() of `n` rows given as columns (name → n values: StageInputs.columns with the so-far columns):
        the live path, without a dict per row."""
        table = [
            columns[c] if (codes := self.codes_.get(c)) is None else [codes.get(str(v), np.nan) for v in columns[c]]
            for c in self.columns_
        ]
        return column_matrix(dict(zip(self.columns_, table)), self.columns_, n)

    def knows(self, column: str, value: str) -> bool:
        return value in self.codes_.get(column, {})


def _number(value) -> float:
    return np.nan if value is None else float(value)


class TailScores(BucketScores):
    """The prompt tail's hashed n-grams (pipelines.lexical's design matrix) read by one ridge regression per
    target, log(1 + remaining calls) and log(1 + remaining tokens): a gather and a sum a prompt. `oof_`: the
    training rows' scores from ridges fitted on the other task-grouped folds (what the boosters are fitted on)."""

    def __init__(self, config: LexicalConfig | None = None):
        self.config = config or LexicalConfig()

    def fit(self, texts: list[str], targets: np.ndarray, groups: np.ndarray) -> TailScores:
        """`targets`: (n, k) log targets; `groups`: each row's task (no fold splits one)."""
        X, targets = design_matrix(texts, self.config), np.asarray(targets, np.float64)
        self.oof_ = np.zeros(targets.shape, np.float32)
        folds = GroupKFold(n_splits=min(self.config.folds, len(set(groups))))
        for train, held in folds.split(X, groups=groups):
            self.oof_[held] = Ridge(alpha=self.config.ridge).fit(X[train], targets[train]).predict(X[held])
        ridge = Ridge(alpha=self.config.ridge).fit(X, targets)
        self.weights_, self.bias_ = ridge.coef_.T.astype(np.float32), ridge.intercept_.astype(np.float32)
        return self
