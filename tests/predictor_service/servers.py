"""A tmp MLflow registry and a real `bentoml serve` of its champion, for the service tests that need both."""

from pathlib import Path


def registered_store(root: Path, predictor_dirs: list[Path]) -> str:
    """A tmp MLflow store under `root` with one registered version per predictor directory, version 1 the champion;
    returns its tracking URI (the process's own MLflow URIs are left as they were)."""
    import mlflow
    from mlflow import MlflowClient

    from pipelines.registry import MODEL_NAME, register_predictor, use_store

    uri = f"sqlite:///{root}/mlflow.db"
    previous = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    use_store(uri, str(root / "artifacts"))
    try:
        for directory in predictor_dirs:
            with mlflow.start_run():
                register_predictor(directory, ["lightgbm"])
        MlflowClient().set_registered_model_alias(MODEL_NAME, "champion", "1")
    finally:
        mlflow.set_tracking_uri(previous[0])
        mlflow.set_registry_uri(previous[1])
    return uri


def champion_server(store: str, root: Path, admin_token: str):
    """A real `bentoml serve` (LocalServer, 127.0.0.1) of the store's champion, observed stages under root/observed."""
    from predictor_service.local_server import LocalServer, ServerConfig

    env = {
        "MAESTRO_MODEL": "models:/stage-length@champion",
        "MLFLOW_TRACKING_URI": store,
        "MAESTRO_TRACE_DIR": str(root / "observed"),
        "MAESTRO_ADMIN_TOKEN": admin_token,
    }
    return LocalServer(ServerConfig(env=env, log_path=str(root / "server.log")))
