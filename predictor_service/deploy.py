"""Deploy a registered predictor to running service nodes: reload and verify every node, then move the alias.

Nodes are reloaded one at a time through POST /admin/reload with a pinned `models:/NAME/VERSION`
URI, and each must report that version in /stats before the next is touched. Only when every node
serves the new version does the alias move, so `models:/NAME@ALIAS` never names a version the
nodes could not load. When anything fails (a node, or the alias move) the rollout is undone: the
alias and its history go back to what they were and every node already touched reloads the model
it served before. Every alias move is recorded in a registered-model tag, so `--rollback` goes back
to the version the alias held before.
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
    failure: str | None = None  # the first thing that went wrong, naming the node or the alias
    restored: dict[str, str] = field(default_factory=dict)  # after a failure: url or "alias" → "ok" or why not

    @property
    def is_ok(self) -> bool:
        return self.failure is None

    @property
    def unrestored(self) -> dict[str, str]:
        return {k: v for k, v in self.restored.items() if v != "ok"}


@dataclass(frozen=True)
class AliasState:
    """Where an alias points and its move history: what a failed deploy puts back."""

    version: str | None
    history: tuple[str, ...]


@dataclass(frozen=True)
class NodeModel:
    """What a node serves, as its /stats reports it."""

    uri: str
    version: str


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
        self.client.set_registered_model_tag(
            self.config.model_name, _history_tag(self.config.alias), ",".join(history[-50:])
        )

    def move_to(self, version: str) -> str | None:
        """Point the alias at `version`, remembering where it was; returns that previous version."""
        previous = self.current()
        if previous != version:
            self._set(version, self.history() + ([previous] if previous else []))
        return previous

    def check(self, version: str) -> str:
        """`version` if it is registered; raises naming it otherwise."""
        self.client.get_model_version(self.config.model_name, version)
        return version

    def rollback_target(self) -> str:
        """The version the alias held before its last move (else the highest version below it)."""
        current, history = self.current(), self.history()
        if current is None:
            raise ValueError(
                f"alias {self.config.alias!r} of {self.config.model_name} is not set: nothing to roll back"
            )
        return history[-1] if history else self._version_below(current)

    def roll_back(self) -> tuple[str, str]:
        """Point the alias at the version it held before the last move; returns (from, to)."""
        current, target = self.current(), self.rollback_target()
        self._set(target, self.history()[:-1])
        return current, target

    def state(self) -> AliasState:
        return AliasState(self.current(), tuple(self.history()))

    def restore(self, state: AliasState) -> None:
        """Put the alias and its history back to `state` (no-op when nothing changed)."""
        if self.state() == state:
            return
        name, alias = self.config.model_name, self.config.alias
        if state.version is None:
            self.client.delete_registered_model_alias(name, alias)
        else:
            self.client.set_registered_model_alias(name, alias, state.version)
        self.client.set_registered_model_tag(name, _history_tag(alias), ",".join(state.history))

    def _version_below(self, current: str) -> str:
        found = self.client.search_model_versions(f"name='{self.config.model_name}'")
        versions = sorted(int(v.version) for v in found)
        lower = [v for v in versions if v < int(current)]
        if not lower:
            raise ValueError(
                f"no deploy history for alias {self.config.alias!r} and no version below {current}: "
                "pass --model-version N to choose one"
            )
        return str(lower[-1])


NODE_ERRORS = (httpx.HTTPError, KeyError, ValueError)  # no answer, or not a service's /stats answer


def _node_error(error: Exception) -> str:
    kind = "unreachable" if isinstance(error, httpx.HTTPError) else "no usable /stats answer"
    return f"{kind}: {type(error).__name__}: {error}"


def _admin(url: str, config: DeployConfig) -> httpx.Client:
    headers = {"Authorization": f"Bearer {config.admin_token}"} if config.admin_token else {}
    return httpx.Client(base_url=url, timeout=config.timeout_s, headers=headers)


def node_model(url: str, config: DeployConfig) -> NodeModel:
    """What `url` serves now (GET /stats); raises one of NODE_ERRORS when it gives no usable answer."""
    with _admin(url, config) as http:
        response = http.get("/stats")
        response.raise_for_status()
        stats = response.json()
    return NodeModel(str(stats["model_uri"]), str(stats["model_version"]))


def reload_node(url: str, model: NodeModel, config: DeployConfig) -> str:
    """Ask one node to load `model.uri`, then check /stats reports `model.version`; 'ok' or what failed."""
    try:
        with _admin(url, config) as http:
            response = http.post("/admin/reload", json={"model": model.uri})
        if response.status_code != 200:
            return f"reload refused: HTTP {response.status_code} {response.text[:300]}"
        serving = node_model(url, config).version
    except NODE_ERRORS as error:
        return _node_error(error)
    return "ok" if serving == model.version else f"reports version {serving}, expected {model.version}"


def deploy(config: DeployConfig, registry: Registry | None = None) -> DeployResult:
    """Reload and verify every node in turn, then move the alias; undo all of it when any step fails.

    Raises before any node is touched when the version to deploy cannot be determined."""
    registry = registry or Registry(config)
    before = registry.state()
    version = _target_version(config, registry)
    result = DeployResult(config.alias, before.version, version)
    touched = _roll_out(config, NodeModel(f"models:/{config.model_name}/{version}", version), result)
    if result.failure is None:
        try:
            _move_alias(config, registry, version)
        except Exception as error:
            result.failure = (
                f"alias {config.alias!r} could not be moved to version {version}: {type(error).__name__}: {error}"
            )
    if result.failure is not None:
        _undo(config, registry, before, touched, result)
    return result


def _target_version(config: DeployConfig, registry: Registry) -> str:
    if config.rollback:
        return registry.rollback_target()
    if config.model_version is not None:
        return registry.check(str(config.model_version))
    current = registry.current()
    if current is None:
        raise ValueError(f"alias {config.alias!r} of {config.model_name} is not set: pass --model-version N")
    return current


def _roll_out(config: DeployConfig, model: NodeModel, result: DeployResult) -> dict[str, NodeModel]:
    """Reload the nodes in turn up to the first failure; returns what each touched node served before."""
    touched: dict[str, NodeModel] = {}
    for node in config.nodes:
        try:
            touched[node] = node_model(node, config)
            result.nodes[node] = reload_node(node, model, config)
        except NODE_ERRORS as error:
            result.nodes[node] = _node_error(error)
        if result.nodes[node] != "ok":
            result.failure = f"node {node}: {result.nodes[node]}"
            break
    return touched


def _move_alias(config: DeployConfig, registry: Registry, version: str) -> None:
    if config.rollback:
        registry.roll_back()
    elif config.model_version is not None:
        registry.move_to(version)


def _undo(
    config: DeployConfig, registry: Registry, before: AliasState, touched: dict[str, NodeModel], result: DeployResult
) -> None:
    """Put the alias back, and every touched node back on the model it served before."""
    try:
        registry.restore(before)
        result.restored["alias"] = "ok"
    except Exception as error:
        result.restored["alias"] = f"{type(error).__name__}: {error}"
    for node, previous in touched.items():
        try:
            is_unchanged = node_model(node, config) == previous
        except NODE_ERRORS:
            is_unchanged = False
        result.restored[node] = "ok" if is_unchanged else reload_node(node, previous, config)
