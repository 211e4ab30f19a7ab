"""The workflow's task as a stage's own prompt shows it: the prompt's head, read by ridges fitted to the remaining
work (the tail scores' machinery, pipelines.workflow_features.TailScores), for the workflow-level predictor.

The tail scores read a prompt's last characters: the turn just before the call. Where a workflow's length is set by
its task, the task statement sits elsewhere in the prompt, and every stage of the workflow repeats it:

- a plain-text prompt (ChatDev, AutoGen): its first characters (ChatDev: the role's description, then "Here is a new
  customer's task: ..."; AutoGen: the message itself, often the whole prompt);
- a message list (the tau2 apps): the system message's last characters (a user simulator's `<scenario>`, its reason
  for calling and instructions; an agent's: the policy, the same for every task of an app) and the conversation's
  first OPENING_MESSAGES messages (the greeting and the customer's request, for the agent and the simulator alike).

Only the stage's own prompt is read: nothing a live system lacks when the stage becomes ready.

The ridges' targets are the log targets, or with `centred` each row's deviation from the mean of its (app, position)
group (positions past CENTRE_LAST_POSITION pooled; means from the fold's training rows): the trees know the app and
the position, and what is asked of the text is how long this task runs against others at the same point.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import Ridge
from sklearn.model_selection import GroupKFold

from maestro.contract import Prompt, prompt_text
from pipelines.lexical import LexicalConfig, design_matrix
from pipelines.workflow_features import TailScores

OPENING_MESSAGES = 2  # the conversation's first messages read: the greeting and the request
HEAD_COUNT_COLUMNS = ("head_chars", "head_commas", "head_lines")
CENTRE_LAST_POSITION = 20  # centred targets: later positions share one group per app


def head_text(prompt: Prompt, chars: int) -> str:
    """A prompt's head: a plain text's first `chars` characters; a message list's system message's last `chars`
    characters and its first non-system messages' text (prompt_text's form), at most `chars` of them."""
    if isinstance(prompt, str):
        return prompt[:chars]
    system = next((m for m in prompt if m.get("role") == "system"), None)
    content = (system or {}).get("content") or ""
    system_tail = str(content)[-chars:] if isinstance(content, str) else prompt_text([system])[-chars:]
    opening = prompt_text([m for m in prompt if m.get("role") != "system"][:OPENING_MESSAGES])[:chars]
    return f"{system_tail}\n{opening}" if system_tail else opening


def head_counts(texts: list[str]) -> np.ndarray:
    """(n, 3) float64: each head's characters, commas and lines (HEAD_COUNT_COLUMNS)."""
    return np.array([(len(t), t.count(","), t.count("\n")) for t in texts], np.float64).reshape(len(texts), 3)


class HeadSignal:
    """fit(prompts, log targets, groups) → the training rows' columns (out of fold); columns(prompts) → a new
    stage's: the head's two ridge scores (log remaining calls, log remaining tokens), then, with `counts`, its
    characters, commas and lines."""

    def __init__(self, chars: int, counts: bool = True, folds: int = 5, centred: bool = False):
        if chars < 1:
            raise ValueError(f"HeadSignal reads a prompt's first characters: chars ≥ 1, got {chars}")
        self.chars, self.counts, self.folds, self.centred = chars, counts, folds, centred

    @classmethod
    def of(cls, config) -> HeadSignal | None:
        """The head signal a WorkflowConfig asks for (`head_chars`, `head_counts`, `head_centred`), else None."""
        return (
            cls(config.head_chars, config.head_counts, config.folds, config.head_centred) if config.head_chars else None
        )

    def fit(
        self, prompts: list[Prompt], targets: np.ndarray, groups: np.ndarray, apps: list[str], positions: list[int]
    ) -> np.ndarray:
        """`targets`: (n, k) log targets; `groups`: each row's task (no fold splits one); `apps`, `positions`: each
        row's app and call_index (the cells of centred targets)."""
        texts = [head_text(p, self.chars) for p in prompts]
        self.scores_ = TailScores(LexicalConfig(tail_chars=0, folds=self.folds))
        if not self.centred:
            self.scores_.fit(texts, targets, groups)
            return self._columns(self.scores_.oof_, texts)
        X, targets = design_matrix(texts, self.scores_.config), np.asarray(targets, np.float64)
        cells = np.array([f"{a}|{min(p, CENTRE_LAST_POSITION)}" for a, p in zip(apps, positions)])
        oof = np.zeros(targets.shape, np.float32)
        fit = lambda rows: Ridge(alpha=self.scores_.config.ridge).fit(X[rows], _centred(targets, cells, rows))
        for train, held in GroupKFold(n_splits=min(self.folds, len(set(groups)))).split(X, groups=groups):
            oof[held] = fit(train).predict(X[held])
        ridge = fit(np.arange(len(texts)))
        self.scores_.weights_ = ridge.coef_.T.astype(np.float32)
        self.scores_.bias_ = ridge.intercept_.astype(np.float32)
        return self._columns(oof, texts)

    def columns(self, prompts: list[Prompt]) -> np.ndarray:
        texts = [head_text(p, self.chars) for p in prompts]
        return self._columns(self.scores_.score(texts), texts)

    def _columns(self, scores: np.ndarray, texts: list[str]) -> np.ndarray:
        return np.column_stack([scores, head_counts(texts)]) if self.counts else scores


def _centred(targets: np.ndarray, cells: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`targets[rows]` less the mean of their cell over `rows`."""
    names, index = np.unique(cells[rows], return_inverse=True)
    sums = np.zeros((len(names), targets.shape[1]))
    np.add.at(sums, index, targets[rows])
    return targets[rows] - (sums / np.bincount(index)[:, None])[index]
