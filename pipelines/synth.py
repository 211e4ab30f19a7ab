"""SYNTHETIC sample traces from the workload catalog, with an explicit generative model of the labels.

Every stage written here is synthetic (`"synthetic": true` on each line). The labels follow this
model, so that what a predictor can learn from the prompt is known:

1. A workflow draws task variables: `items` k ∈ [1, 12] (options, questions, quarters ...),
   `days` ∈ [2, 10], `detail` ∈ {brief ×0.5, standard ×1, detailed ×2.2} and `format`
   ∈ {json ×0.6, bullets ×0.85, prose ×1}; all of them are written into the prompt's instruction.
   A per-workflow verbosity factor v ~ LogNormal(0, 0.15) stands for the model's own style.
2. A role with tools loops: it needs n ~ 1 + Poisson(role mean) tool results; while it has fewer,
   it calls a tool with probability `tool_p` (else answers early). Each tool result is appended
   to the prompt as a `tool` message, so the last message tells the model where it stands.
3. A tool call emits 14 + 7·(#parameters) tokens of JSON (+ code for edit_file / run_python /
   run_sql: LogNormal means 120 / 90 / 40), × LogNormal(0, 0.2).
4. A free-text answer emits (base + per_item·k')·detail·format·v + digest·context_tokens,
   × LogNormal(0, 0.3), where k' is `days` for the itinerary and k otherwise, and
   context_tokens is what the parents produced (documents to summarise). With probability 0.04
   a heavy tail multiplies it by Pareto(1.6). Everything is capped at max_tokens = 4096.
5. A tool runs for LogNormal(mean = tool.exec_s_mean, σ = 0.6) seconds on the host CPU
   (`tool_exec_s` on the stage that called it).
"""

from __future__ import annotations

import json
import math

import numpy as np
from tqdm import tqdm

from pipelines.agent_tools import TOOLS
from pipelines.app_spec import App, Role, StageSpec
from pipelines.catalog import APPS

MAX_TOKENS = 4096
DETAIL = {"brief": 0.5, "standard": 1.0, "detailed": 2.2}
FORMAT = {"json": 0.6, "bullets": 0.85, "prose": 1.0}
FORMAT_TEXT = {"json": "Answer in JSON only.", "bullets": "Use bullet points.", "prose": "Write in full sentences."}
CODE_TOKENS = {"edit_file": 120, "run_python": 90, "run_sql": 40}
TOOL_NEEDS = {"search": 0.3, "bash": 5.0, "test": 5.0, "file": 5.0, "sql": 0.8, "python": 0.8, "api": 0.7}
CITIES = ["Paris", "Tokyo", "Lisbon", "Denver", "Nairobi", "Seoul", "Austin", "Oslo", "Lima", "Hanoi"]
FILL = dict(
    module=["parser", "scheduler", "auth", "billing", "cache", "cli"],
    symptom=["empty input", "unicode names", "a timeout", "concurrent writes"],
    feature=["pagination", "retries", "a dry-run flag"],
    error=["KeyError", "TypeError", "a deadlock"],
    topic=["remote work", "data retention", "travel expenses", "security"],
    metric=["revenue", "churn", "latency", "signups"],
    dimension=["region", "plan", "channel"],
)
WORDS = (
    "the of results option price review summary detail analysis data record value flight hotel "
    "test file line error order customer report item step note query table chart"
).split()


def _text(rng: np.random.Generator, tokens: int) -> str:
    """Filler text of roughly `tokens` tokens (≈ 0.75 words each) standing for real content."""
    return " ".join(rng.choice(WORDS, size=max(1, int(tokens * 0.75))))


