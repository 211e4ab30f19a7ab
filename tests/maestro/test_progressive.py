"""Progressive re-prediction (maestro/progressive.py): the prefix class, the table's runtime form without the training
libraries, the parametric fallback, and one function for the simulator, the plugin and the batch-cost gate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from maestro.contract import StageTrace
from maestro.prediction import OutputSize
from maestro.progressive import (
    PREFIX_CLASSES,
    TABLE_FILE,
    ProgressiveTable,
    length_bounds,
    length_median,
    load_table,
    parametric_bounds,
    prefix_chars,
    prefix_class,
)
from pipelines.progressive import ProgressiveConfig, checkpoint_rows, fit_table
from serving.core.admission.batch_cost import remaining_tokens
from serving.sim.slot import output_prefix, running_stage
from serving.sim.workload import SimStage
from serving.vllm_plugin.engine_pace import EnginePace
from serving.vllm_plugin.hints import MaestroHints, output_bounds
from serving.vllm_plugin.progress import OutputProgress, tokens_to_read

ROOT = Path(__file__).resolve().parents[2]
TOOL_TEXT = '{"name": "get_order_details", "arguments": {"order_id": "#W2378156"}}'
PROSE_TEXT = "I understand your concern about the delayed order. Let me look into what happened with the delivery."


@pytest.mark.parametrize(
    "text, expected",
    [
        (TOOL_TEXT, "tool"),
        ("[tool call] find_user_id_by_email(...)", "tool"),
        ("<tool_call>\n{", "tool"),
        ("[too", "tool"),  # a marker's first characters
        (PROSE_TEXT, "prose"),
        ("[synthetic free text, coder]", "prose"),
        ("main.py\n```python\nimport", "code"),
        ("<INFO> Finished", "tag"),
        ("###STOP###", "tag"),
        ("", "unknown"),
        (None, "unknown"),
    ],
)
def test_the_prefix_class_tells_a_tool_calls_json_from_prose(text, expected):
    assert prefix_class(text) == expected


def test_a_running_stages_class_reads_neither_its_length_nor_text_it_had_not_produced(table):
    """The simulator and the training rows read a stage's class at k tokens from its trace's text: the same class
    whatever its length, and whatever its text says past what k tokens made (a code fence far into a prose answer)."""
    start = "Sure. Here is the plan you asked for, "

    def sim(text: str, tokens: int) -> SimStage:
        return SimStage(
            workflow=None, index=0, stage_id="s", role="agent", model="m", parents=[], output_tokens=tokens,
            is_tool_call=False, source={"output_text": text}, size=OutputSize(tokens_pred=100, tokens_reserve=300),
            progressive=table,
        )  # fmt: skip

    variants = [(start + "step by step, in prose.", 20), (start + "```python\nimport os", 20), (start, 4000)]
    for k in (4, 8, 16):
        assert len({prefix_chars(text, k) for text, _ in variants}) == 1
        assert {output_prefix(sim(text, tokens), k) for text, tokens in variants} == {"prose"}
    traces = [
        StageTrace(workflow_id="w", stage_id=f"s{i}", role="agent", prompt="p", output_tokens=tokens, output_text=text)
        for i, (text, tokens) in enumerate(variants)
    ]
    rows = checkpoint_rows(traces, np.array([[100.0, 300.0]] * len(traces)), checkpoints=(4, 8, 16))
    assert set(rows["prefix"]) == {"prose"}


def rows_with_short_tool_calls(num: int = 3000, seed: int = 0) -> pd.DataFrame:
    """Checkpoint rows where a tool call ends near 30 tokens and prose near 300, whatever the prediction (100)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(num):
        is_tool = i % 2 == 0
        total = int(np.exp(rng.normal(np.log(30 if is_tool else 300), 0.3))) + 9
        for k in (k for k in (4, 8, 16, 32, 64, 128) if k < total):
            rows.append(
                {
                    "stage": i,
                    "app": "a",
                    "produced": k,
                    "tokens": total,
                    "prefix": "tool" if is_tool else "prose",
                    "log_produced": np.log(k),
                    "log_ahead": np.log(100 / k),
                    "log_spread": np.log(3.0),
                    "target": np.log(total / max(100, k)),
                }
            )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def table() -> ProgressiveTable:
    config = ProgressiveConfig(n_estimators=60, checkpoints=(4, 8, 16, 32, 64, 128))
    return fit_table(rows_with_short_tool_calls(), config)


def test_the_learned_table_reads_the_prefix_and_round_trips_as_json(table):
    tool, prose, bare = (length_bounds(8, 100, 300, table=table, prefix=p) for p in ("tool", "prose", "unknown"))
    assert tool.median < 50 < 200 < prose.median  # the class moves the median the prediction alone cannot
    assert tool.median < bare.median < prose.median  # without the class: between the two
    assert tool.low <= tool.median <= tool.upper and prose.upper > prose.median
    again = ProgressiveTable.from_json(table.to_json())
    assert length_bounds(8, 100, 300, table=again, prefix="tool") == tool
    with pytest.raises(ValueError, match="axes and values"):
        ProgressiveTable.from_json(json.dumps({**json.loads(table.to_json()), "values": [[1.0]]}))


