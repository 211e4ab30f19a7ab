"""vLLM-CPU's engine as the engine replay steps it: vLLM 0.32's `LLMEngine` (its core in this process where
VLLM_ENABLE_V1_MULTIPROCESSING=0, as `benchmarks/engine/steps.py` sets it), the tiny test model with dummy weights,
vLLM's own scheduler or MaestroScheduler, prefix caching on and the project's stat logger (`maestro_vllm_stats`)
attached. vLLM is imported only when an engine is built (it lives in `.venv-vllm`)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def engine_env(**extra: str) -> dict[str, str]:
    """The environment an engine process runs in: offline, its core in this process, quiet; `extra` added last."""
    # One OpenMP thread, unbound: the tiny model needs none more, and on shared cores a second one waiting at every
    # barrier for its turn made runs 2.5-3x slower (2026-12-03). Step records do not depend on it; the environment wins.
    return {
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": "WARNING",
        **extra,
    }


def build_engine(engine: dict, arm: dict):
    from maestro_vllm_stats import MaestroStatLogger
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    extra = {}
    if arm["scheduler"] == "maestro":
        extra = dict(
            scheduler_cls="serving.vllm_plugin.scheduler.MaestroScheduler",
            additional_config={"maestro_scheduler": arm["maestro_config"]},
        )
    args = EngineArgs(
        model=engine["model_dir"],
        load_format="dummy",
        enforce_eager=True,
        skip_tokenizer_init=True,
        kv_cache_memory_bytes=engine["kv_cache_bytes"],
        block_size=engine["block_size"],
        max_model_len=engine["max_model_len"],
        max_num_seqs=engine["max_num_seqs"],
        max_num_batched_tokens=engine["max_num_batched_tokens"],
        seed=engine["seed"],
        scheduling_policy=arm["policy"],
        enable_prefix_caching=True,
        **extra,
    )
    return LLMEngine.from_engine_args(args, stat_loggers=[MaestroStatLogger])
