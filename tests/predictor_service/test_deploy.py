"""`maestro deploy`'s registry side on a real MLflow sqlite store: what a failed deploy puts back, and that
nothing moves before every node is verified. Rollouts against real service nodes: test_end_to_end.py."""

import pytest

from predictor_service.commands import failure_message
from predictor_service.deploy import AliasState, DeployConfig, Registry, deploy


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """A store with three registered versions of the model (one store: creating one takes seconds)."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("stage-length")
    for _ in range(3):
        client.create_model_version("stage-length", source=str(root))
    return uri


@pytest.fixture
def registry(store, request) -> Registry:
    """The store's registry, with an alias of the test's own that is not set yet."""
    return Registry(DeployConfig(nodes=("http://127.0.0.1:1",), alias=request.node.name[:40], tracking_uri=store))


def test_restore_puts_the_alias_and_its_history_back(registry):
    unset = registry.state()
    registry.move_to("1")
    registry.move_to("2")
    before = registry.state()
    assert before == AliasState("2", ("1",))
    registry.move_to("3")
    assert registry.rollback_target() == "2" and registry.current() == "3"  # choosing a target moves nothing
    registry.restore(before)
    assert registry.state() == before
    registry.restore(unset)
    assert registry.current() is None


def test_a_node_that_does_not_answer_leaves_the_alias_where_it_was(registry, capsys):
    from predictor_service.local_server import free_port

    registry.move_to("1")
    dead = f"http://127.0.0.1:{free_port()}"
    config = DeployConfig(
        nodes=(dead,),
        alias=registry.config.alias,
        model_version="3",
        tracking_uri=registry.config.tracking_uri,
        timeout_s=2,
    )
    result = deploy(config, Registry(config))
    assert result.failure.startswith(f"node {dead}: unreachable") and result.restored == {"alias": "ok"}
    assert registry.state() == AliasState("1", ())
    assert failure_message(result).splitlines()[:2] == [
        f"deploy of version 3 failed: {result.failure}",
        f"undone: the nodes it had switched serve their previous model again; alias {registry.config.alias!r} "
        "is at version 1",
    ]


def test_a_version_that_is_not_registered_fails_before_any_node_is_touched(registry):
    config = DeployConfig(
        nodes=("http://127.0.0.1:1",),
        alias=registry.config.alias,
        model_version="9",
        tracking_uri=registry.config.tracking_uri,
    )
    with pytest.raises(Exception, match="9"):
        deploy(config, Registry(config))
