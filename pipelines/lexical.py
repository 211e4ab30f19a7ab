"""A supervised lexical signal: the prompt's tail as hashed n-grams, read by two linear models fitted on the
training labels, one a ridge regression on log(1 + output tokens), one a logistic regression on is-tool-call.
Their two scores are feature columns for the boosters (`lex_tokens`, `lex_tool`).

A text's n-grams are its lowercased tail's character n-grams (its UTF-8 bytes) and, if asked, words and word
pairs, each hashed to one of `num_buckets` buckets by a fixed 64-bit hash (the same in every process, unlike
Python's `hash`); a row counts the n-grams in each bucket, scaled by one over the square root of their number.
A linear model over such a row is a sum of its n-grams' weights: a few numpy operations and one gather, tens of
microseconds a prompt.

For the training rows the scores are out of fold: each row's comes from models fitted on the other task-grouped
folds, so the boosters never read a score fitted to the row's own label (a fitted ridge remembers its training
labels, and trees would learn to trust it more than it deserves on a prompt never seen). New prompts are
scored by the models fitted on every training row.

With a teacher (`LexicalConfig.teacher`, training only), the length model is fitted not to the labels alone but to
the mean of each row's log(1 + tokens) and a teacher's prediction of it: a ridge regression on the row's MiniLM
vector (not the full MiniLM recipe), its predictions out of fold by task, and within each of the lexical model's
folds fitted on that fold's training rows alone, so a row's out-of-fold score still never reads its own task's
labels. MiniLM is never run to score a prompt: the fitted weights are the same n-gram table.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import GroupKFold

LEXICAL_COLUMNS = ("lex_tokens", "lex_tool")  # the feature columns, in the order score() gives them
_PRIME = np.uint64(0x100000001B3)  # FNV-1a's 64-bit prime: the rolling hash's multiplier
_MIX = np.uint64(0x9E3779B97F4A7C15)  # golden-ratio constant: spreads a hash's bits before the bucket modulo
_WORD = re.compile(r"\w+")
# seeds that keep character n-grams, words and word pairs apart
_CHAR_SEED, _WORD_SEED, _BIGRAM_SEED = np.uint64(7), np.uint64(101), np.uint64(211)


@dataclass(frozen=True)
class LexicalConfig:
    tail_chars: int = 256  # the prompt's last characters read (0: all of it)
    char_ngrams: tuple[int, ...] = (3, 4, 5)
    word_ngrams: int = 0  # words: 0 none, 1 unigrams, 2 uni- and bigrams (CRC-32s, ~15 µs a prompt)
    num_buckets: int = 2**17
    ridge: float = 1.0  # the length model's L2 penalty
    tool_c: float = 3.0  # the tool-call model's inverse L2 penalty
    folds: int = 5  # task-grouped folds for the training rows' out-of-fold scores
    # each n-gram also in a bucket of its own for the stage's app, beside the shared one: the models can weigh a
    # phrase per app where the apps disagree on it (an app training never saw has buckets no training row set:
    # its scores rest on the shared weights)
    per_app: bool = False
    # "minilm": the length model's target is the mean of the label's log(1 + tokens) and the out-of-fold prediction
    # of a ridge (penalty `teacher_ridge`) on the row's MiniLM vector (fit's teacher_vectors); None: the labels
    teacher: str | None = None
    teacher_ridge: float = 1.0

    def __post_init__(self) -> None:
        if self.teacher not in (None, "minilm") or self.teacher_ridge <= 0:
            raise ValueError(f"invalid LexicalConfig {self}: teacher None or 'minilm', teacher_ridge > 0")
        if self.tail_chars < 0 or self.num_buckets < 2 or self.folds < 2:
            raise ValueError(f"invalid LexicalConfig {self}: tail_chars ≥ 0, num_buckets ≥ 2, folds ≥ 2")
        if any(n < 1 for n in self.char_ngrams) or self.word_ngrams not in (0, 1, 2):
            raise ValueError(f"invalid LexicalConfig {self}: char_ngrams ≥ 1 each, word_ngrams 0, 1 or 2")
        if not self.char_ngrams and not self.word_ngrams:
            raise ValueError("LexicalConfig reads nothing: give char_ngrams or word_ngrams")


def _mixed(hashes: np.ndarray) -> np.ndarray:
    """A 64-bit finaliser (xor-shift, multiply, xor-shift): nearby rolling hashes land in unrelated buckets."""
    hashes = hashes ^ (hashes >> np.uint64(29))
    hashes = hashes * _MIX
    return hashes ^ (hashes >> np.uint64(32))


def _char_ngram_hashes(codes: np.ndarray, lengths: tuple[int, ...]) -> list[np.ndarray]:
    """The rolling polynomial hashes of every run of n bytes, for each n in `lengths`: one pass, each n-gram's
    hash extending the (n-1)-gram's at the same start (seeded, so an n-gram's and an (n+1)-gram's differ)."""
    hashes, out = np.full(len(codes), _CHAR_SEED, np.uint64), []
    for n in range(1, max(lengths, default=0) + 1):
        count = len(codes) - n + 1
        if count <= 0:
            break
        hashes = hashes[:count] * _PRIME + codes[n - 1 : n - 1 + count]
        if n in lengths:
            out.append(hashes)
    return out


