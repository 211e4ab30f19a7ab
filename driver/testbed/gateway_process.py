"""`maestro gateway` as its own process on 127.0.0.1, for tests and benchmarks (stop() ends it)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from driver.testbed.engines import REPO, free_port
from serving.gateway.config import merged


class GatewayProcess:
    """The gateway from `repo` (this checkout by default), in its own session as a service runs, with `fields` as
    its config file (nodes and all); its log goes to `workdir`."""

    def __init__(self, fields: dict, workdir: Path, repo: Path = REPO):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir, self.repo = Path(workdir), Path(repo)
        self.config_path = self.workdir / f"gateway-{self.port}.yaml"
        config = merged({"model": "tiny"}, merged(fields, {"server": {"port": self.port}}))
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = self.workdir / f"gateway-{self.port}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> GatewayProcess:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        command = [str(REPO / ".venv/bin/python"), "-m", "maestro.cli", "gateway", "--config", str(self.config_path)]
        self.process = subprocess.Popen(
            command,
            cwd=self.repo,
            env=env,
            stdout=open(self.log_path, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def wait_ready(self, timeout_s: float = 180.0) -> GatewayProcess:
        """Until /ready answers 200 (a gateway without /ready: /health)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.process.returncode}; see {self.log_path}")
            try:
                ready = httpx.get(f"{self.url}/ready", timeout=2)
                if ready.status_code == 200 or (
                    ready.status_code == 404 and httpx.get(f"{self.url}/health", timeout=2).status_code == 200
                ):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"gateway not ready after {timeout_s} s; see {self.log_path}")

    def kill(self) -> None:
        """Hard death (SIGKILL to its process group), as a crashed replica: nothing is flushed or closed."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> GatewayProcess:
        return self.start().wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()
