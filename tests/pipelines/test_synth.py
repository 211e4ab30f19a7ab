import numpy as np

from maestro.contract import parse_record
from pipelines.catalog import APPS, get_app
from pipelines.synth import WorkflowGenerator, generate


def test_generation_is_seeded_valid_and_labelled_synthetic():
    a, b = generate(300, seed=3), generate(300, seed=3)
    assert a == b and len(a) >= 300
    stages = [parse_record(s) for s in a]
    assert all(s.model_extra["synthetic"] for s in stages)
    assert {s.app for s in stages} <= set(APPS)


def test_mix_is_bimodal_with_short_tool_calls_and_long_answers():
    stages = generate(3000, seed=1)
    tool = np.array([s["output_tokens"] for s in stages if s["is_tool_call"]])
    text = np.array([s["output_tokens"] for s in stages if not s["is_tool_call"]])
    assert 0.2 < len(tool) / len(stages) < 0.6
    assert np.median(tool) < 80 < 150 < np.median(text)
    assert np.quantile(text, 0.99) > 5 * np.median(text)  # heavy tail


def test_prompt_content_drives_the_label():
    """More items asked for in the instruction → longer answers, all else drawn the same way."""

    def mean_tokens(items: int) -> float:
        totals = []
        for seed in range(40):
            gen = WorkflowGenerator(get_app("rag_qa"), np.random.default_rng(seed), seed)
            gen.vars.update(items=items, detail="standard", format="prose")
            answer = [s for s in gen.run() if s["role"] == "answerer"][0]
            assert f"Cover {items} items" in answer["prompt"][-1]["content"]
            totals.append(answer["output_tokens"])
        return float(np.mean(totals))

    assert mean_tokens(12) > 2 * mean_tokens(1)


def test_unknown_app_error_lists_known_apps():
    try:
        get_app("nope")
    except ValueError as error:
        assert "travel_planner" in str(error)
    else:
        raise AssertionError("expected ValueError")
