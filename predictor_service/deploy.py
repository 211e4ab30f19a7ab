"""Deploy a registered predictor to running service nodes: move the alias, reload each node, verify.

Nodes are reloaded one at a time through POST /admin/reload with a pinned `models:/NAME/VERSION`
URI (an alias could move again mid-deploy), and each must report that version in /stats before
the next is touched; the first node that fails stops the rollout. Every alias move is recorded in
a registered-model tag, so `--rollback` goes back to the version the alias held before.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from predictor_service.config import DEFAULT_TRACKING_URI

MODEL_NAME = "stage-length"  # pipelines.registry.MODEL_NAME; not imported to keep the CLI start light


@dataclass(frozen=True)
class DeployConfig:
    nodes: tuple[str, ...]
    alias: str = "champion"
    model_name: str = MODEL_NAME
    model_version: str | None = None  # None: deploy what the alias points at now
    rollback: bool = False
    tracking_uri: str = DEFAULT_TRACKING_URI
    timeout_s: float = 120.0  # per node: loading a model from the registry takes seconds
    admin_token: str | None = None  # the nodes' MAESTRO_ADMIN_TOKEN, if they have one

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("no nodes given: pass --nodes http://host:3000[,http://host2:3000]")
        bad = [n for n in self.nodes if not n.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"node URLs must start with http:// or https://: {', '.join(bad)}")
        if self.rollback and self.model_version is not None:
            raise ValueError("--rollback and --model-version exclude each other: rollback picks the previous version")


@dataclass
class DeployResult:
    alias: str
    previous_version: str | None
    version: str
    nodes: dict[str, str] = field(default_factory=dict)  # url → "ok" or what went wrong

    @property
    def is_ok(self) -> bool:
        return all(v == "ok" for v in self.nodes.values())


def _history_tag(alias: str) -> str:
    return f"maestro.deploy.{alias}.history"


class Registry:
    """The alias and its move history in the MLflow model registry."""

    def __init__(self, config: DeployConfig):
        from mlflow import MlflowClient

        self.config = config
        self.client = MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.tracking_uri)

    def current(self) -> str | None:
        from mlflow.exceptions import MlflowException

        try:
            return str(self.client.get_model_version_by_alias(self.config.model_name, self.config.alias).version)
        except MlflowException:
            return None

    def history(self) -> list[str]:
        tags = self.client.get_registered_model(self.config.model_name).tags
        raw = tags.get(_history_tag(self.config.alias), "")
        return [v for v in raw.split(",") if v]

    def _set(self, version: str, history: list[str]) -> None:
        self.client.get_model_version(self.config.model_name, version)  # raises if the version does not exist
        self.client.set_registered_model_alias(self.config.model_name, self.config.alias, version)
        self.client.set_registered_model_tag(self.config.model_name, _history_tag(self.config.alias),
                                             ",".join(history[-50:]))

    def move_to(self, version: str) -> str | None:
        """Point the alias at `version`, remembering where it was; returns that previous version."""
        previous = self.current()
        if previous != version:
            self._set(version, self.history() + ([previous] if previous else []))
        return previous

    def roll_back(self) -> tuple[str, str]:
        """Point the alias at the version it held before the last move; returns (from, to)."""
        current, history = self.current(), self.history()
        if current is None:
            raise ValueError(f"alias {self.config.alias!r} of {self.config.model_name} is not set: nothing to roll back")
        target = history[-1] if history else self._version_below(current)
        self._set(target, history[:-1])
        return current, target

    def _version_below(self, current: str) -> str:
        found = self.client.search_model_versions(f"name='{self.config.model_name}'")
        versions = sorted(int(v.version) for v in found)
        lower = [v for v in versions if v < int(current)]
        if not lower:
            raise ValueError(f"no deploy history for alias {self.config.alias!r} and no version below {current}: "
                             "pass --model-version N to choose one")
        return str(lower[-1])


def reload_node(url: str, model_uri: str, version: str, timeout_s: float, admin_token: str | None = None) -> str:
    """Ask one node to load `model_uri`, then check /stats reports `version`; 'ok' or what failed."""
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    try:
        with httpx.Client(base_url=url, timeout=timeout_s, headers=headers) as http:
            response = http.post("/admin/reload", json={"model": model_uri})
            if response.status_code != 200:
                return f"reload refused: HTTP {response.status_code} {response.text[:300]}"
            serving = http.get("/stats").json().get("model_version")
    except httpx.HTTPError as error:
        return f"unreachable: {type(error).__name__}: {error}"
    return "ok" if serving == version else f"reports version {serving}, expected {version}"


def deploy(config: DeployConfig, registry: Registry | None = None) -> DeployResult:
    """Move the alias (or roll it back), then reload and verify every node in turn."""
    registry = registry or Registry(config)
    if config.rollback:
        previous, version = registry.roll_back()
    elif config.model_version is not None:
        version = str(config.model_version)
        previous = registry.move_to(version)
    else:
        previous = version = registry.current()
        if version is None:
            raise ValueError(f"alias {config.alias!r} of {config.model_name} is not set: pass --model-version N")
    result = DeployResult(config.alias, previous, version)
    uri = f"models:/{config.model_name}/{version}"
    for node in config.nodes:
        result.nodes[node] = reload_node(node, uri, version, config.timeout_s, config.admin_token)
        if result.nodes[node] != "ok":
            break  # a rollout stops at the first node that did not take the new version
    return result
