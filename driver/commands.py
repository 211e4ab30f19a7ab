"""`maestro drive`: run catalog workflows, or replay recorded ones (--traces), against a target; write a JSON report."""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    drive = subparsers.add_parser(
        "drive", help="run catalog or recorded workflows end to end against the gateway or vLLM", description=__doc__
    )
    drive.add_argument(
        "--target",
        required=True,
        help="base URL of the gateway or a vLLM server; several gateway "
        "replicas comma-separated: consecutive stages of a workflow go through different ones, and a "
        "call one does not take (connection error, 502, 503) is sent to the next",
    )
    drive.add_argument("--app", default="all", help="catalog app name, or 'all' to draw apps at random")
    drive.add_argument("--workflows", type=int, default=10, help="workflows to run (--traces: the first N of the file)")
    drive.add_argument("--concurrency", type=int, default=4, help="workflows in flight at once")
    drive.add_argument("--json", dest="json_out", required=True, help="report file")
    drive.add_argument("--model", default="tiny", help="model name sent in requests")
    drive.add_argument("--seed", type=int, default=0)
    drive.add_argument("--token-scale", type=float, default=1.0, help="scale the workload model's output lengths")
    drive.add_argument("--max-tokens-cap", type=int, default=4096, help="cap each stage's forced output length")
    drive.add_argument("--max-prompt-chars", type=int, default=4000, help="truncate prompts to fit max-model-len")
    drive.add_argument("--stream", action="store_true", help="stream responses (TTFT measured by the driver)")
    drive.add_argument("--timeout-s", type=float, default=600.0, help="per-request timeout")
    drive.add_argument("--scratch", default=None, help="scratch dir for tools (default: a temp dir)")
    drive.add_argument("--no-tools", action="store_true", help="skip running tools between stages")
    replay = drive.add_argument_group("replaying recorded workflows")
    replay.add_argument(
        "--traces",
        default=None,
        help="a stage-trace contract file (JSONL/Parquet): replay its "
        "workflows (prompts, DAG, recorded lengths, tool waits) instead of catalog ones",
    )
    replay.add_argument(
        "--tasks-from",
        default=None,
        help="replay only the tasks found in this contract file (e.g. the test side of a task-disjoint split)",
    )
    replay.add_argument("--tool-wait-scale", type=float, default=1.0, help="scale the recorded tool time (0: none)")
    replay.add_argument("--max-tool-wait-s", type=float, default=30.0, help="cap one recorded tool wait")
    replay.add_argument("--max-stages", type=int, default=0, help="replay a workflow's first N stages (0: all)")
    replay.add_argument("--workflow-suffix", default="", help="append @SUFFIX to recorded workflow ids")
    drive.add_argument(
        "--declared-max-tokens",
        type=int,
        default=0,
        help="send this max_tokens and force each "
        "stage's length with min_tokens + an end-of-sequence bias (needs --eos-token-id), so the "
        "target does not learn the length from max_tokens",
    )
    drive.add_argument("--eos-token-id", type=int, default=None, help="the served model's end-of-sequence token id")
    drive.add_argument("--cache-salt", default="", help="vLLM cache_salt: no prefix cached by another salt is reused")
    drive.set_defaults(func=run_drive)


def run_drive(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from driver.runner import drive

    try:
        report = asyncio.run(drive(drive_config(args), args.json_out))
    except ValueError as error:  # a bad option, or no workflow to replay: say what, no traceback
        print(f"maestro drive: {error}", file=sys.stderr)
        return 2
    for error in report["trace_errors"][:20]:
        print(f"skipped: {error}")
    print(json.dumps(report["summary"], indent=1))
    return 0 if report["summary"]["num_stages_lost"] == 0 else 1


def drive_config(args: argparse.Namespace):
    from driver.plan import DriveConfig

    return DriveConfig(
        target=args.target,
        app=args.app,
        num_workflows=args.workflows,
        concurrency=args.concurrency,
        model=args.model,
        seed=args.seed,
        token_scale=args.token_scale,
        max_tokens_cap=args.max_tokens_cap,
        max_prompt_chars=args.max_prompt_chars,
        stream=args.stream,
        timeout_s=args.timeout_s,
        scratch=args.scratch,
        run_tools=not args.no_tools,
        traces=args.traces,
        tasks_from=args.tasks_from,
        tool_wait_scale=args.tool_wait_scale,
        max_tool_wait_s=args.max_tool_wait_s,
        max_stages_per_workflow=args.max_stages,
        workflow_suffix=args.workflow_suffix,
        declared_max_tokens=args.declared_max_tokens,
        eos_token_id=args.eos_token_id,
        cache_salt=args.cache_salt,
    )
