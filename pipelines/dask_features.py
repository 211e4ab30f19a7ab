"""Stage features on a Dask cluster: partitioned Parquet traces in, one feature partition per trace partition out.

The trace layout is a directory of Parquet files with three columns: `workflow_id`, `stage_id` and `record`,
the stage's contract JSON line (a prompt is text or a list of messages whose keys vary, which one Parquet
schema cannot hold across files). `write_trace_parquet` writes it; `to_trace_parquet` converts any trace file
or directory `collect` reads, one file at a time. Partitions are shuffled on `workflow_id`, so that every
stage sits beside its ancestors, then each partition is featurized by the same `Featurizer.transform` as on
one machine. The categories are counted over all stages; the PCA is fitted on a sample of their embeddings
(`pca_sample`); each worker embeds its partitions with one MiniLM and the shared embedding cache.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from maestro.contract import StageTrace, parse_record, read_traces, task_id
from maestro.structure import derive_structure
from pipelines.collect import source_files
from pipelines.embedding import Embedder, EmbedderConfig
from pipelines.features import CATEGORICAL, Featurizer, FeaturizerConfig, frequent_categories, structural_frame
from pipelines.static_embedding import StaticEmbedder

TRACE_COLUMNS = ("workflow_id", "stage_id", "record")
LABEL_PREFIX = "label_"  # columns of a feature partition that are labels, not features


# ---- the Parquet trace layout ------------------------------------------------------------------
def write_trace_parquet(
    stages: Iterable[StageTrace | dict], out_dir: str | Path, stages_per_file: int = 20_000, first_part: int = 0
) -> int:
    """Write stages as `part-NNNNN.parquet` files of `stages_per_file` rows; returns the number of files."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    batch, part = [], first_part
    for stage in stages:
        record = stage.model_dump(exclude_none=True) if isinstance(stage, StageTrace) else stage
        batch.append((str(record["workflow_id"]), str(record["stage_id"]), json.dumps(record, ensure_ascii=False)))
        if len(batch) == stages_per_file:
            _write_part(batch, out_dir / f"part-{part:05d}.parquet")
            batch, part = [], part + 1
    if batch:
        _write_part(batch, out_dir / f"part-{part:05d}.parquet")
        part += 1
    return part - first_part


def _write_part(rows: list[tuple[str, str, str]], path: Path) -> None:
    columns = {name: pa.array([row[i] for row in rows], pa.string()) for i, name in enumerate(TRACE_COLUMNS)}
    pq.write_table(pa.table(columns), path)


def is_trace_parquet(path: str | Path) -> bool:
    """A directory of Parquet files in the layout above (checked on the first file's schema)."""
    files = sorted(Path(path).glob("*.parquet")) if Path(path).is_dir() else []
    return bool(files) and set(TRACE_COLUMNS) <= set(pq.read_schema(files[0]).names)


def to_trace_parquet(source: str | Path, out_dir: str | Path, stages_per_file: int = 20_000) -> Path:
    """Convert a trace file or directory (JSONL / contract Parquet) file by file; returns `out_dir`."""
    part = 0
    for path in source_files(source):
        part += write_trace_parquet(read_traces(path, derive=False).stages, out_dir, stages_per_file, part)
    return Path(out_dir)


def read_trace_parquet(path: str | Path) -> dd.DataFrame:
    """The trace directory as a Dask frame, shuffled so that each workflow lies in one partition."""
    if not is_trace_parquet(path):
        raise ValueError(
            f"{path} is not a trace Parquet directory (files with columns {', '.join(TRACE_COLUMNS)}): "
            "convert traces with pipelines.dask_features.to_trace_parquet, or pass the trace "
            "file to `maestro train --dask`, which converts it"
        )
    frame = dd.read_parquet(str(path), columns=list(TRACE_COLUMNS))
    return frame.shuffle(on="workflow_id", npartitions=frame.npartitions) if frame.npartitions > 1 else frame


def labelled_stages(part: pd.DataFrame) -> list[StageTrace]:
    """A partition's stages with structure derived over the whole workflow, labelled ones only."""
    stages = derive_structure([parse_record(json.loads(r)) for r in part["record"]])
    return [s for s in stages if s.is_labelled and s.is_tool_call is not None]


