"""The vLLM engine as benchmarks/gateway/live_compare.py measures it: its /metrics (preemptions, queue time, KV
blocks in use, polled while a run lasts) and one solo call's time, from which a workflow's unloaded time follows."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np

from serving.gateway.vllm_sync import parse_metrics

REPO = Path(__file__).resolve().parents[2]
METRICS = (
    "vllm:num_preemptions_total",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_count",
)


def vllm_metrics(url: str) -> dict:
    samples = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text, METRICS)
    out = {name: value for name, (_, value) in samples.items()}
    out["num_gpu_blocks"] = int(samples.get("vllm:cache_config_info", ({"num_gpu_blocks": 0}, 0))[0]["num_gpu_blocks"])
    return out


class KvSampler:
    """vLLM's KV blocks in use, polled from /metrics while a run lasts."""

    def __init__(self, url: str, period_s: float = 0.5):
        self.url, self.period_s, self.blocks = url, period_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                m = vllm_metrics(self.url)
            except httpx.HTTPError:
                continue
            self.blocks.append(m.get("vllm:kv_cache_usage_perc", 0.0) * max(0, m["num_gpu_blocks"] - 1))

    def __enter__(self) -> KvSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def calibrate(url: str, eos: int, num_calls: int = 6) -> dict:
    """One solo call's time as a + b × output tokens, fitted on solo calls of 8 and 64 tokens."""
    text = (REPO / "README.md").read_text()[:1500]
    tokens, seconds = [], []
    with httpx.Client(timeout=120) as client:
        for i in range(num_calls):
            n = (8, 64)[i % 2]
            started = time.perf_counter()
            client.post(
                f"{url}/v1/chat/completions",
                json={
                    "model": "tiny",
                    "messages": [{"role": "user", "content": f"{i} {text}"}],
                    "max_tokens": n,
                    "ignore_eos": True,
                },
            ).raise_for_status()
            tokens.append(n)
            seconds.append(time.perf_counter() - started)
    b, a = np.polyfit(tokens, seconds, 1)
    return {
        "a_s": round(float(max(a, 0.0)), 4),
        "b_s_per_token": round(float(max(b, 1e-5)), 5),
        "calls": list(zip(tokens, [round(s, 3) for s in seconds])),
    }


def unloaded_s(stages: list[dict], fit: dict) -> float:
    """The workflow's longest path of solo call times plus tool waits (stages come parents first)."""
    finish: dict[str, float] = {}
    for s in stages:
        start = max((finish[p] for p in s["parent_ids"]), default=0.0) + s["wait_s"]
        finish[s["stage_id"]] = start + fit["a_s"] + fit["b_s_per_token"] * s["max_tokens"]
    return max(finish.values())
