"""The static embedding (MiniLM distilled to one vector per token) and the lean one-stage path around it."""

import random
import re

import lightgbm as lgb
import numpy as np
import pytest
from sklearn.decomposition import PCA

from maestro.contract import StageTrace, read_traces
from pipelines.boosters import RowPredictor
from pipelines.embedding import EmbedderConfig
from pipelines.features import Featurizer, FeaturizerConfig
from pipelines.stage_features import _NEEDLES, BREVITY_CUE, JSON_CUE, _Cues
from pipelines.static_embedding import StaticEmbedder, teacher_table

STATIC = EmbedderConfig(kind="static")
VOCAB = 30522  # MiniLM's WordPiece vocabulary


def random_static(config: EmbedderConfig = STATIC, dims: int = 8) -> StaticEmbedder:
    """A static embedder with MiniLM's tokenizer and a random table: everything but the distillation."""
    return StaticEmbedder(config, np.random.default_rng(0).normal(size=(VOCAB, dims)).astype(np.float32))


def stage(i: int, prompt, role="coder", **extra) -> StageTrace:
    return StageTrace(
        workflow_id=f"w{i % 7}",
        stage_id=str(i),
        role=role,
        prompt=prompt,
        output_tokens=10 + i,
        is_tool_call=i % 3 == 0,
        **extra,
    )


def unicode_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    pool = (
        [chr(c) for c in range(32, 127)] * 5
        + [chr(c) for c in range(0x80, 0x3000)]
        + [chr(c) for c in range(0x4E00, 0x4E80)]
        + [chr(c) for c in range(0x1F300, 0x1F650)]
        + ["\t", "\n", "\u00a0", "\u200d", "\ufeff", "\x0b", "\x00"]
    )
    return ["".join(rng.choice(pool + [" "] * 40) for _ in range(rng.randint(0, 300))) for _ in range(n)]


def test_python_wordpiece_gives_the_rust_tokenizers_ids_on_any_unicode():
    embedder = random_static(EmbedderConfig(kind="static", tail_chars=0))
    texts = unicode_texts(600) + [
        "Hello, World! naïve café — “quoted” 🔋📶 x⁴ 中文字 İstanbul ſhort",
        "a" * 150 + " " + "tokenization" * 3,
        "",
    ]
    assert embedder.token_ids(texts) == embedder.rust_token_ids(texts)


def test_python_wordpiece_gives_the_rust_tokenizers_ids_on_real_prompts(dev_traces):
    texts = [s.prompt_text() for s in read_traces(dev_traces).stages]
    for tail in (256, 0):
        embedder = random_static(EmbedderConfig(kind="static", tail_chars=tail))
        assert embedder.token_ids(texts) == embedder.rust_token_ids(texts)


def test_a_text_is_the_mean_of_its_tokens_rows_one_or_many_at_a_time():
    embedder = random_static()
    texts = ["list 7 hotels in json", "", "...", "a much longer prompt " * 20]
    ids = embedder.token_ids(texts)
    batch = embedder.embed(texts)
    for text, row_ids, row in zip(texts, ids, batch):
        expected = embedder.table[row_ids].mean(axis=0) if row_ids else np.zeros(8)
        assert np.allclose(row, expected, atol=1e-6)
        assert np.allclose(embedder.embed([text])[0], row, atol=1e-6)


def test_zipf_weights_grow_with_the_vocabulary_rank():
    weights = random_static().token_weights([])
    assert weights.shape == (VOCAB,) and np.all(np.diff(weights) > 0) and 0 < weights[0] < weights[-1] <= 1


def test_weighting_and_the_pca_fold_into_the_table():
    texts = [f"write {w} code for task {i}, answer in json" for i, w in enumerate(["short", "long", "full"] * 9)]
    weighted = random_static(EmbedderConfig(kind="static", weighting="corpus", sif_coefficient=1e-3)).weighted(texts)
    counts = np.bincount([i for row in weighted.token_ids(texts) for i in row], minlength=VOCAB)
    common, unseen = int(np.argmax(counts)), int(np.flatnonzero(counts == 0)[0])
    assert np.allclose(weighted.table[unseen], random_static().table[unseen])  # weight 1: never seen in training
    assert np.linalg.norm(weighted.table[common]) < 0.1 * np.linalg.norm(random_static().table[common])
    pca = PCA(n_components=3, random_state=0).fit(weighted.embed(texts))
    folded = weighted.projected(pca)
    assert folded.table.shape == (VOCAB, 3)
    others = texts[:3] + ["an unseen prompt", ""]
    assert np.allclose(folded.embed(others), pca.transform(weighted.embed(others)), atol=1e-5)