class WorkflowGenerator:
    """Turns one app request into contract stages, following the model in the module docstring."""

    def __init__(self, app: App, rng: np.random.Generator, index: int):
        self.app, self.rng, self.index = app, rng, index
        self.wid = f"synthetic/{app.name}/{index:06d}"
        self.vars = self._draw_vars()
        self.task = rng.choice(app.tasks).format(**self.vars)
        self.model = str(rng.choice(app.models))
        self.verbosity = float(rng.lognormal(0.0, 0.15))
        self.stages: list[dict] = []
        self.last_of: dict[str, str] = {}
        self.produced: dict[str, int] = {}

    def _draw_vars(self) -> dict:
        r = self.rng
        fill = {k: str(r.choice(v)) for k, v in FILL.items()}
        return dict(
            fill,
            items=int(r.integers(1, 13)),
            days=int(r.integers(2, 11)),
            people=int(r.integers(1, 6)),
            budget=int(r.integers(5, 60)) * 100,
            city_a=str(r.choice(CITIES)),
            city_b=str(r.choice(CITIES)),
            order=f"A{r.integers(10000, 99999)}",
            detail=str(r.choice(list(DETAIL), p=[0.3, 0.45, 0.25])),
            format=str(r.choice(list(FORMAT), p=[0.25, 0.35, 0.4])),
        )

    def run(self) -> list[dict]:
        for spec in self.app.stages:
            self._run_spec(spec)
        return self.stages

    def _instruction(self, role: Role) -> str:
        v = self.vars
        count = v["days"] if role.name == "itinerary_planner" else v["items"]
        unit = "days" if role.name == "itinerary_planner" else "items"
        return f"Cover {count} {unit}. Level of detail: {v['detail']}. {FORMAT_TEXT[v['format']]}"

    def _run_spec(self, spec: StageSpec) -> None:
        role = self.app.roles[spec.role]
        parents = [self.last_of[p] for p in spec.parents]
        context = sum(self.produced[p] for p in parents)
        messages = self._base_messages(role, parents)
        needed = 1 + self.rng.poisson(TOOL_NEEDS[TOOLS[role.tools[0]].kind]) if role.tools else 0
        needed = min(needed, spec.max_tool_rounds)
        done = 0
        while True:
            wants_tool = done < needed and self.rng.random() < role.tool_p
            stage = self._emit(role, messages, parents, wants_tool, context)
            parents = [stage["stage_id"]]
            if not wants_tool:
                break
            done += 1
            result_tokens = int(self.rng.lognormal(math.log(60 + 40 * self.vars["items"]), 0.5))
            context += result_tokens
            messages = messages + [
                {"role": "assistant", "content": stage["output_text"]},
                {"role": "tool", "content": _text(self.rng, min(result_tokens, 300))},
            ]
        self.last_of[spec.key] = stage["stage_id"]
        self.produced[stage["stage_id"]] = context + stage["output_tokens"]

    def _base_messages(self, role: Role, parents: list[str]) -> list[dict]:
        system = role.system_prompt
        if role.tools:
            system += "\nTools:\n" + json.dumps([TOOLS[t].schema() for t in role.tools])
        user = f"Request: {self.task}."
        if parents:
            shown = min(300, sum(self.produced[p] for p in parents))
            user += f"\nContext from previous agents:\n{_text(self.rng, shown)}"
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": f"{user}\n{self._instruction(role)}"},
        ]

    def _emit(self, role: Role, messages: list[dict], parents: list[str], is_tool: bool, context: int) -> dict:
        tokens, text, tool = self._tool_call(role) if is_tool else self._answer(role, context)
        tokens = int(min(MAX_TOKENS, max(1, tokens)))
        stage = dict(
            workflow_id=self.wid,
            stage_id=str(len(self.stages)),
            app=self.app.name,
            role=role.name,
            model=self.model,
            parent_ids=parents,
            interactive=self.app.interactive,
            n_tools=len(role.tools),
            tool_names=list(role.tools),
            prompt=messages,
            output_tokens=tokens,
            is_tool_call=is_tool,
            output_text=text,
            finish_reason="length" if tokens >= MAX_TOKENS else ("tool_calls" if is_tool else "stop"),
            synthetic=True,
        )
        if tool is not None:
            stage["tool_exec_s"] = round(float(self.rng.lognormal(math.log(tool.exec_s_mean), 0.6)), 4)
        self.stages.append(stage)
        return stage

    def _tool_call(self, role: Role) -> tuple[float, str, object]:
        tool = TOOLS[str(self.rng.choice(role.tools))]
        extra = CODE_TOKENS.get(tool.name, 0)
        code = self.rng.lognormal(math.log(extra), 0.5) if extra else 0.0
        tokens = (14 + 7 * len(tool.parameters["properties"]) + code) * self.rng.lognormal(0.0, 0.2)
        return tokens, json.dumps({"name": tool.name, "arguments": list(tool.parameters["properties"])}), tool

    def _answer(self, role: Role, context: int) -> tuple[float, str, None]:
        v = self.vars
        count = v["days"] if role.name == "itinerary_planner" else v["items"]
        body = (role.text_base_tokens + role.tokens_per_item * count) * DETAIL[v["detail"]] * FORMAT[v["format"]]
        tokens = (body * self.verbosity + role.digest_ratio * context) * self.rng.lognormal(0.0, 0.3)
        if self.rng.random() < 0.04:
            tokens *= self.rng.pareto(1.6) + 1.0
        return tokens, f"[synthetic free text, {role.name}]", None


def generate(num_stages: int, seed: int, apps: list[str] | None = None) -> list[dict]:
    """Generate whole workflows of randomly drawn apps, until at least `num_stages` stages exist."""
    rng = np.random.default_rng(seed)
    names = apps or sorted(APPS)
    stages: list[dict] = []
    arrival_s = 0.0
    with tqdm(total=num_stages, desc="generating synthetic traces", unit="stage") as bar:
        while len(stages) < num_stages:
            app = APPS[str(rng.choice(names))]
            arrival_s += float(rng.exponential(0.5))
            workflow = WorkflowGenerator(app, rng, len(stages)).run()
            for index, stage in enumerate(workflow):
                stage.update(call_index=index, arrival_s=round(arrival_s, 3))
            stages.extend(workflow)
            bar.update(len(workflow))
    return stages
