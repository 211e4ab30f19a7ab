"""A static embedding: MiniLM distilled to one vector per vocabulary token, a text's vector the mean of its
tokens' vectors: a tokenizer pass and one gather, a fraction of a millisecond where MiniLM takes ~28 ms.

The distillation is model2vec's (every token of the vocabulary through MiniLM on its own, between [CLS] and
[SEP], the last hidden states mean-pooled), done with the project's own transformers/torch (model2vec's
`distill` extra would pin an older transformers). The rows are then weighted by smooth inverse frequency,
optionally fitted to MiniLM's own vectors of the training prompts, and the featurizer's PCA folded in: all
linear, so the fitted table answers in the PCA's dimensions directly. The tokenizer is MiniLM's, in Python
(PythonWordPiece): the Rust tokenizer's Python binding costs ~100 µs a segment.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np

from pipelines.embedding import EMBEDDING_DIM, EmbedderConfig, model_path

# What the distilled table depends on besides the teacher's weights: bump it when distill_table changes.
DISTILL_RECIPE = "cls-token-sep mean-pooled float64 v2"


def _static_cache_dir() -> Path:
    return Path(os.environ.get("MAESTRO_CACHE", Path.home() / ".cache" / "maestro"))


@functools.lru_cache(maxsize=1)
def teacher_digest() -> str:
    """What a distilled table is keyed by: the packaged MiniLM's weights and the distillation recipe."""
    digest = hashlib.sha256(DISTILL_RECIPE.encode())
    digest.update((Path(model_path()) / "model.safetensors").read_bytes())
    return digest.hexdigest()[:24]


