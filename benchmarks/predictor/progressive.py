"""Progressive re-prediction on held-out tasks: a running stage's length from its output so far, learned
(`maestro.progressive` table, `pipelines/progressive.py`) against the parametric conditional (the prediction read as a
log-normal and conditioned on L > produced), both fed the same stage predictions.

The dev traces and the tau2 agent traces are read together and split as the referee splits them
(`benchmarks.referee.sides`): the predictor's training side (70 % of tasks) and one half of the held-out tasks,
`dev` (choose here) or `locked` (report once). The predictor (`--model`, trained on that training side; else trained
here with `maestro train`) answers every held-out stage with its finished ancestors known; the table is fitted on the
training side with the stage model's out-of-fold medians (`Predictor.fit_progressive`), once per variant.

At each checkpoint k of produced tokens, over the held-out stages still running there (L > k), per app and pooled:
Kendall τ of the remaining tokens (predicted median − k against L − k), MAE of the median, the share of stages above
the upper bound (at the predictor's reserve level 1 − α) and the median of upper ÷ L (what the bound costs). Arms:
`parametric`, `learned` (the first tokens' class read from the text, cut at `CHARS_PER_TOKEN` a token as in
training) and `learned, no prefix` (the class unknown: what the vLLM plugin has without a tokenizer).

    python -m benchmarks.predictor.progressive [--model DIR] [--side dev|locked] [--variants NAME ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau
from tqdm import tqdm

from benchmarks.referee.sides import DEFAULT_TRACES, read_all, side_split, train_model
from maestro.contract import StageTrace
from maestro.progressive import UNKNOWN, length_bounds, prefix_chars, prefix_class
from pipelines.predictor import Predictor
from pipelines.progressive import CHECKPOINTS, ProgressiveConfig, has_text

REPO = Path(__file__).resolve().parents[2]
# name → changes to ProgressiveConfig (its defaults: "default", chosen on the dev side); serving/EXPERIMENTS.md logs
# what each measured.
VARIANTS = {
    "default": {},
    "leaves 15, 300 rounds": dict(num_leaves=15, n_estimators=300),
    "min 40 a leaf": dict(min_child_samples=40),
}
ARMS = ("parametric", "learned", "learned, no prefix")


def labelled(stages: list[StageTrace]) -> list[StageTrace]:
    """The stages `Predictor.train` fits on, in its order."""
    return [s for s in stages if s.is_labelled and s.is_tool_call is not None]


def held_out_rows(predictor: Predictor, test: list[StageTrace]) -> list[dict]:
    """One row per (held-out stage with an output text, checkpoint k < its length): its app, k, its length, the
    class of its first tokens and the predictor's median and reserve for it."""
    answers = predictor.predict([s.model_copy(update={"output_text": None}) for s in test])
    rows = []
    for stage, answer in zip(test, answers):
        if not has_text(stage):
            continue
        for k in (k for k in CHECKPOINTS if k < stage.output_tokens):
            rows.append(
                {
                    "app": stage.app or "",
                    "produced": k,
                    "tokens": stage.output_tokens,
                    "prefix": prefix_class(prefix_chars(stage.output_text, k)),
                    "tokens_pred": answer.tokens_pred,
                    "tokens_reserve": answer.tokens_reserve,
                }
            )
    return rows


def bounds(rows: list[dict], arm: str, table, level: float) -> np.ndarray:
    """(median, upper) of every row under `arm`."""
    out = []
    for row in rows:
        prefix = UNKNOWN if arm == "learned, no prefix" else row["prefix"]
        b = length_bounds(
            row["produced"],
            row["tokens_pred"],
            row["tokens_reserve"],
            level,
            None if arm == "parametric" else table,
            prefix,
        )
        out.append((b.median, b.upper))
    return np.array(out, dtype=float).reshape(-1, 2)


def score(tokens: np.ndarray, produced: np.ndarray, predicted: np.ndarray) -> dict:
    """τ of the remaining tokens, MAE of the median, share above the upper bound, median of upper ÷ true."""
    median, upper = predicted[:, 0], predicted[:, 1]
    tau = kendalltau(median - produced, tokens - produced).statistic if len(tokens) > 2 else math.nan
    mae = float(np.mean(np.abs(median - tokens)))
    return {
        "n": int(len(tokens)),
        "tau": round(float(tau), 3),
        "mae": round(mae, 1),
        "above": round(float(np.mean(tokens > upper)), 3),
        "upper_x": round(float(np.median(upper / tokens)), 2),
    }


def evaluate(rows: list[dict], table, level: float) -> dict:
    """Per checkpoint, pooled and per app, each arm's `score`."""
    predicted = {arm: bounds(rows, arm, table, level) for arm in ARMS}
    apps = np.array([r["app"] for r in rows])
    produced = np.array([r["produced"] for r in rows], dtype=float)
    tokens = np.array([r["tokens"] for r in rows], dtype=float)
    out = {}
    for k in sorted(set(produced.astype(int))):
        at_k = produced == k
        cells = {"pooled": at_k, **{app: at_k & (apps == app) for app in sorted(set(apps[at_k]))}}
        out[str(k)] = {
            where: {arm: score(tokens[mask], produced[mask], predicted[arm][mask]) for arm in ARMS}
            for where, mask in cells.items()
            if mask.sum() >= 10
        }
    return out


def markdown(result: dict) -> str:
    """Pooled figures per checkpoint: τ, MAE, share above and upper ÷ true, parametric → learned."""
    lines = [
        "| produced k | stages running | τ remaining | MAE (tokens) | above upper | upper ÷ true (median) |",
        "|---|---|---|---|---|---|",
    ]
    for k, cells in result.items():
        p, learned, bare = (cells["pooled"][arm] for arm in ARMS)
        pairs = " | ".join(f"{p[m]} → {learned[m]} ({bare[m]})" for m in ("tau", "mae", "above", "upper_x"))
        lines.append(f"| {k} | {p['n']} | {pairs} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a predictor trained on the referee's training side (default: train one)")
    parser.add_argument("--side", choices=("dev", "locked"), default="dev")
    parser.add_argument("--variants", nargs="*", choices=list(VARIANTS), default=["default"])
    parser.add_argument("--save-model", help="write the predictor with the first variant's table here")
    parser.add_argument("--out", default="benchmarks/results/progressive.json")
    args = parser.parse_args()
    split = side_split(read_all(DEFAULT_TRACES), args.side)
    train = labelled(split.train)
    model_dir = (
        Path(args.model)
        if args.model
        else train_model(
            split.write(REPO / "benchmarks/results/progressive")[0], REPO / "benchmarks/results/progressive/model"
        )
    )
    predictor = Predictor.load(model_dir)
    level = 1.0 - float(predictor.meta.get("alpha", 0.05))
    rows = held_out_rows(predictor, split.test)
    result = {
        "side": args.side,
        "model": str(model_dir),
        "reserve_level": round(level, 4),
        "arms": ARMS,
        "stages": {"train": len(train), "test": len(split.test)},
        "variants": {},
    }
    for name in tqdm(args.variants, desc="variants", unit="table"):
        predictor.fit_progressive(train, replace(ProgressiveConfig(), **VARIANTS[name]))
        result["variants"][name] = {
            "fit": predictor.meta["progressive"],
            "checkpoints": evaluate(rows, predictor.progressive, level),
        }
        print(
            f"\n{name} (side {args.side}; parametric → learned (learned, no prefix))\n"
            f"{markdown(result['variants'][name]['checkpoints'])}"
        )
        if args.save_model and name == args.variants[0]:
            predictor.save(args.save_model)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
