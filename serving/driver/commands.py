"""`maestro drive`: run catalog workflows against a target and write a JSON report."""
from __future__ import annotations

import argparse


def register_drive(subparsers) -> None:
    drive = subparsers.add_parser("drive", help="run catalog workflows end to end against the gateway or vLLM",
                                  description=__doc__)
    drive.add_argument("--target", required=True, help="base URL of the gateway or a vLLM server")
    drive.add_argument("--app", default="all", help="catalog app name, or 'all' to draw apps at random")
    drive.add_argument("--workflows", type=int, default=10)
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
    drive.set_defaults(func=run_drive)


def run_drive(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from serving.driver.runner import DriveConfig, drive

    config = DriveConfig(target=args.target, app=args.app, num_workflows=args.workflows,
                         concurrency=args.concurrency, model=args.model, seed=args.seed,
                         token_scale=args.token_scale, max_tokens_cap=args.max_tokens_cap,
                         max_prompt_chars=args.max_prompt_chars, stream=args.stream, timeout_s=args.timeout_s,
                         scratch=args.scratch, run_tools=not args.no_tools)
    report = asyncio.run(drive(config, args.json_out))
    print(json.dumps(report["summary"], indent=1))
    return 0 if report["summary"]["num_stages_lost"] == 0 else 1