# ---- fitting the featurizer --------------------------------------------------------------------
def _fit_columns(part: pd.DataFrame, embedder_config: EmbedderConfig) -> pd.DataFrame:
    """What fitting reads from a partition: the categorical values and the embedded segment of each prompt."""
    stages = labelled_stages(part)
    frame = structural_frame(stages).reindex(columns=list(CATEGORICAL)).astype(object)
    segment = Embedder(embedder_config).segment
    return frame.assign(segment=[segment(s.prompt_text()) for s in stages]).reset_index(drop=True)


def fit_featurizer(
    traces: dd.DataFrame, config: FeaturizerConfig, embedder: Embedder | StaticEmbedder, pca_sample: int, seed: int = 0
) -> tuple[Featurizer, int]:
    """The featurizer fitted on all labelled stages: categories counted over the partitions, the PCA on
    `pca_sample` of their embeddings. Returns it and the number of labelled stages."""
    meta = pd.DataFrame({c: pd.Series(dtype=object) for c in (*CATEGORICAL, "segment")})
    columns = traces.map_partitions(_fit_columns, config.embedder, meta=meta).persist()
    num_stages = int(len(columns))
    counts = dict(zip(CATEGORICAL, dd.compute(*(columns[c].value_counts() for c in CATEGORICAL))))
    # Featurizer's own rule (which categories are frequent enough), fed the counts summed over the partitions.
    categories = {c: frequent_categories(counts[c], config.min_category_count) for c in CATEGORICAL}
    featurizer = Featurizer.from_state({"config": config, "categories": categories, "pca": None}, embedder)
    if config.use_embedding and num_stages:
        fraction = min(1.0, pca_sample / num_stages)
        featurizer.fit_embedding(columns["segment"].sample(frac=fraction, random_state=seed).compute().tolist())
    del columns
    return featurizer, num_stages


# ---- featurizing every partition -----------------------------------------------------------------
@functools.lru_cache(maxsize=2)
def worker_embedder(config: EmbedderConfig, cache_path: str | None) -> Embedder:
    """One embedder per worker process (MiniLM loaded once), warmed from the shared cache file."""
    embedder = Embedder(config)
    if cache_path:
        embedder.load_cache(cache_path)
    return embedder


def worker_cache(config: EmbedderConfig, cache_path: str | None) -> tuple[list[str], np.ndarray]:
    """A worker's embedding cache (keys, vectors), to merge into the shared cache file (`Client.run`)."""
    return worker_embedder(config, cache_path).cached()


def fold_of(groups: pd.Series, folds: int) -> np.ndarray:
    """Each workflow group's fold: a stable hash of the group id, the same in every process."""
    return (pd.util.hash_pandas_object(groups.astype(str), index=False).to_numpy() % folds).astype(np.int8)


def _feature_partition(
    part: pd.DataFrame, state: dict, cache_path: str | None, folds: int, empty: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Features (Featurizer.transform) and labels of a partition's labelled stages; numbers as float64.
    `empty`: the answer for a partition without labelled stages."""
    stages = labelled_stages(part)
    if not stages:
        return pd.DataFrame() if empty is None else empty
    featurizer = Featurizer.from_state(state, worker_embedder(state["config"].embedder, cache_path))
    X = featurizer.transform(stages)
    X = X.astype({c: np.float64 for c, dtype in X.dtypes.items() if not isinstance(dtype, pd.CategoricalDtype)})
    groups = pd.Series([task_id(s) for s in stages], index=X.index)
    return X.assign(
        **{
            f"{LABEL_PREFIX}tokens": [float(s.output_tokens) for s in stages],
            f"{LABEL_PREFIX}is_tool": [int(bool(s.is_tool_call)) for s in stages],
            f"{LABEL_PREFIX}stage_role": [s.role for s in stages],  # the priors' key
            f"{LABEL_PREFIX}fold": fold_of(groups, folds),
        }
    )


def feature_frame(traces: dd.DataFrame, featurizer: Featurizer, cache_path: str | None, folds: int) -> dd.DataFrame:
    """Every partition's features and labels (`label_*` columns), lazily: persist it before training."""
    state = featurizer.state()
    head = traces.partitions[0].head(64, compute=True)  # the columns and dtypes every partition answers with
    meta = _feature_partition(head, state, cache_path, folds).iloc[:0]
    if not len(meta.columns):
        raise ValueError(
            "the first trace partition holds no labelled stage: training needs output_tokens and "
            "is_tool_call on each stage"
        )
    return traces.map_partitions(_feature_partition, state, cache_path, folds, meta, meta=meta)
