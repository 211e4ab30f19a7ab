"""A gateway node kept in step with its vLLM engine: /metrics parsed and polled, the node's KV budget sized from
vLLM's own block count, /v1/models read for the context length; `VllmSync` is `nodes.Node`'s part that does it."""

from __future__ import annotations

import re
import time

import aiohttp

from serving.gateway.kv_budget import KVBudget
from serving.gateway.upstream import Upstream, UpstreamError

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


# The samples the gateway reads; vLLM's /metrics is ~55 KB of mostly histogram buckets it does not need.
WANTED = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
    "vllm:num_preemptions",
    "vllm:cache_config_info",
)


def parse_metrics(text: str, names: tuple[str, ...] = WANTED) -> dict[str, tuple[dict, float]]:
    """Prometheus text → {name: (labels, value)} for the named samples (the last sample of a name wins)."""
    out: dict[str, tuple[dict, float]] = {}
    for line in text.splitlines():
        if not line.startswith(names):
            continue
        match = _SAMPLE.match(line)
        if match and match["name"] in names:
            labels = dict(_LABEL.findall(match["labels"] or ""))
            out[match["name"]] = (labels, float(match["value"]))
    return out


VLLM_NULL_BLOCKS = 1  # vLLM v1's BlockPool takes one block as the null block (vllm/v1/core/block_pool.py)


class VllmSync:
    """A node's engine as its /metrics and /v1/models last said: health, running / waiting / preempted counts, the
    context length; vLLM's KV usage and block count go to the node's `KVBudget`."""

    def __init__(self, url: str, upstream: Upstream | None, kv: KVBudget):
        self.url, self.upstream, self.kv = url, upstream, kv
        self.is_healthy = False
        self.num_running = 0
        self.num_waiting = 0
        self.num_preemptions = 0
        self.metrics_asked_s = float("-inf")  # when the /metrics now in use was asked for (monotonic)
        self.num_failed_polls = 0  # in a row
        self.num_slow_polls = 0  # timed out while stages were in flight: busy, not down
        # vLLM's max_model_len (prompt + output), from /v1/models once the node is up; None where it reports none
        self.max_model_len: int | None = None
        self.has_listed_models = False  # /v1/models answered since the node (re)started

    def apply_metrics(self, samples: dict[str, tuple[dict, float]], asked_s: float | None = None) -> None:
        """Take a /metrics answer; `asked_s`: when it was asked for (monotonic; default now)."""
        value = lambda name, default=0.0: samples.get(name, ({}, default))[1]  # noqa: E731
        self.metrics_asked_s = time.monotonic() if asked_s is None else asked_s
        self.kv.observe_usage(value("vllm:kv_cache_usage_perc", value("vllm:gpu_cache_usage_perc")))
        self.num_running = int(value("vllm:num_requests_running"))
        self.num_waiting = int(value("vllm:num_requests_waiting"))
        self.num_preemptions = int(value("vllm:num_preemptions_total", value("vllm:num_preemptions")))
        info = samples.get("vllm:cache_config_info", ({}, 0))[0]
        if info.get("num_gpu_blocks") not in (None, "", "None"):
            # vLLM (v1) keeps one of its blocks as the null block: a request can hold num_gpu_blocks - 1, and
            # kv_cache_usage_perc is a share of those; counting the null block would let the projection fill the
            # node one block past what it holds.
            usable = int(info["num_gpu_blocks"]) - VLLM_NULL_BLOCKS
            self.kv.size(max(1, usable), int(info.get("block_size", self.kv.block_size)))

    async def poll(self, timeout_s: float, down_after_failed_polls: int = 1, is_busy: bool = False) -> bool:
        """Fetch /metrics and return the node's health: up when it answered; down at once when it refuses the
        connection, else after `down_after_failed_polls` failed polls in a row. A poll that times out while the
        node is busy (stages in flight) is not a failure: a busy engine answers /metrics late (its stages' own
        timeouts catch a stalled one)."""
        try:
            asked_s = time.monotonic()
            response = await self.upstream.get(f"{self.url}/metrics", timeout_s)
            if response.status_code != 200:
                raise ValueError(f"/metrics answered {response.status_code}")
            self.apply_metrics(parse_metrics(response.text), asked_s)
            self.is_healthy, self.num_failed_polls = True, 0
            if not self.has_listed_models:
                await self.read_max_model_len(timeout_s)
        except aiohttp.ClientConnectorError:
            self.is_healthy, self.num_failed_polls = False, self.num_failed_polls + 1
            self.has_listed_models = False  # a restarted engine may serve another context length
        except TimeoutError:
            if is_busy:
                self.num_slow_polls += 1
            else:
                self._poll_failed(down_after_failed_polls)
        except (*UpstreamError, ValueError):
            self._poll_failed(down_after_failed_polls)
        return self.is_healthy

    async def read_max_model_len(self, timeout_s: float) -> None:
        """The first served model's `max_model_len` from vLLM's /v1/models (None from a server that lists none)."""
        response = await self.upstream.get(f"{self.url}/v1/models", timeout_s)
        self.has_listed_models = True
        try:
            self.max_model_len = int(response.json()["data"][0]["max_model_len"])
        except (ValueError, KeyError, IndexError, TypeError):
            self.max_model_len = None

    def _poll_failed(self, down_after_failed_polls: int) -> None:
        self.num_failed_polls += 1
        if self.num_failed_polls >= down_after_failed_polls:
            self.is_healthy = False
