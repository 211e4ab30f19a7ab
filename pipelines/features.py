"""Stage features: the structural and prompt-text ones (pipelines.stage_features), an embedding → PCA, and
optionally the supervised lexical scores (pipelines.lexical).

The Featurizer learns the categories and the PCA on training stages and turns stages into the
model's feature frame (training) or float matrix (the live path).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from sklearn.decomposition import PCA

from maestro.contract import StageTrace, task_id
from pipelines.batch_features import StageInputs
from pipelines.boosters import column_matrix
from pipelines.embedding import Embedder, EmbedderConfig, make_embedder
from pipelines.lexical import LEXICAL_COLUMNS, LexicalConfig, LexicalModel
from pipelines.stage_features import BASIC_COLUMNS, CATEGORICAL, UNKNOWN, StageHistory, structural_frame
from pipelines.static_embedding import StaticEmbedder

EMBEDDING_PREFIX = "emb_"  # the embedding's PCA columns: emb_0, emb_1, ...


def frequent_categories(counts: pd.Series, min_count: int) -> list[str]:
    """A categorical column's categories: the values seen at least `min_count` times (value → count), then UNKNOWN."""
    frequent = {str(v) for v in counts[counts >= min_count].index} - {UNKNOWN}
    return sorted(frequent) + [UNKNOWN]


@dataclass(frozen=True)
class FeaturizerConfig:
    feature_set: str = "full"  # full | basic
    pca_dims: int = 32
    min_category_count: int = 5  # rarer roles/apps become "unknown": the model learns a fallback for them
    embedder: EmbedderConfig = EmbedderConfig()
    use_embedding: bool = True
    # training rows also in the "none" and "partial" history conditions (pipelines.history)
    history_copies: bool = True
    lexical: LexicalConfig | None = None  # the supervised lexical scores (pipelines.lexical); None: not made

    def __post_init__(self) -> None:
        if self.feature_set not in ("full", "basic"):
            raise ValueError(f"feature_set must be 'full' or 'basic', got {self.feature_set!r}")
        if self.pca_dims < 1 or self.pca_dims > 384:
            raise ValueError(f"pca_dims must be in [1, 384], got {self.pca_dims}")