def _word_ngram_hashes(text: str, order: int) -> np.ndarray:
    """CRC-32s of the words, and of adjacent pairs (order 2) combined from them."""
    words = np.fromiter((zlib.crc32(w.encode()) for w in _WORD.findall(text)), np.uint64)
    if order < 2 or len(words) < 2:
        return words + _WORD_SEED
    return np.concatenate([words + _WORD_SEED, (words[:-1] * _PRIME + words[1:]) * _PRIME + _BIGRAM_SEED])


def bucket_ids(text: str, config: LexicalConfig, app: str | None = None) -> np.ndarray:
    """The bucket of each of a text's n-grams (int64), a bucket once for each n-gram in it; with `per_app`
    and an `app`, then the bucket of each n-gram for that app."""
    tail = (text[-config.tail_chars :] if config.tail_chars else text).lower()
    codes = np.frombuffer(tail.encode("utf-8", "replace"), np.uint8).astype(np.uint64)
    parts = _char_ngram_hashes(codes, config.char_ngrams)
    if config.word_ngrams:
        parts.append(_word_ngram_hashes(tail, config.word_ngrams))
    hashes = _mixed(np.concatenate(parts)) if parts else np.zeros(0, np.uint64)
    if config.per_app and app:
        seed = np.full(1, zlib.crc32(app.encode()), np.uint64) * _MIX  # an array: numpy wraps it without a warning
        hashes = np.concatenate([hashes, _mixed(hashes ^ seed)])
    if config.num_buckets & (config.num_buckets - 1) == 0:  # a power of two: the modulo as a mask, ~10× cheaper
        return (hashes & np.uint64(config.num_buckets - 1)).view(np.int64)
    return (hashes % np.uint64(config.num_buckets)).astype(np.int64)


def design_matrix(texts: list[str], config: LexicalConfig, apps: list[str | None] | None = None) -> sparse.csr_matrix:
    """Texts as rows over the buckets: each bucket's count of n-grams over √(the row's n-grams), what score()
    sums (counts, not distinct buckets: numpy's unique would be half a row's cost on the live path)."""
    ids = [bucket_ids(t, config, a) for t, a in zip(texts, apps or [None] * len(texts))]
    lengths = np.array([len(i) for i in ids])
    values = np.repeat(1.0 / np.sqrt(np.maximum(lengths, 1)), lengths)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    X = sparse.csr_matrix((values, indices, indptr), shape=(len(texts), config.num_buckets))
    X.sum_duplicates()
    return X


