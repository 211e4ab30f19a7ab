"""`maestro retrain`: the traces since the champion → the DVC pipeline → the guard → `maestro deploy`.

One run, in a checkout of this repository (`repo`):
1. Due? Without a trigger, always (a schedule or a person started it). With `on_drift`, when a serving node's
   GET /coverage reports a group past its bound; with `max_age_h`, when the champion is older than that.
2. The traces: every line of the trace directory (the gateway's rotating files) whose stage arrived after the
   champion was registered, copied to `data/traces/retrain/` (lines are not parsed here: `collect` validates and
   reports them). Fewer than `min_stages` finished stages: nothing to learn from yet.
3. The pipeline: `dvc exp run register -S collect.source=data/traces/retrain -S register.promote=false`: every
   stage reruns on them, `register` logs a version and scores it against the champion on the same test split.
   Like any `dvc exp run`, it leaves these params in the checkout's params.yaml: give retrain a checkout of its own.
4. Ship: when the new version passes the guard, `deploy` reloads every node to it and only then moves `champion`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from predictor_service.coverage import CoverageResponse
from predictor_service.deploy import DeployConfig, DeployResult, Registry, deploy

STAGED = Path("data/traces/retrain")  # in the repository; git-ignored, DVC tracks it as collect's dependency
REGISTRATION = Path("data/eval/registration.json")  # what `register` decided (pipelines/stages/register.py)


@dataclass(frozen=True)
class RetrainConfig:
    traces: str  # the gateway's trace directory (or one trace file)
    deploy: DeployConfig  # the nodes to ship to, the registry, the admin token
    repo: str = "."
    min_stages: int = 1000  # finished stages since the champion needed to retrain at all
    on_drift: bool = False
    max_age_h: float | None = None

    def __post_init__(self) -> None:
        if self.min_stages < 1:
            raise ValueError(f"--min-stages must be ≥ 1, got {self.min_stages}")
        if self.max_age_h is not None and self.max_age_h <= 0:
            raise ValueError(f"--max-age-h must be > 0 hours, got {self.max_age_h}")
        if not (Path(self.repo) / "dvc.yaml").exists():
            raise FileNotFoundError(f"--repo {self.repo} has no dvc.yaml: give a checkout of this repository")
        if not Path(self.traces).exists():
            raise FileNotFoundError(f"--traces {self.traces} does not exist: give the gateway's trace_dir")


@dataclass
class RetrainResult:
    status: str  # not-due | too-few-stages | kept-champion | deployed | deploy-failed
    reason: str
    champion: str | None  # the version that was champion when the run started
    num_stages: int = 0  # finished stages since the champion
    version: str | None = None  # the version the pipeline registered
    registration: dict | None = None
    deployed: DeployResult | None = None
    drifting: dict[str, list[str]] = field(default_factory=dict)  # node → its drifting groups

    def to_dict(self) -> dict:
        deployed = (
            None
            if self.deployed is None
            else {"version": self.deployed.version, "nodes": self.deployed.nodes, "failure": self.deployed.failure}
        )
        return {
            "status": self.status,
            "reason": self.reason,
            "champion": self.champion,
            "num_stages": self.num_stages,
            "version": self.version,
            "passes_guard": (self.registration or {}).get("passes_guard"),
            "guard_reasons": (self.registration or {}).get("reasons"),
            "deployed": deployed,
            "drifting": self.drifting,
        }


def resolve_nodes(nodes: tuple[str, ...]) -> tuple[str, ...]:
    """Each `http://HOST:PORT` as one URL per address HOST resolves to: a headless Service names every pod."""
    resolved = []
    for node in nodes:
        url = urlsplit(node)
        addresses = sorted({info[4][0] for info in socket.getaddrinfo(url.hostname, url.port, type=socket.SOCK_STREAM)})
        if not addresses:
            raise ValueError(f"node {node}: {url.hostname} resolves to no address")
        resolved += [f"{url.scheme}://{f'[{a}]' if ':' in a else a}:{url.port}" for a in addresses]
    return tuple(resolved)


def drifting_groups(config: DeployConfig) -> tuple[dict[str, list[str]], list[str]]:
    """Per node, the coverage groups past their bound (GET /coverage); and the nodes that gave no answer."""
    headers = {"Authorization": f"Bearer {config.admin_token}"} if config.admin_token else {}
    drifting, silent = {}, []
    for node in config.nodes:
        try:
            response = httpx.get(f"{node}/coverage", headers=headers, timeout=config.timeout_s)
            response.raise_for_status()
            report = CoverageResponse.model_validate(response.json())
        except (httpx.HTTPError, ValueError) as error:
            silent.append(f"{node}: {type(error).__name__}: {error}")
            continue
        if report.drifting:
            drifting[node] = [
                f"{g.app}/{g.role}/{g.history}: {g.share_above_reserve:.1%} above the reserve "
                f"(α {report.alpha:.1%}, {g.num_observations} stages)"
                for g in report.drifting
            ]
    return drifting, silent


def why_due(config: RetrainConfig, champion_age_h: float | None, drifting: dict) -> str | None:
    """Why this run retrains, or None when it is not due."""
    if not config.on_drift and config.max_age_h is None:
        return "started without a trigger (schedule or by hand)"
    if drifting:
        return f"coverage drifts on {', '.join(drifting)}"
    if config.max_age_h is not None and (champion_age_h is None or champion_age_h >= config.max_age_h):
        return (
            "no champion yet"
            if champion_age_h is None
            else f"the champion is {champion_age_h:.1f} h old (--max-age-h {config.max_age_h:g})"
        )
    return None


def stage_traces(source: Path, since_s: float | None, out_dir: Path) -> int:
    """Copy the lines of stages that arrived after `since_s` (all without a champion) to `out_dir`; the number of
    finished stages among them. A line without `arrival_s` counts by its file's modification time."""
    files = sorted([*source.glob("*.jsonl")]) if source.is_dir() else [source]
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.jsonl"):
        old.unlink()
    num_finished = 0
    with (out_dir / "traces.jsonl").open("w", encoding="utf-8") as out:
        for path in files:
            modified_s = path.stat().st_mtime
            if since_s is not None and modified_s < since_s:  # every stage in it arrived before its last write
                continue
            with path.open(encoding="utf-8", errors="replace") as lines:
                num_finished += _copy_since(lines, since_s, modified_s, out)
    return num_finished


