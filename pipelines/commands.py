"""`maestro train`, `maestro predict` and `maestro score`: the predictor on any contract trace file,
outside DVC, and its predictions scored against the issue's targets and the per-role baselines."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from maestro.contract import line_report, read_traces
from pipelines.featurize import featurizer_config
from pipelines.metrics import TARGETS, VERDICTS, score_frames, scoring_frames
from pipelines.params import load_params
from pipelines.plots import write_plots
from pipelines.predictor import Predictor, label_frame
from pipelines.train import model_config, workflow_config

DEFAULT_PARAMS = Path(__file__).resolve().parent.parent / "params.yaml"


def _read(path: str):
    result = read_traces(path)
    print(result.report(), file=sys.stderr)
    return result.stages


def _train(args: argparse.Namespace) -> Predictor:
    features = featurizer_config(load_params("featurize", args.params))
    model = model_config(load_params("train", args.params))
    if args.dask:  # the stage model only: its answers' workflow fields are the prior (maestro.prediction)
        from pipelines.dask_train import DaskTrainConfig, train_predictor

        config = DaskTrainConfig(args.dask, embedding_cache=args.embedding_cache)
        return train_predictor(args.traces, features, model, config)
    workflow = workflow_config(load_params("workflow", args.params, default={}))
    return Predictor.train(_read(args.traces), features, model, progress=True, workflow_config=workflow)


def train_command(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    predictor = _train(args)
    predictor.meta.update(train_seconds=round(time.perf_counter() - started, 2), traces=str(args.traces))
    predictor.save(args.out)
    print(
        f"trained on {predictor.meta['num_train_stages']} stages in {predictor.meta['train_seconds']} s "
        f"({predictor.meta['model']}) → {args.out}"
    )
    return 0


def predict_command(args: argparse.Namespace) -> int:
    predictor = Predictor.load(args.model)
    stages = _read(args.traces)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as handle:
        for start in tqdm(range(0, len(stages), args.batch_size), desc="predicting", unit="batch"):
            for prediction in predictor.predict(stages[start : start + args.batch_size]):
                handle.write(json.dumps(prediction.to_dict()) + "\n")
    print(f"wrote {len(stages)} predictions to {out}")
    return 0


PREDICTION_FIELDS = ("workflow_id", "stage_id", "p_tool", "tokens_pred", "tokens_reserve")


def read_predictions(path: str) -> tuple[pd.DataFrame, list[str]]:
    """`maestro predict` output (or any JSONL with PREDICTION_FIELDS); a bad or repeated line is
    reported as file:line and skipped, the rest is read."""
    rows, errors, seen = [], [], set()
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("not a JSON object")
                missing = [k for k in PREDICTION_FIELDS if row.get(k) is None]
                if missing:
                    raise ValueError(f"missing {', '.join(missing)}")
                key = (str(row["workflow_id"]), str(row["stage_id"]))
                if key in seen:
                    raise ValueError(f"stage {key[0]}/{key[1]} predicted twice: the first line counts")
                seen.add(key)
                rows.append(
                    {"workflow_id": key[0], "stage_id": key[1], **{k: float(row[k]) for k in PREDICTION_FIELDS[2:]}}
                )
            except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
                errors.append(f"{path}:{number}: {exc}")
    return pd.DataFrame(rows, columns=list(PREDICTION_FIELDS)), errors


def _labelled(path: str, what: str) -> pd.DataFrame:
    stages = _read(path)
    unlabelled = sum(s.output_tokens is None for s in stages)
    if unlabelled:
        print(f"{path}: {unlabelled} {what} stages without output_tokens are left out", file=sys.stderr)
    return label_frame([s for s in stages if s.output_tokens is not None])  # contract ids are strings


def _format_scores(scores: dict) -> str:
    def show(value) -> str:
        return "—" if value is None else f"{value:.3f}"

    model, ratios, checks = scores["model"], scores["ratios"], scores["targets"]
    lines = [f"{'':30s} {'value':>8s}  target"]
    for metric, op, bound in TARGETS:
        verdict = VERDICTS[checks[metric]]
        lines.append(f"{metric:30s} {show(ratios.get(metric, model.get(metric))):>8s}  {op} {bound}  {verdict}")
    lines.append(f"{'(role p90 above reserve)':30s} {show(scores['baselines']['role_p90']['under_rate']):>8s}")
    lines.append("per app: stages, AUC, τ, MAE × role median, above reserve, over-reservation × role p90")
    for app, part in scores["by_app"].items():
        m, r = part["model"], part["ratios"]
        lines.append(
            f"  {app:28s} {m['n']:6d} {show(m['auc']):>7s} {show(m['kendall_tau']):>7s} "
            f"{show(r['mae_vs_role_median']):>7s} {show(m['under_rate']):>7s} "
            f"{show(r['over_reservation_vs_role_p90']):>7s}"
        )
    return "\n".join(lines)


def score_command(args: argparse.Namespace) -> int:
    predictions, errors = read_predictions(args.predictions)
    print(line_report(f"{len(predictions)} predictions read, {len(errors)} bad lines", errors), file=sys.stderr)
    test, train = _labelled(args.traces, "test"), _labelled(args.train, "training")
    keys = ["workflow_id", "stage_id"]
    unpredicted = test.merge(predictions[keys], on=keys, how="left", indicator=True)["_merge"].eq("left_only").sum()
    if unpredicted:
        print(
            f"{unpredicted} labelled stages of {args.traces} have no prediction in {args.predictions}: "
            f"scored without them",
            file=sys.stderr,
        )
    if train.empty or len(test) == unpredicted:
        print(
            "nothing to score: need labelled training stages and predictions of labelled test stages", file=sys.stderr
        )
        return 2
    params = load_params("train", args.params)
    frames = scoring_frames(
        predictions, test, train, rho=float(params.get("rho", 0.2)), alpha=float(params.get("alpha", 0.05))
    )
    scores = score_frames(frames)
    scores.update(
        predictions=str(args.predictions),
        traces=str(args.traces),
        train=str(args.train),
        unpredicted_stages=int(unpredicted),
        bad_prediction_lines=len(errors),
    )
    print(f"scored {scores['model']['n']} stages (baselines fitted on {len(train)} training stages)")
    print(_format_scores(scores))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(scores, indent=1))
    if args.plots:  # the evaluate stage's plots: calibration, predicted vs actual, error by role, reserve trade-off
        Path(args.plots).mkdir(parents=True, exist_ok=True)
        print(f"plots: {', '.join(str(path) for path in write_plots(frames, Path(args.plots)))}")
    return 0


def register(subparsers) -> None:
    train = subparsers.add_parser("train", help="train the stage-length predictor on a trace file")
    train.add_argument("--traces", required=True, help="contract JSONL or Parquet file of labelled stages")
    train.add_argument("--out", required=True, help="directory to write the predictor to")
    train.add_argument(
        "--params", default=str(DEFAULT_PARAMS), help="params.yaml with featurize/train (and workflow) sections"
    )
    train.add_argument(
        "--dask",
        metavar="local:N|tcp://HOST:PORT",
        help="train on a Dask cluster: N local worker "
        "processes or a running scheduler; --traces may then be a directory of trace files or of "
        "trace Parquet (pipelines/dask_features.py)",
    )
    train.add_argument("--embedding-cache", help="with --dask: an .npz embedding cache the workers share")
    train.set_defaults(func=train_command)
    predict = subparsers.add_parser("predict", help="predict every stage of a trace file")
    predict.add_argument("--model", required=True, help="predictor directory or models:/stage-length@champion")
    predict.add_argument("--traces", required=True)
    predict.add_argument("--out", required=True, help="JSONL: one prediction per input stage")
    predict.add_argument("--batch-size", type=int, default=512)
    predict.set_defaults(func=predict_command)
    score = subparsers.add_parser(
        "score", help="score predictions of labelled stages against the targets and the per-role baselines"
    )
    score.add_argument("--predictions", required=True, help="JSONL written by `maestro predict`")
    score.add_argument("--traces", required=True, help="the labelled trace file that was predicted")
    score.add_argument(
        "--train",
        required=True,
        help="the trace file the predictor was trained on: the per-role baselines are fitted on it",
    )
    score.add_argument(
        "--params", default=str(DEFAULT_PARAMS), help="params.yaml: train.alpha and train.rho for the baselines"
    )
    score.add_argument("--out", help="write the scores as JSON here")
    score.add_argument("--plots", help="write the evaluate stage's plots (PNG + CSV) to this directory")
    score.set_defaults(func=score_command)