def distill_table(batch_size: int = 1024, tokens: int | None = None) -> np.ndarray:
    """model2vec's distillation, with the project's own transformers/torch: every vocabulary token through
    MiniLM on its own ([CLS] token [SEP]), the last hidden states mean-pooled. (vocab, 384) float32; `tokens`:
    only the vocabulary's first that many rows.

    MiniLM runs in float64 and the table is rounded to float32 once, at the end: in float32 the table's last
    bits follow the CPU's BLAS kernels (MKL's AVX2 and AVX-512 paths differ), so `dvc repro` on another
    machine would write other features; rounded from float64 it is the same bits on every kernel tried
    (tests/pipelines/test_static_embedding.py). About 2x the float32 time (~22 s on two cores)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path())
    model = AutoModel.from_pretrained(model_path()).eval().double()
    ids = torch.arange(tokenizer.vocab_size if tokens is None else tokens)
    table = np.empty((len(ids), EMBEDDING_DIM), np.float32)
    with torch.inference_mode():
        for start in range(0, len(ids), batch_size):
            batch = ids[start : start + batch_size]
            tokens = torch.stack(
                [torch.full_like(batch, tokenizer.cls_token_id), batch, torch.full_like(batch, tokenizer.sep_token_id)],
                dim=1,
            )
            hidden = model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).last_hidden_state
            table[start : start + len(batch)] = hidden.mean(dim=1).numpy()
    return table


_TABLES: dict[str, np.ndarray] = {}  # distilled tables of this process, by teacher_digest()


def teacher_table(cache: str | Path | None = None) -> np.ndarray:
    """The distilled table: from this process, from the cache file (`cache`, else a file named by the teacher's
    digest under $MAESTRO_CACHE or ~/.cache/maestro) if it was distilled from the same teacher, else distilled
    now (about 20-60 s on one core) and written there."""
    key = teacher_digest()
    if key in _TABLES:
        return _TABLES[key]
    path = Path(cache) if cache is not None else _static_cache_dir() / f"static-{key}.npz"
    if path.exists():
        stored = np.load(path)
        if str(stored["teacher"]) == key:
            _TABLES[key] = stored["table"]
            return _TABLES[key]
    table = distill_table()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, table=table, teacher=np.array(key))
    _TABLES[key] = table
    return table


def _tokenizer_json() -> str:
    return (Path(model_path()) / "tokenizer.json").read_text()


# BERT's pre-tokens of normalized text: runs of letters, digits and other non-ASCII characters, or one
# punctuation character (non-ASCII punctuation and CJK characters arrive spaced out by the normalization)
_PRE_TOKEN = re.compile(r"[a-z0-9\x80-\U0010ffff]+|\S")


class _Normalization(dict):
    """character → what MiniLM's normalizer (clean text, space out CJK, strip accents, lowercase) and its
    pre-tokenizer's punctuation split make of it, as str.translate reads it: asked of the Rust tokenizer's own
    normalizer and pre-tokenizer the first time a character is seen, so the rules are theirs."""

    def __init__(self, tokenizer):
        super().__init__()
        self.normalizer, self.pre_tokenizer = tokenizer.normalizer, tokenizer.pre_tokenizer

    def __missing__(self, code: int) -> str:
        out = "".join(map(self._piece, self.normalizer.normalize_str(chr(code))))
        self[code] = out
        return out

    def _piece(self, ch: str) -> str:
        """A normalized character: " " where the pre-tokenizer splits words on it and drops it (whitespace),
        spaced out where it splits it off as a word of its own (punctuation), else itself."""
        words = [word for word, _ in self.pre_tokenizer.pre_tokenize_str(f"a{ch}a")]
        return {1: ch, 2: " "}.get(len(words), f" {ch} ")


class PythonWordPiece:
    """MiniLM's tokenizer (BertNormalizer, BertPreTokenizer, WordPiece) with the per-text work in Python: the
    normalization as one str.translate (each character's image asked of the Rust tokenizer once), the
    pre-tokens as one regex, each looked up in the vocabulary; a word the vocabulary does not hold is split by
    the Rust WordPiece model itself. The Rust tokenizer's whole pipeline spends ~100 µs on a 256-character
    segment through its Python binding, this ~15-25 µs, with the same ids (tests compare them on the dev
    traces' prompts and on random Unicode)."""

    def __init__(self, tokenizer_json: str, tokenizer):
        self.vocab: dict[str, int] = json.loads(tokenizer_json)["model"]["vocab"]
        self.word_pieces = tokenizer.model.tokenize
        self._normalization = _Normalization(tokenizer)
        for code in range(128):  # printable ASCII and the rest: looked up before the first text arrives
            self._normalization[code]

    def ids(self, text: str) -> list[int]:
        vocab, out = self.vocab, []
        for word in _PRE_TOKEN.findall(text.translate(self._normalization)):
            token = vocab.get(word)
            if token is None:
                out.extend(piece.id for piece in self.word_pieces(word))
            else:
                out.append(token)
        return out


class StaticEmbedder:
    """A text's vector is the mean of its tokens' rows in `table`, minus `offset`.

    `distilled()` holds MiniLM's distilled table (384-d, loaded or distilled on first use); `weighted(texts)`
    scales each token's row by its smooth-inverse-frequency weight; `projected(pca)` folds a fitted PCA into
    the rows (the mean is linear), so the fitted embedder answers in the PCA's dimensions with no matrix
    product. Its state (table, offset, tokenizer) travels inside the predictor's artifact."""

    def __init__(
        self,
        config: EmbedderConfig,
        table: np.ndarray | None = None,
        offset: np.ndarray | None = None,
        tokenizer_json: str | None = None,
        cache: str | Path | None = None,
        head: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        self.config, self.cache = config, cache
        self._table, self._offset, self._tokenizer_json = table, offset, tokenizer_json
        self.head = head  # (W, b): x ↦ x·W + b after the unit scaling of config.normalize (not foldable)
        self._tokenizer = self._python_tokenizer = None

    @classmethod
    def distilled(cls, config: EmbedderConfig, cache: str | Path | None = None) -> StaticEmbedder:
        return cls(config, cache=cache)

    @property
    def table(self) -> np.ndarray:
        if self._table is None:
            self._table = teacher_table(self.cache)
        return self._table

    @property
    def offset(self) -> np.ndarray:
        return np.zeros(self.table.shape[1], np.float32) if self._offset is None else self._offset

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            if self._tokenizer_json is None:
                self._tokenizer_json = _tokenizer_json()
            tokenizer = Tokenizer.from_str(self._tokenizer_json)
            tokenizer.no_truncation()
            tokenizer.no_padding()
            self._tokenizer = tokenizer
        return self._tokenizer

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's segment as token ids, without [CLS]/[SEP] (PythonWordPiece)."""
        if self._python_tokenizer is None:
            self._python_tokenizer = PythonWordPiece(self._tokenizer_json or _tokenizer_json(), self.tokenizer)
        ids = self._python_tokenizer.ids
        return [ids(self.config.segment(t)) for t in texts]

    def rust_token_ids(self, texts: list[str]) -> list[list[int]]:
        """The same by the Rust tokenizer (what PythonWordPiece must agree with)."""
        segments = [self.config.segment(t) for t in texts]
        return [e.ids for e in self.tokenizer.encode_batch(segments, add_special_tokens=False)]

    def embed(self, texts: list[str], progress: bool = False) -> np.ndarray:
        """The texts' vectors, float32 (a text without tokens: minus the offset)."""
        return self.mean_rows(self.token_ids(texts))

    def mean_rows(self, ids: list[list[int]]) -> np.ndarray:
        vectors = self._means(ids)
        if self.config.normalize:
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        if self.head is not None:
            vectors = vectors @ self.head[0] + self.head[1]
        return vectors

    def _means(self, ids: list[list[int]]) -> np.ndarray:
        table = self.table
        if len(ids) == 1:  # the live path: take/sum/divide in place, ~half of ndarray.mean's overhead
            if not ids[0]:
                return -self.offset.reshape(1, -1)
            row = table.take(ids[0], axis=0).sum(axis=0)
            row /= len(ids[0])
            row -= self.offset
            return row.reshape(1, -1)
        counts = np.fromiter(map(len, ids), np.int64, len(ids))
        out = np.zeros((len(ids), table.shape[1]), np.float32)
        filled = counts > 0
        if filled.any():
            flat = np.fromiter((i for row in ids for i in row), np.int64, int(counts.sum()))
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[filled]
            out[filled] = np.add.reduceat(table[flat], starts, axis=0) / counts[filled, None]
        return out - self.offset

    def token_weights(self, texts: list[str]) -> np.ndarray:
        """a / (a + p(token)), p from the token counts of `texts` ("corpus") or Zipf's law over the
        vocabulary's order ("zipf"); ones for "none"."""
        size, a = len(self.table), self.config.sif_coefficient
        if self.config.weighting == "none":
            return np.ones(size, np.float32)
        if self.config.weighting == "zipf":
            p = 1.0 / np.arange(2, size + 2)
        else:
            ids = self.token_ids(texts)
            p = np.bincount(np.fromiter((i for row in ids for i in row), np.int64), minlength=size)[:size]
        p = p / max(p.sum(), 1)
        return (a / (a + p)).astype(np.float32)

    def weighted(self, texts: list[str]) -> StaticEmbedder:
        """This embedder with each token's row scaled by its weight (token_weights of `texts`)."""
        table = self.table * self.token_weights(texts)[:, None]
        return StaticEmbedder(self.config, table, self._offset, self._tokenizer_json)

    def projected(self, pca) -> StaticEmbedder:
        """This embedder followed by a fitted sklearn PCA: x ↦ (x − μ)·P (after the unit scaling, if any)."""
        projection = pca.components_.T.astype(np.float32)
        bias = -(pca.mean_ @ projection).astype(np.float32)
        if self.config.normalize:
            return StaticEmbedder(self.config, self.table, self._offset, self._tokenizer_json, head=(projection, bias))
        return self.linear(projection, bias)

    def fitted_to(self, texts: list[str], targets: np.ndarray) -> StaticEmbedder:
        """This embedder followed by the ridge regression of `targets` (the teacher's vectors of `texts`) on
        its own vectors of them: x ↦ x·W + b."""
        x = self.embed(texts).astype(np.float64)
        x_mean, y_mean = x.mean(axis=0), targets.mean(axis=0)
        xc = x - x_mean
        penalty = self.config.ridge * float(np.mean(np.sum(xc**2, axis=0)))
        weights = np.linalg.solve(xc.T @ xc + penalty * np.eye(x.shape[1]), xc.T @ (targets - y_mean))
        return self.linear(weights.astype(np.float32), (y_mean - x_mean @ weights).astype(np.float32))

    def linear(self, weights: np.ndarray, bias: np.ndarray) -> StaticEmbedder:
        """This embedder followed by x ↦ x·W + b, folded into the rows (the mean is linear):
        (mean(rows) − offset)·W + b = mean(rows·W) − (offset·W − b)."""
        offset = (self.offset @ weights - bias).astype(np.float32)
        return StaticEmbedder(
            self.config, np.ascontiguousarray(self.table @ weights, np.float32), offset, self._tokenizer_json
        )

    def state(self) -> dict:
        return {
            "config": self.config,
            "table": self.table,
            "offset": self.offset,
            "tokenizer": self._tokenizer_json or _tokenizer_json(),
            "head": self.head,
        }

    @classmethod
    def from_state(cls, state: dict) -> StaticEmbedder:
        return cls(state["config"], state["table"], state["offset"], state["tokenizer"], head=state.get("head"))