def test_without_a_table_the_parametric_bounds_answer(tmp_path):
    assert load_table(tmp_path) is None  # a predictor directory saved before it had one
    hints = MaestroHints(tokens_pred=100, tokens_reserve=400)
    for produced in (0, 30, 150, 900):
        bounds = length_bounds(produced, 100, 400, hints.reserve_level, load_table(tmp_path))
        assert (bounds.median, bounds.upper) == parametric_bounds(produced, 100, 400) == output_bounds(produced, hints)
        assert bounds.low == 100 * 100 / 400
    assert parametric_bounds(30, 100, 400) == (100, 400)  # under its median the prediction stands


def test_under_min_produced_the_prediction_stands_with_a_table(table):
    assert (length_bounds(2, 100, 300, table=table, prefix="tool").median,) == (100,)


def test_the_runtime_form_answers_without_pandas_lightgbm_or_sklearn(table, tmp_path):
    """What the vLLM plugin imports loads the table and answers in a process that never imports the training
    libraries (vLLM's own environment has none of them)."""
    (tmp_path / TABLE_FILE).write_text(table.to_json())
    code = f"""
import sys
from maestro.progressive import load_table, length_bounds
from serving.vllm_plugin.progress import OutputProgress
from serving.vllm_plugin.hints import MaestroHints
progress = OutputProgress(load_table({str(tmp_path)!r}), decode=lambda ids: {TOOL_TEXT!r})
request = type("R", (), dict(request_id="r", output_token_ids=list(range(8)), num_output_tokens=8,
                             num_prompt_tokens=10, max_tokens=4096))()
left = progress.remaining_tokens(request, MaestroHints(tokens_pred=100, tokens_reserve=300))
loaded = sorted(m for m in ("pandas", "lightgbm", "sklearn") if m in sys.modules)
print(left, loaded)
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    left, loaded = out.stdout.split(" ", 1)
    assert loaded.strip() == "[]"
    assert 0 < int(left) < 100 - 8  # the tool call's short rest, not the prediction's


def test_the_simulator_and_the_plugin_give_the_gate_the_same_re_prediction(table):
    """One running stage described by the simulator (its trace's text) and by the plugin (its output tokens, decoded)
    reaches the gate as the same RunningStage and the same remaining tokens, the learned ones."""
    stage = SimStage(
        workflow=None,
        index=0,
        stage_id="s",
        role="agent",
        model="m",
        parents=[],
        output_tokens=40,
        is_tool_call=True,
        source={"output_text": TOOL_TEXT},
        size=OutputSize(tokens_pred=100, tokens_reserve=300),
        progressive=table,
        request=SimpleNamespace(deadline_s=50.0, interactive=False),
        start_s=1.0,
    )
    simulated = running_stage(stage, 16)
    progress = OutputProgress(table, decode=lambda ids: TOOL_TEXT[: len(ids) * 2])
    prefix = progress.prefix("r", list(range(16)))
    pace = EnginePace()
    pace.started("r", 1.0, 0)
    live = pace.node_state(
        2.0, [("r", MaestroHints(tokens_pred=100, tokens_reserve=300, deadline_s=50.0), 0.0, 16, prefix)], table
    ).running[0]
    assert (simulated.prefix, live.prefix) == ("tool", "tool")
    assert simulated == live
    learned = remaining_tokens(100, 300, 16, table=table, prefix="tool")
    assert learned != remaining_tokens(100, 300, 16)  # the table is what answers, not the parametric bound
    for running in (simulated, live):
        assert (
            remaining_tokens(
                running.tokens_pred,
                running.tokens_reserve,
                running.produced,
                table=running.progressive,
                prefix=running.prefix,
            )
            == learned
        )


def test_the_plugin_reads_the_class_at_powers_of_two_and_forgets_it(table):
    decoded = []
    progress = OutputProgress(table, decode=lambda ids: decoded.append(len(ids)) or PROSE_TEXT)
    for count in range(1, 60):
        progress.prefix("r", list(range(count)))
    assert decoded == [1, 2, 4, 8, 16, 32] and [tokens_to_read(n) for n in (0, 3, 33)] == [0, 2, 32]
    progress.forget("r")
    assert "r" not in progress.prefixes
    assert OutputProgress(table).prefix("r", [1, 2, 3, 4]) == "unknown"  # no tokenizer: the class is not read
    assert set(PREFIX_CLASSES) >= {progress.prefix("q", [1] * 8)}


def test_the_median_alone_is_the_bounds_median(table):
    # the batch-cost gate reads only the median of every running stage (`length_median`): the same number
    for source in (table, None):
        for produced in (0.0, 3.0, 17.5, 64.0, 300.0, 5000.0):
            for pred, reserve in ((1, 1), (40, 40), (40, 400), (900, 2000)):
                for prefix in PREFIX_CLASSES:
                    bounds = length_bounds(produced, pred, reserve, table=source, prefix=prefix)
                    assert length_median(produced, pred, reserve, table=source, prefix=prefix) == bounds.median
