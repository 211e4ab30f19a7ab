"""The batch path of the features (pipelines.batch_features) gives exactly what the per-stage rows give."""

import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from maestro.contract import StageTrace, read_traces
from pipelines.batch_features import structural_columns
from pipelines.boosters import as_matrix
from pipelines.features import Featurizer, FeaturizerConfig
from pipelines.history import hide_labels
from pipelines.stage_features import ASCII_FOLDS, stage_rows
from pipelines.synth import generate

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
# Pieces the cue patterns look for, pieces that nearly match, and characters that test the word boundaries and
# IGNORECASE's folds: random texts are drawn from them
PIECES = [
    "json",
    "JSON",
    "xjson",
    "json_",
    "tool result",
    "Function_Output",
    "response from calling tool",
    "Response from calling function",
    '"role": "tool"',
    "<INFO>",
    "finished",
    "Terminate",
    "final answer",
    "only one line",
    "one word",
    "brief",
    "Short",
    "concise",
    "phone line",
    "single word",
    "ONLY",
    "detailed",
    "full",
    "complete",
    "all",
    "call",
    "every",
    "Comprehensive",
    "code",
    "codes",
    "suggested tool call",
    "Suggested Function Call",
    "[...]",
    "```",
    "?",
    " ? ",
    "\n",
    " ",
    "  ",
    "_",
    "-",
    ".",
    "7",
    "42",
    "100",
    "101",
    "1234",
    "٣",
    "00",
    "<comment>",
    "[",
    "é",
    "ß",
    "Σ",
    "İ",
    "ı",
    "ſ",
    "K",
    "\x00",
    "Ⓐll",
    "ǅ",
]


def random_text(rng: random.Random, pieces: int) -> str:
    return "".join(rng.choice(PIECES) + rng.choice(["", "", " ", "a", "\n"]) for _ in range(pieces))


def random_stages(seed: int, n: int = 300) -> list[StageTrace]:
    """Stages of a few workflows with random prompts, plain text or chat messages, some long (tails cut)."""
    rng, stages = random.Random(seed), []
    for i in range(n):
        workflow = f"w{i % 7}"
        text = random_text(rng, rng.choice([0, 1, 5, 40, 200]))
        prompt = (
            text
            if rng.random() < 0.6
            else [
                {"role": rng.choice(["system", "user", "assistant", "tool"]), "content": random_text(rng, 8)}
                for _ in range(rng.randint(0, 6))
            ]
            + [{"role": "user", "content": text}]
        )
        earlier = [s.stage_id for s in stages if s.workflow_id == workflow]
        parents = rng.sample(earlier, min(len(earlier), rng.randint(0, 2)))
        stages.append(
            StageTrace(
                workflow_id=workflow,
                stage_id=f"s{i}",
                role=rng.choice(["a", "b", "c"]),
                prompt=prompt,
                parent_ids=parents,
                output_tokens=rng.choice([None, 0, 7, 300]),
                is_tool_call=rng.choice([None, True, False]),
            )
        )
    return stages


def assert_same_features(stages: list[StageTrace]) -> None:
    rows = stage_rows([s.model_copy(deep=True) for s in stages])
    columns = structural_columns([s.model_copy(deep=True) for s in stages])
    assert list(columns) == list(rows[0])
    for name, column in columns.items():
        expected = [row[name] for row in rows]
        if isinstance(column, list):
            assert column == expected, name
        else:
            np.testing.assert_array_equal(column, np.array(expected, np.float64), err_msg=name)


def real_stages() -> list[StageTrace]:
    files = sorted((DATA / "dev-traces").glob("*.jsonl")) + sorted((DATA / "agent-traces").glob("*.jsonl"))
    if not files:
        pytest.skip(f"no traces under {DATA}")
    return [stage for file in files for stage in read_traces(file).stages]


@pytest.mark.slow
def test_the_batch_columns_are_the_rows_on_real_traces():
    stages = real_stages()
    assert_same_features(stages)
    assert_same_features(hide_labels(stages, 0.5, seed=1))  # part of the history hidden


def test_the_batch_columns_are_the_rows_on_synthetic_traces():
    stages = [StageTrace.model_validate(s) for s in generate(400, seed=11)]
    assert_same_features(stages)
    assert_same_features(hide_labels(stages, 1.0, seed=2))


@pytest.mark.parametrize("seed", range(4))
def test_the_batch_columns_are_the_rows_on_random_prompts(seed):
    stages = random_stages(seed)
    assert any(ASCII_FOLDS.search(s.prompt_text()) for s in stages)  # the one-by-one fallback is exercised
    assert_same_features(stages)


def test_lowercasing_keeps_each_character_one_character_of_its_word_class():
    """What searching lowercased text relies on (pipelines.batch_features), for every code point but the folds."""
    word = re.compile(r"\w")
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        if ASCII_FOLDS.match(char):
            continue
        lower = char.lower()
        assert len(lower) == 1 and bool(word.match(char)) == bool(word.match(lower)), hex(code)
        assert not (lower.isascii() and not char.isascii()), hex(code)  # no ASCII out of non-ASCII


def test_the_live_matrix_of_a_batch_and_of_one_stage_is_the_frames():
    """Featurizer.matrix (several stages: the batch path; one stage: the live path, a dict of one-value columns read
    into one row) against Featurizer.transform (the per-stage rows)."""
    stages = [StageTrace.model_validate(s) for s in generate(300, seed=4)] + random_stages(9, 120)
    featurizer = Featurizer(FeaturizerConfig(use_embedding=False)).fit(stages)
    frame = featurizer.transform([s.model_copy(deep=True) for s in stages])
    categories = [featurizer.categories_[c] for c in frame.columns if c in featurizer.categories_]
    matrix, roles = featurizer.matrix([s.model_copy(deep=True) for s in stages], list(frame.columns))
    np.testing.assert_array_equal(matrix, as_matrix(frame, categories))
    assert roles == [str(r) for r in frame["role"]]
    for stage in stages[::7]:  # alone: no ancestor in the call, so its own frame is the reference
        one = featurizer.transform([stage.model_copy(deep=True)])
        row, role = featurizer.matrix([stage.model_copy(deep=True)], list(frame.columns))
        assert row.shape == (1, len(frame.columns)) and row.flags.c_contiguous
        np.testing.assert_array_equal(row, as_matrix(one, categories))
        assert role == [str(one["role"].iloc[0])]
