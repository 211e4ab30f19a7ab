"""Run workflows end to end against a target (the gateway or a vLLM server) and report latencies.

Catalog workflows come from `pipelines.synth.WorkflowGenerator` (the documented generative model): their
stages, DAG, prompts and output lengths; after a tool-call stage the tool runs for real (`tools.py`) and its
output replaces the synthetic tool message of the next stage. Recorded workflows (`traces`) come from a contract
file (`replay.py`): their prompts, DAG, recorded lengths, and the recorded tool time as a wait before a child.
A stage becomes one chat call whose length is forced: `max_tokens` = the length with `ignore_eos`, or, with
`declared_max_tokens`, `max_tokens` = that cap (what the target sizes against) and the length forced by
`min_tokens` and an end-of-sequence logit bias. Every stage ends completed or failed with a reason;
`num_stages_lost` must be 0.

`target` may name several gateway replicas (comma-separated): a workflow's consecutive stages start at consecutive
gateways, so a parent and its child go through different ones; a call a gateway does not take (connection error,
502, 503 without Retry-After) is sent again, with the same X-Maestro metadata, to the next gateway, each at most
once. A gateway's idempotency key lives in that gateway's process only: a call retried on another gateway after
the first one died runs again there, even if it had already run behind the dead one.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import zlib
from pathlib import Path

import httpx

from driver.plan import DriveConfig, plan_workflows
from driver.tools import ToolBox

EOS_LOGIT_BIAS = 100  # on the end-of-sequence token once min_tokens are out: the next token ends the answer


class TargetFailed(Exception):
    """A target did not take the call (connection error, 502, 503 without Retry-After): the next one may."""


def _truncate(messages: list[dict], max_chars: int) -> list[dict]:
    """Shorten the longest messages until the prompt fits the engine's context."""
    messages = [dict(m) for m in messages]
    while sum(len(m["content"]) for m in messages) > max_chars:
        longest = max(messages, key=lambda m: len(m["content"]))
        longest["content"] = longest["content"][: max(16, len(longest["content"]) * 2 // 3)]
    return messages


class Driver:
    def __init__(self, config: DriveConfig, tools: ToolBox):
        self.config, self.tools = config, tools
        # Idle connections are dropped after 2 s: uvicorn (gateway, vLLM) closes them after 5 s, and httpx's
        # default expiry is also 5 s, so a connection reused at that moment failed with a ReadError.
        self.client = httpx.AsyncClient(
            timeout=config.timeout_s, limits=httpx.Limits(max_connections=config.concurrency * 8, keepalive_expiry=2.0)
        )
        self.stage_rows: list[dict] = []
        self.started = time.monotonic()  # stage rows' start_s / end_s count from here

    async def run_workflow(self, stages: list[dict]) -> dict:
        started = time.monotonic()
        done = {s["stage_id"]: asyncio.Event() for s in stages}
        tool_outputs: dict[str, str] = {}
        results = await asyncio.gather(*(self._stage(s, stages, done, tool_outputs) for s in stages))
        failed = [r for r in results if r["status"] != "ok"]
        return {
            "workflow_id": stages[0]["workflow_id"],
            "app": stages[0]["app"],
            "num_stages": len(stages),
            "status": "ok" if not failed else "failed",
            "e2e_s": round(time.monotonic() - started, 4),
            "reasons": sorted({r["error"] for r in failed}),
        }

    async def _stage(self, stage: dict, stages: list[dict], done: dict, tool_outputs: dict) -> dict:
        for parent in stage["parent_ids"]:
            await done[parent].wait()
        parent_rows = [
            r
            for r in self.stage_rows
            if r["workflow_id"] == stage["workflow_id"] and r["stage_id"] in stage["parent_ids"]
        ]
        if any(r["status"] != "ok" for r in parent_rows):
            row = self._row(stage, "failed", error="a parent stage failed")
        else:
            await asyncio.sleep(stage.get("wait_s", 0.0))  # a replayed tool's recorded time
            row = await self._call(stage, self._messages(stage, tool_outputs), stages.index(stage))
            if row["status"] == "ok" and stage["is_tool_call"] and self.config.run_tools and not self.config.traces:
                await self._run_tool(stage, row, tool_outputs)
        self.stage_rows.append(row)
        done[stage["stage_id"]].set()
        return row

    def _messages(self, stage: dict, tool_outputs: dict) -> list[dict]:
        messages = [dict(m) for m in stage["prompt"]]
        real = [tool_outputs[p] for p in stage["parent_ids"] if p in tool_outputs]
        if real and messages[-1]["role"] == "tool":
            messages[-1]["content"] = real[-1][:1200]
        return _truncate(messages, self.config.max_prompt_chars)

    async def _run_tool(self, stage: dict, row: dict, tool_outputs: dict) -> None:
        name = json.loads(stage["output_text"])["name"]
        try:
            output, seconds = await self.tools.run(name)
        except Exception as error:  # noqa: BLE001 — a broken tool is reported, the workflow goes on
            output, seconds = f"tool {name} failed: {error}", 0.0
        tool_outputs[stage["stage_id"]] = output
        row.update(tool=name, tool_exec_s=round(seconds, 4))

    def _headers(self, stage: dict) -> dict:
        return {
            "X-Maestro-Workflow": stage["workflow_id"],
            "X-Maestro-Stage": stage["stage_id"],
            "X-Maestro-Role": stage["role"],
            "X-Maestro-App": stage["app"],
            "X-Maestro-Parents": ",".join(stage["parent_ids"]),
            "X-Maestro-Interactive": "true" if stage["interactive"] else "false",
            "X-Maestro-Tool-Call": "true" if stage["is_tool_call"] else "false",
        }

    def _length(self, stage: dict) -> dict:
        """Request fields forcing the stage's length; with a declared cap the target sees only that cap."""
        if not self.config.declared_max_tokens:
            return {"max_tokens": stage["max_tokens"], "ignore_eos": True}
        return {
            "max_tokens": self.config.declared_max_tokens,
            "min_tokens": stage["max_tokens"] - 1,
            "logit_bias": {str(self.config.eos_token_id): EOS_LOGIT_BIAS},
        }  # the end token is counted

    def _targets(self, stage: dict, position: int) -> list[str]:
        """The targets in the order tried for a workflow's `position`-th stage: consecutive stages start at
        consecutive targets (a parent and its child go through different gateways), then the others in turn."""
        targets = self.config.targets
        first = (zlib.crc32(stage["workflow_id"].encode()) + position) % len(targets)
        return list(targets[first:] + targets[:first])

    async def _call(self, stage: dict, messages: list[dict], position: int) -> dict:
        """The stage on its first target, or on the next one each time a target does not take it."""
        body = {"model": self.config.model, "messages": messages, **self._length(stage), "stream": self.config.stream}
        if self.config.cache_salt:
            body["cache_salt"] = self.config.cache_salt
        started, failures = time.monotonic(), []
        for target in self._targets(stage, position):
            try:
                row = await self._call_target(target, stage, body, started)
            except TargetFailed as error:
                failures.append((target, str(error)))
                continue
            failed_over = [f"{t}: {e}" for t, e in failures]
            return {**row, "target": target, **({"failed_over": failed_over} if failures else {})}
        if len(failures) == 1:
            return self._row(stage, "failed", started, error=failures[0][1], target=failures[0][0])
        return self._row(
            stage,
            "failed",
            started,
            error=f"every target failed ({len(failures)} tried): " + "; ".join(f"{t}: {e}" for t, e in failures),
        )

    async def _call_target(self, target: str, stage: dict, body: dict, started: float) -> dict:
        """The stage's answer from `target`, following its busy answers (429/503 with Retry-After)."""
        for _ in range(self.config.max_busy_retries):
            try:
                row = await self._send(target, stage, body, started)
            except httpx.HTTPError as error:
                raise TargetFailed(f"transport: {type(error).__name__}: {error}") from error
            if row is not None:
                return row
        return self._row(stage, "failed", started, error="target stayed busy (429/503) past the retry budget")

    async def _send(self, target: str, stage: dict, body: dict, started: float) -> dict | None:
        """One attempt; None when the target said busy (after waiting its Retry-After)."""
        if self.config.stream:
            return await self._send_stream(target, stage, body, started)
        response = await self.client.post(f"{target}/v1/chat/completions", json=body, headers=self._headers(stage))
        if await _is_busy(response):
            return None
        if response.status_code != 200:
            return self._refused(stage, started, response.status_code, response.text)
        usage = response.json().get("usage") or {}
        return self._row(stage, "ok", started, usage=usage, node=response.headers.get("x-maestro-node"))

    async def _send_stream(self, target: str, stage: dict, body: dict, started: float) -> dict | None:
        body = {**body, "stream_options": {"include_usage": True}}
        url, usage, ttft = f"{target}/v1/chat/completions", {}, None
        async with self.client.stream("POST", url, json=body, headers=self._headers(stage)) as response:
            if await _is_busy(response):
                return None
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return self._refused(stage, started, response.status_code, text)
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    return self._row(stage, "failed", started, error=f"stream error: {chunk['error']}")
                ttft = ttft or (time.monotonic() - started if chunk.get("choices") else None)
                usage = chunk.get("usage") or usage
        return self._row(stage, "ok", started, usage=usage, ttft_s=ttft, node=response.headers.get("x-maestro-node"))

    def _refused(self, stage: dict, started: float, status_code: int, text: str) -> dict:
        """A non-200 answer as a failed row; raises TargetFailed where another target may take the call."""
        error = f"HTTP {status_code}: {text[:200]}"
        if status_code in (502, 503):
            raise TargetFailed(error)
        return self._row(stage, "failed", started, error=error)

    def _row(
        self,
        stage: dict,
        status: str,
        started: float | None = None,
        error: str | None = None,
        usage: dict | None = None,
        **extra,
    ) -> dict:
        row = {
            "workflow_id": stage["workflow_id"],
            "stage_id": stage["stage_id"],
            "role": stage["role"],
            "app": stage["app"],
            "status": status,
            "max_tokens": stage["max_tokens"],
            "is_tool_call_planned": stage["is_tool_call"],
        }
        if started is not None:
            now = time.monotonic()
            row.update(
                latency_s=round(now - started, 5),
                start_s=round(started - self.started, 5),
                end_s=round(now - self.started, 5),
            )
        if usage:
            row.update(output_tokens=usage.get("completion_tokens"), prompt_tokens=usage.get("prompt_tokens"))
        if error:
            row["error"] = error
        return {**row, **{k: v for k, v in extra.items() if v is not None}}

    async def close(self) -> None:
        await self.client.aclose()


async def _is_busy(response: httpx.Response) -> bool:
    """A 429/503 with Retry-After: the target is busy; waits that long (the caller tries it again)."""
    if response.status_code in (429, 503) and "retry-after" in response.headers:
        await asyncio.sleep(float(response.headers["retry-after"]))
        return True
    return False


async def drive(config: DriveConfig, json_out: str | Path | None = None) -> dict:
    """Run the workflows (at most `concurrency` at once) and return (and write) the report."""
    from driver.report import build_report

    workflows, trace_errors = plan_workflows(config)
    with tempfile.TemporaryDirectory(prefix="maestro-drive-") as tmp:
        driver = Driver(config, ToolBox(config.scratch or tmp).setup())
        gate = asyncio.Semaphore(config.concurrency)

        async def one(stages):
            async with gate:
                return await driver.run_workflow(stages)

        started = time.monotonic()
        try:
            workflow_rows = await asyncio.gather(*(one(w) for w in workflows))
        finally:
            await driver.close()
    report = build_report(config, workflows, workflow_rows, driver.stage_rows, time.monotonic() - started)
    report["summary"]["num_trace_lines_unused"] = len(trace_errors)
    report["trace_errors"] = trace_errors
    report["plan"] = [
        [{k: v for k, v in stage.items() if k not in ("prompt", "output_text")} for stage in stages]
        for stages in workflows
    ]
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(report, indent=1))
    return report