def _copy_since(lines, since_s: float | None, modified_s: float, out) -> int:
    """Write the lines whose stage arrived at or after `since_s` to `out`; how many of them finished."""
    num_finished = 0
    for line in lines:
        record = _record(line)
        arrival_s = record.get("arrival_s", modified_s) if isinstance(record, dict) else modified_s
        if since_s is None or not isinstance(arrival_s, (int, float)) or arrival_s >= since_s:
            out.write(line if line.endswith("\n") else line + "\n")
            num_finished += isinstance(record, dict) and record.get("output_tokens") is not None
    return num_finished


def _record(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None  # malformed: copied all the same, and `collect` reports it with its line number


def run_pipeline(config: RetrainConfig, name: str) -> dict:
    """`dvc exp run` the pipeline up to `register` on the staged traces; what `register` decided."""
    repo = Path(config.repo)
    registration = repo / REGISTRATION
    registration.unlink(missing_ok=True)  # so a stale decision is never read as this run's
    bin_dir = Path(sys.executable).parent  # the stages' `python` and `dvc` are the ones running maestro
    command = [
        str(bin_dir / "dvc"),
        "exp",
        "run",
        "register",
        "-n",
        name,
        "-S",
        f"collect.source={STAGED.as_posix()}",
        "-S",
        "register.promote=false",
        "-S",
        f"register.tracking_uri={config.deploy.tracking_uri}",
    ]
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not registration.exists():
        raise RuntimeError(
            f"`{' '.join(command[1:])}` in {repo} failed (exit {done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-4000:]}"
        )
    return json.loads(registration.read_text())


def champion_state(registry: Registry) -> tuple[str | None, float | None]:
    """The champion's version and when it was registered (unix seconds); (None, None) without one."""
    version = registry.current()
    if version is None:
        return None, None
    created_ms = registry.client.get_model_version(registry.config.model_name, version).creation_timestamp
    return version, created_ms / 1000


def retrain(config: RetrainConfig, now_s: float | None = None) -> RetrainResult:
    """One retraining run (module docstring); raises RuntimeError when the pipeline fails."""
    now_s = time.time() if now_s is None else now_s
    registry = Registry(config.deploy)
    champion, since_s = champion_state(registry)
    drifting, silent = drifting_groups(config.deploy) if config.on_drift else ({}, [])
    reason = why_due(config, None if since_s is None else (now_s - since_s) / 3600, drifting)
    result = RetrainResult("not-due", reason or "no trigger fired", champion, drifting=drifting)
    if reason is None:
        result.reason += "".join(f"; no coverage from {s}" for s in silent)
        return result
    result.num_stages = stage_traces(Path(config.traces), since_s, Path(config.repo) / STAGED)
    if result.num_stages < config.min_stages:
        result.status = "too-few-stages"
        result.reason = (
            f"{result.num_stages} finished stages since the champion, fewer than --min-stages {config.min_stages}"
        )
        return result
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now_s))
    result.registration = run_pipeline(config, f"retrain-{stamp}")
    result.version = str(result.registration["version"])
    if not result.registration["passes_guard"]:
        result.status, result.reason = "kept-champion", "; ".join(result.registration["reasons"])
        return result
    result.deployed = deploy(replace(config.deploy, model_version=result.version), registry)
    result.status = "deployed" if result.deployed.is_ok else "deploy-failed"
    result.reason = f"{reason}; version {result.version} passes the guard" + (
        "" if result.deployed.is_ok else f"; {result.deployed.failure}"
    )
    return result
