"""A load test's accounting (benchmarks/gateway/loadtest.py): how the requests sent to a target ended, the peak
memory of each process tree, the connections the kernel dropped, and the gateway's trace lines against the stages
sent (one each: none lost, none duplicated)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

BUSY = (429, 503)


class RssSampler(threading.Thread):
    """Peak RSS (MiB) of each named process tree, sampled every second."""

    def __init__(self, pids: dict[str, int]):
        super().__init__(daemon=True)
        self.pids, self.samples, self.stop_event = pids, [], threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(1.0):
            self.samples.append({"t": time.monotonic(), **{name: tree_rss_mib(pid) for name, pid in self.pids.items()}})

    def summary(self, since: float) -> dict:
        window = [s for s in self.samples if s["t"] >= since]
        third = max(1, len(window) // 3)
        return (
            {
                name: {
                    "peak_mib": max(s[name] for s in self.samples),
                    "overload_first_third_mib": round(max(s[name] for s in window[:third]), 1),
                    "overload_last_third_mib": round(max(s[name] for s in window[-third:]), 1),
                }
                for name in self.pids
            }
            if window
            else {}
        )


def tree_rss_mib(pid: int) -> float:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return round(total / 2**20, 1)


def account(rows: list[dict], overload_rows: list[dict], duration_s: float, capacity: float) -> dict:
    statuses = Counter(r["status"] for r in rows)
    busy = [r for r in rows if r["status"] in BUSY]
    answered = statuses[200]
    refused = len(busy)
    over = [r for r in overload_rows if r["status"] == 200]
    latencies = sorted(r["latency_s"] for r in over)
    return {
        "sent": len(rows),
        "answered": answered,
        "refused": refused,
        "failed": len(rows) - answered - refused,
        "statuses": {str(k): v for k, v in sorted(statuses.items(), key=lambda kv: str(kv[0]))},
        # (a workflow turned away is answered without one: retrying it does not help)
        "refused_without_retry_after": sum(
            r["retry_after"] is None and r.get("error_type") != "workflow_rejected" for r in busy
        ),
        "client_errors": dict(Counter(r["error"] for r in rows if r["status"] is None)),
        "overload_sent": len(overload_rows),
        "overload_offered_per_s": round(len(overload_rows) / duration_s, 2),
        "overload_answered_per_s": round(len(over) / duration_s, 2),
        "overload_answered_vs_capacity": round(len(over) / duration_s / capacity, 2) if capacity else None,
        "overload_p50_s": round(latencies[len(latencies) // 2], 3) if latencies else None,
        "overload_max_s": round(latencies[-1], 3) if latencies else None,
        "overload_client_lag_s": p50_max([r["client_lag_s"] for r in overload_rows]),
    }


def p50_max(values: list[float]) -> dict | None:
    values = sorted(values)
    return {"p50": round(values[len(values) // 2], 3), "max": round(values[-1], 3)} if values else None


def listen_overflows() -> int:
    """Connections the kernel dropped because a server had not accepted earlier ones (the whole host, Linux):
    a client whose connection is dropped that way reached no server, and no trace line is owed for it."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split()))["ListenOverflows"])
    return 0


def trace_lines(trace_dir: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(trace_dir.glob("*.jsonl")) for line in p.read_text().splitlines()]


def gateway_accounting(rows: list[dict], lines: list[dict]) -> dict:
    """Every stage sent has exactly one trace line; outcomes by reason; how long a stage took to reach the gateway's
    queue after it was sent (intake: HTTP, validation, prediction on a shared CPU)."""
    traced = Counter(line["stage_id"] for line in lines)
    lost = {f"s{r['i']}" for r in rows} - set(traced)
    sent_s = {f"s{r['i']}": r["sent_unix_s"] for r in rows}
    outcomes = Counter(f"{line.get('outcome')}: {line.get('error', '')[:60]}".rstrip(": ") for line in lines)
    return {
        "traced": sum(traced.values()),
        "lost": len(lost),
        "duplicated": sum(n > 1 for n in traced.values()),
        "lost_examples": [r for r in rows if f"s{r['i']}" in lost][:10],
        "trace_outcomes": dict(outcomes),
        "intake_s": p50_max(
            [line["arrival_s"] - sent_s[line["stage_id"]] for line in lines if line["stage_id"] in sent_s]
        ),
    }


# The 5xx the gateway's README documents: every node failed, no healthy node, the deadline; a workflow turned away.
DOCUMENTED_5XX = {(502, "upstream_error"), (503, "upstream_error"), (503, "workflow_rejected"), (504, "upstream_error")}


def error_type(content: bytes) -> str:
    """An OpenAI-style error's `type`."""
    try:
        return str(json.loads(content)["error"]["type"])
    except (ValueError, KeyError, TypeError):
        return "not an OpenAI error"


def errors_5xx(rows: list[dict]) -> dict:
    """Each 5xx by its status and error type, and how many the gateway's README does not list."""
    seen = Counter((r["status"], r.get("error_type")) for r in rows if (r["status"] or 0) >= 500)
    return {
        "errors_5xx": {f"{status} {kind}": n for (status, kind), n in sorted(seen.items())},
        "undocumented_5xx": sum(n for key, n in seen.items() if key not in DOCUMENTED_5XX),
    }