def _fit_weights(
    X: sparse.csr_matrix, log_tokens: np.ndarray, is_tool: np.ndarray, config: LexicalConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Both models' weights, as one (num_buckets, 2) float32 table and its bias (2,)."""
    ridge = Ridge(alpha=config.ridge).fit(X, log_tokens)
    weights = np.zeros((X.shape[1], 2), np.float32)
    bias = np.array([ridge.intercept_, 0.0], np.float32)
    weights[:, 0] = ridge.coef_
    if len(np.unique(is_tool)) == 2:
        logistic = LogisticRegression(C=config.tool_c, max_iter=1000).fit(X, is_tool)
        weights[:, 1], bias[1] = logistic.coef_[0], logistic.intercept_[0]
    else:  # one class only: a constant log-odds of the smoothed rate, which the trees will ignore
        rate = (is_tool.sum() + 0.5) / (len(is_tool) + 1.0)
        bias[1] = np.log(rate / (1 - rate))
    return weights, bias


def teacher_predictions(
    vectors: np.ndarray, log_tokens: np.ndarray, groups: np.ndarray, config: LexicalConfig
) -> np.ndarray:
    """Each row's log(1 + tokens) as a ridge on the teacher's vectors predicts it, out of fold by task (`folds`
    task-grouped folds): a row's prediction never read its own task's labels."""
    out = np.zeros(len(log_tokens))
    folds = GroupKFold(n_splits=min(config.folds, len(set(groups))))
    for train, held in folds.split(vectors, groups=groups):
        out[held] = Ridge(alpha=config.teacher_ridge).fit(vectors[train], log_tokens[train]).predict(vectors[held])
    return out


def length_targets(
    log_tokens: np.ndarray, groups: np.ndarray, vectors: np.ndarray | None, config: LexicalConfig
) -> np.ndarray:
    """The length model's target over these rows: the labels, or with a teacher their mean with its out-of-fold
    predictions (fitted on these rows alone; the labels alone where they hold fewer than 2 tasks)."""
    if config.teacher is None or len(set(groups)) < 2:
        return log_tokens
    return 0.5 * (log_tokens + teacher_predictions(vectors, log_tokens, groups, config))


def pair_table(weights: np.ndarray) -> np.ndarray | None:
    """A (buckets, 2) weight table as one complex64 a bucket (None for any other width): a text's two sums become
    one gather and one sum of complex numbers, ~10× cheaper than a gather of rows summed along axis 0."""
    if weights.ndim != 2 or weights.shape[1] != 2:
        return None
    return np.ascontiguousarray(weights, np.float32).view(np.complex64).ravel()


class BucketScores:
    """Scoring for the linear models over hashed n-gram buckets: a text's score is `bias_` plus the sum of its
    n-grams' rows of `weights_` ((buckets, k) float32) over √(their number). A subclass's fit sets `config` (a
    LexicalConfig), `weights_` and `bias_`."""

    def score(self, texts: list[str], apps: list[str | None] | None = None) -> np.ndarray:
        """(len(texts), k) float32 scores; `apps`: each text's app (read where the config is `per_app`)."""
        if not hasattr(self, "weights_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit() on training texts first")
        pairs = self._pairs()
        out = np.empty((len(texts), len(self.bias_)), np.float32)
        for row, (text, app) in enumerate(zip(texts, apps or [None] * len(texts))):
            ids = bucket_ids(text, self.config, app)
            if not len(ids):
                out[row] = self.bias_
            elif pairs is None:
                out[row] = self.bias_ + self.weights_[ids].sum(axis=0) / np.sqrt(len(ids))
            else:
                total = pairs.take(ids).sum() / np.sqrt(len(ids))
                out[row] = self.bias_ + np.array((total.real, total.imag), np.float32)
        return out

    def _pairs(self) -> np.ndarray | None:
        """pair_table of the current weights, made on first use (and again after a refit)."""
        cached = self.__dict__.get("_pair_table")
        if cached is None or cached[0] is not self.weights_:
            cached = self.__dict__["_pair_table"] = (self.weights_, pair_table(self.weights_))
        return cached[1]

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_pair_table"}


class LexicalModel(BucketScores):
    """fit(texts, tokens, is_tool, groups) → score(texts): (n, 2) float32, LEXICAL_COLUMNS' values.

    After fit, `oof_` holds the training rows' out-of-fold scores (not part of state(): a loaded model
    scores every text with the weights fitted on all training rows), and with a teacher `teacher_` its
    out-of-fold predictions over all training rows (the final fit's targets are their mean with the labels)."""

    def __init__(self, config: LexicalConfig | None = None):
        self.config = config or LexicalConfig()

    def fit(
        self,
        texts: list[str],
        tokens: np.ndarray,
        is_tool: np.ndarray,
        groups: np.ndarray,
        apps: list[str | None] | None = None,
        teacher_vectors: np.ndarray | None = None,
    ) -> LexicalModel:
        """`groups`: each row's task; no fold splits one, so a row's out-of-fold score never saw its own task.
        `apps`: each row's app (read with `per_app`); `teacher_vectors`: each row's MiniLM vector (with a teacher)."""
        if self.config.teacher is not None and (teacher_vectors is None or len(teacher_vectors) != len(texts)):
            raise ValueError(f"LexicalConfig.teacher={self.config.teacher!r} needs one teacher vector per text")
        vectors = None if self.config.teacher is None else np.asarray(teacher_vectors, np.float64)
        groups = np.asarray(groups)
        X = design_matrix(texts, self.config, apps)
        log_tokens = np.log1p(np.asarray(tokens, np.float64))
        is_tool = np.asarray(is_tool, int)
        num_groups = len(set(groups))
        if num_groups < 2:
            raise ValueError(f"the lexical model needs training stages of at least 2 tasks, got {num_groups}")
        self.oof_ = np.zeros((len(texts), 2), np.float32)
        for train, held in GroupKFold(n_splits=min(self.config.folds, num_groups)).split(X, groups=groups):
            targets = length_targets(
                log_tokens[train], groups[train], None if vectors is None else vectors[train], self.config
            )
            weights, bias = _fit_weights(X[train], targets, is_tool[train], self.config)
            self.oof_[held] = X[held] @ weights + bias
        if vectors is not None:
            self.teacher_ = teacher_predictions(vectors, log_tokens, groups, self.config)
        targets = log_tokens if vectors is None else 0.5 * (log_tokens + self.teacher_)
        self.weights_, self.bias_ = _fit_weights(X, targets, is_tool, self.config)
        return self

    def state(self) -> dict:
        """What fit() learnt that scoring needs: the config, the weight table and bias."""
        return {"config": self.config, "weights": self.weights_, "bias": self.bias_}

    @classmethod
    def from_state(cls, state: dict) -> LexicalModel:
        model = cls(state["config"])
        model.weights_, model.bias_ = state["weights"], state["bias"]
        return model
