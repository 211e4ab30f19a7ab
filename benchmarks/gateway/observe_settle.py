"""What the gateway's wait for a stage's /observe (`HttpPredictor.settled`) costs a call, and what it buys.

    .venv/bin/python benchmarks/gateway/observe_settle.py --rounds 6 --calls 20 \
        --out benchmarks/results/observe_settle.json

The gateway app in process over a vLLM-like node that answers at once (tests/serving/gateway/conftest.py), its predictor
a real `bentoml serve` of a small trained model. Each round drives one chain workflow (stage i's parent is stage
i − 1, each sent when its parent's answer is in) per arm: `settle` (as the gateway runs) and `no_settle` (the
answer goes back without waiting; the /observe still leaves at once). Arms alternate order by round. Reported:
per-call latency p50 / p90 and the ratio, and the history condition the children were predicted in (trace lines).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from maestro.contract import StageTrace  # noqa: E402
from pipelines.features import FeaturizerConfig  # noqa: E402
from pipelines.model import ModelConfig  # noqa: E402
from pipelines.predictor import Predictor  # noqa: E402
from pipelines.synth import generate  # noqa: E402
from predictor_service.local_server import LocalServer, ServerConfig  # noqa: E402
from serving.gateway.http_predictor import HttpPredictor  # noqa: E402
from tests.serving.gateway.conftest import run_app  # noqa: E402  (our test fixtures)

ARMS = ("settle", "no_settle")
SMALL_MODEL = ModelConfig(
    folds=3, classifier=dict(n_estimators=40, learning_rate=0.1), regressor=dict(n_estimators=80, learning_rate=0.1)
)


async def chain(client, workflow_id: str, num_calls: int) -> list[float]:
    """Seconds per call of a chain of `num_calls` stages, each sent once its parent's answer is in."""
    seconds = []
    for i in range(num_calls):
        headers = {
            "X-Maestro-Workflow": workflow_id,
            "X-Maestro-Stage": str(i),
            "X-Maestro-Role": "coder",
            "X-Maestro-Parents": str(i - 1) if i else "",
            "X-Maestro-App": "swe_coding",
        }
        body = {"messages": [{"role": "user", "content": f"step {i}: fix the parser"}], "max_tokens": 5}
        started = time.perf_counter()
        response = await client.post("/v1/chat/completions", json=body, headers=headers)
        seconds.append(time.perf_counter() - started)
        response.raise_for_status()
    return seconds


async def _no_wait() -> None:
    return None


def run_arm(arm: str, server_url: str, model: Path, trace_dir: Path, workflow_id: str, num_calls: int) -> list[float]:
    predictor = HttpPredictor.from_url(server_url, str(model), timeout_s=5.0)
    if arm == "no_settle":
        predictor.settled = _no_wait
    return asyncio.run(
        run_app(trace_dir, {"node": True}, lambda client, _: chain(client, workflow_id, num_calls), predictor)
    )


def histories(trace_dir: Path) -> dict:
    lines = [json.loads(line) for path in trace_dir.glob("*.jsonl") for line in path.read_text().splitlines()]
    return dict(Counter(line["history"] for line in lines if line["parent_ids"]))


def summary(seconds: list[float]) -> dict:
    ms = np.asarray(seconds) * 1000
    return {
        "n": len(ms),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p90_ms": round(float(np.percentile(ms, 90)), 2),
        "mean_ms": round(float(ms.mean()), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=20, help="stages of each round's chain, per arm")
    parser.add_argument("--out", default="benchmarks/results/observe_settle.json")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="observe-settle-"))
    stages = [StageTrace.model_validate(r) for r in generate(300, seed=11)]
    model = Predictor.train(stages, FeaturizerConfig(use_embedding=False), SMALL_MODEL).save(root / "model")
    seconds = {arm: [] for arm in ARMS}
    with LocalServer(
        ServerConfig(
            env={"MAESTRO_MODEL": str(model), "MAESTRO_TRACE_DIR": str(root / "observed")},
            log_path=str(root / "service.log"),
        )
    ) as server:
        for rnd in range(args.rounds):
            for arm in ARMS if rnd % 2 == 0 else ARMS[::-1]:
                seconds[arm] += run_arm(arm, server.url, model, root / arm, f"chain-{rnd}-{arm}", args.calls)
    result = {arm: {**summary(seconds[arm]), "history": histories(root / arm)} for arm in ARMS}
    result["p50_ratio_settle_over_no_settle"] = round(result["settle"]["p50_ms"] / result["no_settle"]["p50_ms"], 3)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