class Featurizer:
    """Turns stages into the model's feature frame; `fit` learns categories and the PCA (train only).

    With a static embedding, fit also weights its tokens by the training segments and folds the PCA into
    its table (`static_`: what transform and matrix read)."""

    def __init__(
        self,
        config: FeaturizerConfig | None = None,
        embedder: Embedder | StaticEmbedder | None = None,
        teacher: Embedder | None = None,
    ):
        self.config = config or FeaturizerConfig()
        self.embedder = embedder or make_embedder(self.config.embedder)
        self.teacher = teacher  # MiniLM, for a static embedding fitted to it or the lexical targets

    def fit(self, stages: list[StageTrace], progress: bool = False) -> Featurizer:
        frame = structural_frame(stages)
        self.categories_ = {
            c: frequent_categories(frame[c].value_counts(), self.config.min_category_count) for c in CATEGORICAL
        }
        for cached in ("_category_codes", "_embedding_names"):  # a refit: rebuild from the new categories / PCA
            self.__dict__.pop(cached, None)
        if self.config.use_embedding:
            self.fit_embedding([s.prompt_text() for s in stages], progress)
        if self.config.lexical is not None:
            self.fit_lexical(stages)
        return self

    def fit_lexical(self, stages: list[StageTrace]) -> Featurizer:
        """The lexical models, on the labelled stages, by task; their out-of-fold scores kept (in memory, not in
        state()) for transform to give these same stages, so the boosters train on scores that never saw the
        stage's own label."""
        labelled = [s for s in stages if s.is_labelled and s.is_tool_call is not None]
        texts = [s.prompt_text() for s in labelled]
        if self.config.lexical.teacher and self.teacher is None:  # MiniLM, for the length model's targets only
            self.teacher = Embedder(replace(self.config.embedder, kind="minilm"))
        self.lexical_ = LexicalModel(self.config.lexical).fit(
            texts,
            np.array([s.output_tokens for s in labelled]),
            np.array([bool(s.is_tool_call) for s in labelled]),
            np.array([task_id(s) for s in labelled]),
            [s.app for s in labelled],
            self.teacher.embed(texts) if self.config.lexical.teacher else None,
        )
        self._lexical_oof = {(s.workflow_id, s.stage_id): row for s, row in zip(labelled, self.lexical_.oof_)}
        return self

    def lexical_scores(self, stages: list[StageTrace], texts: list[str]) -> np.ndarray:
        """LEXICAL_COLUMNS' values of `stages` (their prompt `texts`): a training stage's out-of-fold scores,
        any other's from the models fitted on all training stages."""
        if not hasattr(self, "lexical_"):
            raise RuntimeError("the featurizer's lexical model is not fitted: Featurizer.fit fits it")
        scores = self.lexical_.score(texts, [s.app for s in stages])
        oof = self.__dict__.get("_lexical_oof")
        if oof:
            for i, stage in enumerate(stages):
                scores[i] = oof.get((stage.workflow_id, stage.stage_id), scores[i])
        return scores

    def fit_embedding(self, texts: list[str], progress: bool = False) -> Featurizer:
        """The PCA of the training prompts' embedding; for a static one, first its token weights (and its fit
        to MiniLM), then the PCA folded into its table."""
        embedder = self._fitted_static(texts, progress) if self._static else self.embedder
        vectors = embedder.embed(texts, progress=progress)
        dims = min(self.config.pca_dims, len(texts), vectors.shape[1])
        self.pca_ = PCA(n_components=dims, random_state=0).fit(vectors)
        if self._static:
            self.static_ = embedder.projected(self.pca_)
        self.__dict__.pop("_embedding_names", None)
        return self

    @property
    def _static(self) -> bool:
        return self.config.embedder.kind == "static"

    def _fitted_static(self, texts: list[str], progress: bool) -> StaticEmbedder:
        """The static embedder weighted by the training segments and, if configured, fitted to MiniLM's vectors
        of them (`teacher`: a MiniLM Embedder with the same segments, made here unless given)."""
        static = self.embedder.weighted(texts)
        if not self.config.embedder.fit_to_teacher:
            return static
        if self.teacher is None:
            self.teacher = Embedder(replace(self.config.embedder, kind="minilm"))
        corpus = self.config.embedder.teacher_corpus(texts)
        return static.fitted_to(corpus, self.teacher.embed(corpus, progress=progress))

    def transform(self, stages: list[StageTrace], progress: bool = False) -> pd.DataFrame:
        if not hasattr(self, "categories_"):
            raise RuntimeError("Featurizer is not fitted: call fit() on training stages first")
        texts = [s.prompt_text() for s in stages]
        frame = structural_frame(stages, texts)
        if self.config.feature_set == "basic":
            frame = frame[list(BASIC_COLUMNS)].copy()
        for column in self.categories_:
            if column in frame:
                frame[column] = self._categorical(column, frame[column].to_numpy(dtype=object))
        if self.config.lexical is not None:
            frame[list(LEXICAL_COLUMNS)] = self.lexical_scores(stages, texts)
        if self.config.use_embedding:
            reduced = self.embed(texts, progress)
            frame = pd.concat([frame, pd.DataFrame(reduced, columns=self._embedding_names, index=frame.index)], axis=1)
        return frame

    def matrix(
        self, stages: list[StageTrace], columns: list[str], history: StageHistory | None = None
    ) -> tuple[np.ndarray, list[str]]:
        """The live path: the float matrix a model reads, in its `columns` order, and each row's role
        category. The same values as transform() gives, categoricals as codes of the fitted categories,
        built without pandas: on a one-stage call pandas' frame machinery costs more than the trees.
        `history`: finished stages of the same workflows, standing in for ancestors not in `stages`."""
        return self.inputs_matrix(StageInputs(stages, history), columns)

    def inputs_matrix(self, inputs: StageInputs, columns: list[str]) -> tuple[np.ndarray, list[str]]:
        """matrix() of stages whose structure, history and text columns are made already (shared with the
        workflow model: Predictor.predict)."""
        stages, texts = inputs.stages, inputs.texts
        values = dict(inputs.columns)  # the codes and scores below replace entries of this copy alone
        for column, (index, _) in self._category_codes.items():
            values[column] = [index.get(v, index[UNKNOWN]) for v in values[column]]
        roles = [self.categories_["role"][code] for code in values["role"]]
        if self.config.lexical is not None:
            values.update(zip(LEXICAL_COLUMNS, self.lexical_scores(stages, texts).T.tolist()))
        if self.config.use_embedding:
            values.update(zip(self._embedding_names, self.embed(texts, progress=False).T.tolist()))
        missing = [c for c in columns if c not in values] if stages else []
        if missing:
            raise ValueError(
                f"the model reads features {missing} that this featurizer does not make: "
                "model and featurizer come from different trainings; retrain or reload both"
            )
        return column_matrix(values, columns, len(stages)), roles

    def embed(self, texts: list[str], progress: bool = False) -> np.ndarray:
        """The prompt texts' embedding projected by the fitted PCA, as float32 (what the model was trained on)."""
        if not texts:
            return np.zeros((0, self.pca_.n_components_), np.float32)
        if self._static:  # the PCA is folded into its table
            return self.static_.embed(texts)
        vectors = self.embedder.embed(texts, progress=progress)
        # PCA.transform's own arithmetic, without its input validation (~0.4 ms a call on the live path)
        projection = self.pca_.components_.T
        reduced = vectors @ projection
        reduced -= self.pca_.mean_.reshape(1, -1) @ projection
        return reduced.astype(np.float32)

    @functools.cached_property
    def _embedding_names(self) -> list[str]:
        return [f"{EMBEDDING_PREFIX}{i}" for i in range(self.pca_.n_components_)]

    @functools.cached_property
    def _category_codes(self) -> dict[str, tuple[dict, pd.CategoricalDtype]]:
        """Per categorical column: value → code, and its dtype, built once from the fitted categories."""
        return {
            c: ({v: i for i, v in enumerate(known)}, pd.CategoricalDtype(known))
            for c, known in self.categories_.items()
        }

    def _categorical(self, column: str, values: np.ndarray) -> pd.Categorical:
        """Values outside the training categories become UNKNOWN. A dict lookup and a cached dtype:
        pandas' own isin/where/Categorical cost ~0.5 ms a column on a live one-stage call."""
        index, dtype = self._category_codes[column]
        unknown = index[UNKNOWN]
        codes = np.fromiter((index.get(v, unknown) for v in values), np.int32, len(values))
        return pd.Categorical.from_codes(codes, dtype=dtype)

    def state(self) -> dict:
        """What fit() learnt, picklable without MiniLM (a static embedding's fitted table and the lexical models'
        weights are part of it; the training stages' out-of-fold lexical scores are not)."""
        static = self.static_.state() if hasattr(self, "static_") else None
        lexical = self.lexical_.state() if hasattr(self, "lexical_") else None
        return {
            "config": self.config,
            "categories": self.categories_,
            "pca": getattr(self, "pca_", None),
            "static": static,
            "lexical": lexical,
        }

    @classmethod
    def from_state(cls, state: dict, embedder: Embedder | StaticEmbedder | None = None) -> Featurizer:
        featurizer = cls(state["config"], embedder)
        featurizer.categories_ = state["categories"]
        if state["pca"] is not None:
            featurizer.pca_ = state["pca"]
        if state.get("static") is not None:
            featurizer.static_ = StaticEmbedder.from_state(state["static"])
        if state.get("lexical") is not None:  # absent from a featurizer saved before pipelines.lexical
            featurizer.lexical_ = LexicalModel.from_state(state["lexical"])
        return featurizer

    def known_role(self, role: str) -> bool:
        return role in self.categories_["role"] and role != UNKNOWN
