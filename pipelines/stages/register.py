"""DVC stage `register`: log the run to MLflow, register `stage-length`, move `champion` if not worse.

Writes registration.json: the run, the version, whether it passes the guard against the champion re-scored on
this run's test split, and whether `register.promote` let it move `champion` (pipelines/register.py says how).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlflow
import pandas as pd
from mlflow import MlflowClient

from pipelines.params import load_params
from pipelines.register import REQUIREMENTS, champion_quality, file_hash, flat, may_promote, traces_datasets
from pipelines.registry import MODEL_NAME, log_predictor, not_worse, tag_checksum, use_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="models/predictor")
    parser.add_argument("--traces", default="data/traces/collected.jsonl")
    parser.add_argument("--features", default="data/features")
    parser.add_argument(
        "--metrics",
        default="data/eval/metrics_detail.json",
        help="the evaluate stage's detail: the with-history figures are logged and guarded",
    )
    parser.add_argument("--plots", default="data/eval")
    parser.add_argument("--out", default="data/eval/registration.json")
    args = parser.parse_args()
    params = load_params("register")
    allowed, held = may_promote(params.get("promote", "auto"))
    use_store(params["tracking_uri"], params["artifact_root"])
    client = MlflowClient()
    detail = json.loads(Path(args.metrics).read_text())
    metrics = detail["with_history"]
    test_labels = pd.read_parquet(Path(args.features) / "test_labels.parquet")
    champion = champion_quality(client, args.traces, test_labels, Path(args.features) / "embeddings.npz")
    all_params = {section: load_params(section) for section in ("collect", "featurize", "train", "register")}
    traces, test = traces_datasets(args.traces, all_params["collect"]["source"], test_labels)
    with mlflow.start_run() as run:
        mlflow.log_params(flat("", all_params))
        mlflow.log_input(traces, context="training")
        mlflow.log_input(test, context="evaluation")
        info = log_predictor(args.model, REQUIREMENTS, params=flat("", all_params))
        version = tag_checksum(info, args.model)
        mlflow.log_metrics(
            flat(
                "",
                {"model": metrics["model"], "ratios": metrics["ratios"], "baselines": metrics["baselines"]},
                numbers_only=True,
            ),
            model_id=info.model_id,
            dataset=test,
        )
        workflow = {name: d["workflow"]["headline"] for name, d in detail.items() if "workflow" in d}
        mlflow.log_metrics(flat("workflow", workflow, numbers_only=True), model_id=info.model_id, dataset=test)
        mlflow.set_tags({"data_hash": file_hash(args.traces), "collect.source": all_params["collect"]["source"]})
        for png in sorted(Path(args.plots).glob("*.png")):
            mlflow.log_artifact(str(png), artifact_path="plots")
        mlflow.log_artifact(args.metrics)
    passes, reasons = (
        (True, []) if champion is None else not_worse(metrics["model"], champion, all_params["train"]["alpha"])
    )
    promoted, reasons = passes and allowed, reasons + held
    if promoted:
        client.set_registered_model_alias(MODEL_NAME, "champion", version)
    result = {
        "run_id": run.info.run_id,
        "version": version,
        "promoted": promoted,
        "passes_guard": passes,
        "reasons": reasons,
        "champion_metrics_on_this_test": champion,
    }
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    verdict = "now champion" if promoted else f"kept the champion ({'; '.join(reasons)})"
    print(f"registered {MODEL_NAME} version {version}: {verdict}")


if __name__ == "__main__":
    main()