def test_the_teacher_fit_maps_static_vectors_onto_the_teachers():
    texts = [f"task {i}: write {'short' if i % 2 else 'detailed'} notes on topic {i % 5}" for i in range(60)]
    static = random_static(EmbedderConfig(kind="static", weighting="none", ridge=1e-6))
    truth = np.random.default_rng(1).normal(size=(8, 4))
    targets = static.embed(texts) @ truth + 3.0  # a teacher that is a linear map of the static vectors
    fitted = static.fitted_to(texts, targets)
    assert np.allclose(fitted.embed(texts), targets, atol=1e-3)


def test_the_teacher_corpus_is_each_prompts_tail_then_the_segments_before_it():
    config = EmbedderConfig(kind="static", tail_chars=10, teacher_windows=3, teacher_stride=4)
    text = "abcdefghijklmnopqrstuvwxyz"
    assert config.teacher_corpus([text, "short", text]) == ["qrstuvwxyz", "mnopqrstuv", "ijklmnopqr", "short"]
    assert EmbedderConfig(kind="static", tail_chars=10).teacher_corpus([text]) == ["qrstuvwxyz"]
    # a prompt shorter than the stride gives its tail alone; a window never shorter than half a segment
    assert config.teacher_corpus(["abc", "abcdefghijk"]) == ["abc", "bcdefghijk", "abcdefg"]


def test_a_static_featurizer_travels_in_its_state_and_answers_the_same():
    stages = [
        stage(i, f"Write the {['tests', 'docs', 'code'][i % 3]} for module {i}. Answer in JSON.") for i in range(40)
    ]
    config = FeaturizerConfig(pca_dims=4, embedder=STATIC)
    featurizer = Featurizer(config, random_static()).fit(stages)
    restored = Featurizer.from_state(featurizer.state())
    assert restored.static_.table.shape == (VOCAB, 4)
    frame, again = featurizer.transform(stages), restored.transform(stages)
    assert list(frame.filter(like="emb_").columns) == ["emb_0", "emb_1", "emb_2", "emb_3"]
    assert frame.equals(again)
    matrix, _ = restored.matrix(stages, list(frame.columns))
    assert np.allclose(matrix[:, -4:], frame.filter(like="emb_").to_numpy(), atol=1e-6)


def test_one_row_through_the_single_row_api_equals_booster_predict():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 6))
    X[rng.random(X.shape) < 0.1] = np.nan
    y = np.nan_to_num(X[:, 0]) * 2 + rng.normal(size=400)
    booster = lgb.train({"verbosity": -1, "num_threads": 1, "extra_trees": True}, lgb.Dataset(X, y), 50)
    rows = RowPredictor(booster)
    one = np.concatenate([rows(X[i : i + 1]) for i in range(len(X))])
    assert np.array_equal(one, booster.predict(X)) and np.array_equal(rows(X), booster.predict(X))


def test_cue_needles_skip_only_patterns_that_cannot_match():
    texts = [
        "Reply in JSON, keep it brief.",
        "no cues here at all",
        "ſhort and \u212aelvin JſON",
        "ONLY ONE LINE",
        *unicode_texts(200, seed=1),
    ]
    for text in texts:
        cues = _Cues(text)
        for pattern in _NEEDLES:
            assert cues.found(pattern) == int(pattern.search(text) is not None), (text, pattern)
        assert cues.count(BREVITY_CUE) == len(BREVITY_CUE.findall(text))
        assert cues.found(JSON_CUE) == int(bool(JSON_CUE.search(text)))
    assert _Cues("ſhort").count(BREVITY_CUE) == 1  # re's case folding of ſ to s is kept


