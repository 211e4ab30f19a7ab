"""A real `bentoml serve` of the predictor on 127.0.0.1, started and always stopped (tests, benchmarks)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
TARGET = "predictor_service.service:PredictorService"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PortTaken(RuntimeError):
    """bentoml serve could not bind its port."""


@dataclass(frozen=True)
class ServerConfig:
    env: dict[str, str] = field(default_factory=dict)  # MAESTRO_MODEL, MLFLOW_TRACKING_URI, ...
    target: str = TARGET  # the module:Service that `bentoml serve` runs
    port: int = 0  # 0: pick a free one
    ready_timeout_s: float = 180.0
    log_path: str | None = None  # server stdout/stderr; None: a temporary file

    def __post_init__(self) -> None:
        if self.ready_timeout_s <= 0:
            raise ValueError(f"ready_timeout_s must be > 0, got {self.ready_timeout_s}")


class LocalServer:
    """`with LocalServer(config) as server:` → server.url answers /readyz; the process group dies on exit."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.port = config.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = config.log_path or tempfile.mkstemp(prefix="bentoml-serve-", suffix=".log")[1]
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        bentoml = Path(sys.executable).with_name("bentoml")
        return [
            str(bentoml),
            "serve",
            self.config.target,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--working-dir",
            str(REPO),
        ]

    def __enter__(self) -> LocalServer:
        # A port picked free can be taken before bentoml binds it: with a picked port, try another.
        attempts = 1 if self.config.port else 3
        for attempt in range(attempts):
            try:
                return self._start()
            except PortTaken:
                if attempt == attempts - 1:
                    raise
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
        return self

    def _start(self) -> LocalServer:
        # The service's configuration is exactly `config.env`: MAESTRO_* variables of this process are not inherited.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("MAESTRO_")}
        env = {**inherited, "OMP_NUM_THREADS": "1", "BENTOML_DO_NOT_TRACK": "True", **self.config.env}
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            self.command(), env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _log_tail(self) -> str:
        return Path(self.log_path).read_text(errors="replace")[-2000:]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.config.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if "Address already in use" in self._log_tail():
                    raise PortTaken(f"port {self.port} was taken before bentoml serve could bind it")
                raise RuntimeError(
                    f"bentoml serve exited with {self.process.returncode} before it was ready (log: {self.log_path})"
                )
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"bentoml serve on {self.url} not ready after {self.config.ready_timeout_s} s")

    def stop(self) -> None:
        """SIGTERM the whole process group (bentoml's workers too), then SIGKILL whatever is left."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=5)

    def __exit__(self, *exc) -> None:
        self.stop()
