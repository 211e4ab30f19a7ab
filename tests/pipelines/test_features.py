import numpy as np
import pytest

from maestro.contract import StageTrace
from pipelines.features import Featurizer, FeaturizerConfig, structural_frame


def stage(stage_id, role="coder", parents=(), tokens=None, tool=None, prompt="do it", **extra):
    return StageTrace(
        workflow_id="w",
        stage_id=stage_id,
        role=role,
        prompt=prompt,
        parent_ids=list(parents),
        output_tokens=tokens,
        is_tool_call=tool,
        **extra,
    )


def test_parent_outputs_and_same_role_history_are_features():
    stages = [
        stage("0", tokens=400, tool=False),
        stage("1", role="bash", parents=["0"], tokens=20, tool=True),
        stage("2", parents=["1"]),
        stage("3", role="new", parents=["2"], parent_output_tokens=[77]),
    ]
    frame = structural_frame(stages)
    assert frame.loc[1, "parent_tokens_max"] == 400 and frame.loc[2, "parent_was_tool"] == 1.0
    assert frame.loc[2, "same_role_ancestor_tokens"] == 400
    assert np.isnan(frame.loc[0, "parent_tokens_max"])
    assert frame.loc[3, "parent_tokens_max"] == 77  # live callers send what the parents produced


def test_prompt_text_signals():
    messages = [
        {"role": "system", "content": "You are a planner."},
        {"role": "user", "content": "List 7 hotels. Answer in JSON only. Keep it brief."},
        {"role": "tool", "content": "results..."},
    ]
    row = structural_frame([stage("0", prompt=messages)]).iloc[0]
    assert row["num_messages"] == 3 and row["num_tool_messages"] == 1 and row["last_message_role"] == "tool"
    assert row["tail_max_int"] == 7 and row["tail_mentions_json"] == 1 and row["tail_brevity_words"] >= 1


def test_the_turn_counts_tool_results_since_the_user_spoke():
    messages = [
        {"role": "user", "content": "Change my flight."},
        {"role": "tool", "content": "{}"},
        {"role": "assistant", "content": "Which date?"},
        {"role": "user", "content": "Friday."},
        {"role": "tool", "content": "{}"},
        {"role": "function", "content": "{}"},
    ]
    frame = structural_frame([stage("0", prompt=messages), stage("1", prompt=messages[:4]), stage("2", prompt="text")])
    assert frame["tool_results_since_user"].tolist() == [2, 0, 0]
    assert frame["num_user_messages"].tolist() == [2, 2, 0] and frame.loc[0, "num_tool_messages"] == 3


def test_what_the_prompt_opens_with():
    prompts = {
        "[ChatDev is a software company ...] Write the code.": "head_bracket",
        "main.py\n```python\nimport os\n```\nPlease fix the code above.": "head_code_fence",
        "<Comment>\nThe code is missing an import.</Comment>": "head_comment_tag",
        "<INFO> Finished.\nAnything else?": "head_info_tag",
    }
    frame = structural_frame([stage(str(i), prompt=p) for i, p in enumerate(prompts)])
    flags = ["head_bracket", "head_code_fence", "head_comment_tag", "head_info_tag"]
    for i, expected in enumerate(prompts.values()):
        assert {f for f in flags if frame.loc[i, f] == 1} == {expected}, (i, frame.loc[i, flags].to_dict())
    late = structural_frame([stage("x", prompt="Review this.\n" + "x" * 300 + "```python\n```")]).iloc[0]
    assert late["head_code_fence"] == 0  # code further in is not what the prompt opens with


def test_unseen_and_rare_categories_map_to_unknown_without_embedding():
    train = [stage(str(i), role="coder" if i % 2 else "rare" if i == 0 else "writer") for i in range(12)]
    featurizer = Featurizer(FeaturizerConfig(use_embedding=False, min_category_count=3)).fit(train)
    frame = featurizer.transform([stage("x", role="brand-new"), stage("y", role="rare"), stage("z", role="coder")])
    assert list(frame["role"].astype(str)) == ["unknown", "unknown", "coder"]
    assert featurizer.known_role("coder") and not featurizer.known_role("brand-new")


def test_transform_before_fit_is_an_error():
    with pytest.raises(RuntimeError, match="not fitted"):
        Featurizer(FeaturizerConfig(use_embedding=False)).transform([stage("0")])


@pytest.mark.slow
def test_embedding_features_come_from_minilm_through_pca_and_are_cached():
    prompts = [f"Write a {w} answer about topic {i}" for i, w in enumerate(["short", "long", "detailed"] * 5)]
    stages = [stage(str(i), prompt=p) for i, p in enumerate(prompts)]
    featurizer = Featurizer(FeaturizerConfig(pca_dims=4)).fit(stages)
    frame = featurizer.transform(stages)
    assert [c for c in frame.columns if c.startswith("emb_")] == ["emb_0", "emb_1", "emb_2", "emb_3"]
    vectors = featurizer.embedder.embed(prompts[:2])
    assert vectors.shape == (2, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-3)
    assert len(featurizer.embedder._cache) == len(set(prompts))