@pytest.mark.slow
def test_the_distilled_table_is_minilm_on_each_token_alone(tmp_path, monkeypatch):
    import torch
    from transformers import AutoModel, AutoTokenizer

    from pipelines import static_embedding as embedding

    monkeypatch.setattr(embedding, "_TABLES", {})
    table = teacher_table(tmp_path / "static.npz")
    assert table.shape == (VOCAB, 384) and (tmp_path / "static.npz").exists()
    path = embedding.model_path()
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    token = tokenizer.convert_tokens_to_ids("hotel")
    with torch.inference_mode():
        hidden = model(
            input_ids=torch.tensor([[tokenizer.cls_token_id, token, tokenizer.sep_token_id]])
        ).last_hidden_state
    assert np.allclose(table[token], hidden.mean(dim=1)[0].numpy(), atol=1e-4)
    monkeypatch.setattr(embedding, "_TABLES", {})
    monkeypatch.setattr(embedding, "distill_table", lambda: pytest.fail("distilled again instead of read"))
    assert np.array_equal(teacher_table(tmp_path / "static.npz"), table)
    assert re.fullmatch(r"[0-9a-f]{24}", embedding.teacher_digest())


_DISTILL_ROWS = """
import hashlib, sys
from pipelines.static_embedding import distill_table
sys.stdout.write(hashlib.sha256(distill_table(tokens=2048).tobytes()).hexdigest())
"""


@pytest.mark.slow
def test_the_distilled_table_is_the_same_bits_whichever_blas_kernel_runs_it():
    """`dvc repro` on another CPU writes the same features: MKL's AVX2 kernels give other float32 sums than its
    AVX-512 ones (measured on an AMD EPYC), the float64 distillation rounds to the same table. On a CPU without
    AVX-512 both runs take the AVX2 path and agree trivially."""
    import os
    import subprocess
    import sys

    def rows_digest(**env) -> str:
        run = subprocess.run(
            [sys.executable, "-c", _DISTILL_ROWS], env={**os.environ, **env}, capture_output=True, text=True, check=True
        )
        return run.stdout

    assert rows_digest() == rows_digest(MKL_ENABLE_INSTRUCTIONS="AVX2", DNNL_MAX_CPU_ISA="AVX2")


@pytest.mark.slow
def test_a_static_predictor_carries_its_table_and_answers_the_same_after_load(tmp_path, monkeypatch, dev_traces):
    from pipelines import static_embedding
    from pipelines.model import ModelConfig
    from pipelines.predictor import Predictor

    stages = read_traces(dev_traces).stages[:400]
    model = ModelConfig(
        folds=2,
        classifier=dict(n_estimators=20),
        quantile=dict(n_estimators=20),
        regressor=dict(n_estimators=20, extra_trees=True),
    )
    predictor = Predictor.train(stages, FeaturizerConfig(pca_dims=8, embedder=STATIC), model)
    predictor.save(tmp_path / "predictor")
    monkeypatch.setattr(static_embedding, "_TABLES", {})
    monkeypatch.setattr(static_embedding, "distill_table", lambda: pytest.fail("loading distilled MiniLM again"))
    monkeypatch.setattr(static_embedding, "teacher_table", lambda cache=None: pytest.fail("loading the teacher"))
    loaded = Predictor.load(tmp_path / "predictor")
    assert loaded.featurizer.static_.table.shape == (VOCAB, 8)
    assert loaded.predict(stages[-50:]) == predictor.predict(stages[-50:])
    assert [loaded.predict([s]) for s in stages[-20:]] == [predictor.predict([s]) for s in stages[-20:]]


def test_a_normalized_static_embedding_scales_each_mean_to_unit_length_before_its_pca():
    config = EmbedderConfig(kind="static", normalize=True)
    embedder = random_static(config)
    texts = ["list 7 hotels in json", "a much longer prompt " * 20, "", "short"]
    means = random_static().embed(texts)
    norms = np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
    assert np.allclose(embedder.embed(texts), means / norms, atol=1e-6)
    pca = PCA(n_components=3, random_state=0).fit(embedder.embed(texts * 3 + ["other words", "more text here"]))
    projected = StaticEmbedder.from_state(embedder.projected(pca).state())
    assert np.allclose(projected.embed(texts), pca.transform(means / norms), atol=1e-5)
    assert np.allclose(projected.embed([texts[1]]), pca.transform(means[1:2] / norms[1:2]), atol=1e-5)
    with pytest.raises(ValueError, match="normalize and fit_to_teacher"):
        EmbedderConfig(kind="static", normalize=True, fit_to_teacher=True)
