"""A predictor's boosters (the two-stage model's and the workflow model's) compiled to native code (treelite + tl2cgen,
the `fast` extra): an optional artifact saved beside a predictor, loaded with it, and answering exactly as LightGBM
does. With pipelines.row_walker (the default) they answer batches and the walker one row.

tl2cgen turns each booster into C: its trees in units of TREES_PER_UNIT, each a function adding its trees'
leaves to a row's sum in LightGBM's tree order, thresholds compared as integers (a value's rank among the
booster's thresholds: "quantize"), the classifier's sigmoid applied as LightGBM applies it. Our own driver (DRIVER)
runs a block of rows through one unit after another, so that a unit's code stays in the core's instruction cache
for the whole block (a row at a time through every tree streams megabytes of code per row); gcc builds both into
one shared library per booster, which is all that loading needs (ctypes, no tl2cgen). A library missing,
changed, built for other predictor files or on another kind of machine is not loaded: the boosters stay
LightGBM's, with a warning.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import math
import platform
import shutil
import threading
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

DIRECTORY = "compiled_trees"  # inside a saved predictor's directory
MANIFEST = "manifest.json"
TREES_PER_UNIT = 10  # ~60 kB of code: a unit fits the instruction cache while a block of rows goes through it
BLOCK_ROWS = 64
# predict_rows(rows, n, pred_margin, out): n float64 rows of the booster's features (NaN: missing) → n outputs.
# tl2cgen's units read a row as `union Entry`s: `missing` -1, the value as given (a categorical feature) or its
# quantised rank (quantize, tl2cgen's); the sum starts at 0, gains the base score, then the postprocessor.
DRIVER = r"""
#include "header.h"
extern const unsigned char is_categorical[];
typedef void (*unit_fn)(union Entry*, double*);
static const unit_fn units[] = {%(units)s};

void predict_rows(const double* rows, int64_t num_rows, int pred_margin, double* out) {
  const int64_t nf = %(num_feature)d, block = %(block)d;
  union Entry* work = (union Entry*)malloc(sizeof(union Entry) * nf * block);
  for (int64_t start = 0; start < num_rows; start += block) {
    const int64_t n = num_rows - start < block ? num_rows - start : block;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < nf; ++i) {
        const double value = rows[(start + r) * nf + i];
        union Entry* entry = work + r * nf + i;
        if (isnan(value)) entry->missing = -1;
        else if (is_categorical[i]) entry->fvalue = value;
        else entry->qvalue = quantize(value, (unsigned)i);
      }
      out[start + r] = 0.0;
    }
    for (size_t u = 0; u < sizeof(units) / sizeof(units[0]); ++u)
      for (int64_t r = 0; r < n; ++r) units[u](work + r * nf, out + start + r);
    for (int64_t r = 0; r < n; ++r) {
      out[start + r] += %(base_score)s;
      if (!pred_margin) postprocess(out + start + r);
    }
  }
  free(work);
}
"""


def machine() -> dict:
    """What a library built here needs of the machine that loads it."""
    return {"system": platform.system(), "machine": platform.machine()}


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compile_boosters(boosters: dict, directory: Path, model_sha256: str) -> dict:
    """Build one library per LightGBM booster of `boosters` (name → Booster) into `directory`, and the
    manifest tying them to the predictor files they came from (`model_sha256`). Returns the manifest."""
    try:
        import tl2cgen
        import treelite
    except ImportError as error:
        raise ImportError(
            f"train.compile_trees needs the fast extra ({error}): pip install -e '.[fast]', and gcc; "
            "or set train.compile_trees: false"
        ) from error
    if shutil.which("gcc") is None:
        raise RuntimeError("train.compile_trees needs gcc on PATH to build the boosters; or set it to false")
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    started, files = time.perf_counter(), {}
    for name, booster in boosters.items():
        library = _build(treelite.frontend.from_lightgbm(booster), directory / f"{name}-source")
        library = library.rename(directory / f"{name}.so")
        shutil.rmtree(directory / f"{name}-source")
        files[name] = {"file": library.name, "sha256": file_digest(library), "num_trees": booster.num_trees()}
    manifest = {
        **machine(),
        "model_sha256": model_sha256,
        "tl2cgen": tl2cgen.__version__,
        "treelite": treelite.__version__,
        "compile_s": round(time.perf_counter() - started, 1),
        "boosters": files,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def _build(model, source: Path) -> Path:
    """tl2cgen's C for `model` (a treelite Model of one output) and DRIVER, built by gcc: the library's path."""
    import tl2cgen

    header = model.get_header_accessor()
    (base_score,), (num_target,) = header.get_field("base_scores"), header.get_field("num_target")
    if num_target != 1:
        raise ValueError(f"compiled boosters have one output; this one has {num_target}")
    tl2cgen.generate_c_code(
        model, source, params={"quantize": 1, "parallel_comp": math.ceil(model.num_tree / TREES_PER_UNIT)}
    )
    recipe = json.loads((source / "recipe.json").read_text())
    units = [f"predict_unit{i}" for i in range(sum(s["name"].startswith("tu") for s in recipe["sources"]))]
    driver = DRIVER % {
        "units": ", ".join(units),
        "num_feature": model.num_feature,
        "block": BLOCK_ROWS,
        "base_score": repr(float(base_score)),
    }
    (source / "driver.c").write_text(driver)
    recipe["sources"].append({"name": "driver", "length": driver.count("\n")})
    (source / "recipe.json").write_text(json.dumps(recipe))
    return Path(tl2cgen.create_shared("gcc", source, long_build_time_warning=False))


def load_boosters(directory: Path, model_sha256: str) -> dict[str, CompiledBooster] | None:
    """The libraries of `directory` (name → CompiledBooster) if they were built here, for this predictor's
    files, and are unchanged; else None, with a warning saying why (LightGBM then answers)."""
    manifest_path = directory / MANIFEST
    if not manifest_path.exists():
        return None
    manifest = json.loads(manifest_path.read_text())
    problem = _problem(manifest, directory, model_sha256)
    if problem is None:
        try:
            return {name: CompiledBooster(directory / entry["file"]) for name, entry in manifest["boosters"].items()}
        except (OSError, AttributeError) as error:  # a library the loader refuses, or one without the driver
            problem = f"they do not load ({error})"
    log.warning(
        "compiled boosters in %s not used, LightGBM answers: %s; rebuild them with "
        "`pipelines.compiled_trees` on this machine (train.compile_trees: true)",
        directory,
        problem,
    )
    return None


def _problem(manifest: dict, directory: Path, model_sha256: str) -> str | None:
    if {k: manifest.get(k) for k in machine()} != machine():
        return f"built on {manifest.get('system')}/{manifest.get('machine')}, this is {machine()}"
    if manifest.get("model_sha256") != model_sha256:
        return "built for other predictor files"
    for entry in manifest["boosters"].values():
        library = directory / entry["file"]
        if not library.exists():
            return f"{library.name} is missing"
        if file_digest(library) != entry["sha256"]:
            return f"{library.name} changed after it was built"
    return None


class CompiledBooster:
    """One compiled booster, called as RowPredictor is: a float64 matrix of the booster's columns (NaN where
    missing) → its predictions (the classifier's probability, a regressor's raw sum). One row goes through a row
    and an output buffer whose pointers are made once (an array's `.ctypes.data` costs ~10 µs a call)."""

    def __init__(self, library: Path):
        self.library = library
        self._lib = ctypes.CDLL(str(library))
        self._lib.predict_rows.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p)
        self._lib.predict_rows.restype = None
        self.num_feature = int(self._lib.get_num_feature())
        self._row, self._out = np.zeros((1, self.num_feature), np.float64), np.zeros(1, np.float64)
        self._row_pointer, self._out_pointer = self._row.ctypes.data, self._out.ctypes.data
        self._lock = threading.Lock()  # one row buffer and one output buffer: one row at a time

    def __call__(self, matrix: np.ndarray) -> np.ndarray:
        if matrix.ndim != 2 or matrix.shape[1] != self.num_feature:
            raise ValueError(f"{self.library.name} reads {self.num_feature} columns, got an array of {matrix.shape}")
        if len(matrix) == 1:
            with self._lock:
                self._row[:] = matrix
                self._lib.predict_rows(self._row_pointer, 1, 0, self._out_pointer)
                return self._out.copy()
        rows = np.ascontiguousarray(matrix, np.float64)
        out = np.empty(len(rows), np.float64)
        self._lib.predict_rows(rows.ctypes.data, len(rows), 0, out.ctypes.data)
        return out


def model_boosters(model) -> dict:
    """A fitted TwoStageModel's LightGBM boosters by library name (a constant classifier has none)."""
    boosters = {f"regressor_{i}": booster for i, booster in enumerate(model.regressor_.boosters)}
    if not isinstance(model.classifier_, float):
        boosters["classifier"] = model.classifier_
    if hasattr(model, "upper_"):
        boosters["upper"] = model.upper_
    return boosters


def workflow_boosters(workflow) -> dict:
    """A fitted WorkflowRemainingModel's boosters by library name (none where the position table answers)."""
    pairs = (workflow.boosters_ or {}) if workflow is not None else {}
    return {f"workflow_{name}_{part}": b for name, pair in pairs.items() for part, b in zip(("median", "upper"), pair)}


def attach(model, directory: Path, model_sha256: str, workflow=None) -> bool:
    """Have `model` and `workflow` (a WorkflowRemainingModel, or None) answer through the compiled boosters in
    `directory` where they are usable (load_boosters). Libraries saved before the workflow model's were compiled
    serve the stage model alone."""
    compiled = load_boosters(directory, model_sha256)
    if compiled is None:
        return False
    stage, flow = model_boosters(model), workflow_boosters(workflow)
    if set(compiled) not in ({*stage, *flow}, set(stage)):
        log.warning(
            "compiled boosters in %s not used: they are %s, the models' are %s",
            directory,
            sorted(compiled),
            sorted({*stage, *flow}),
        )
        return False
    num_regressors = len(model.regressor_.boosters)
    model.use_row_predictors(
        classifier=compiled.get("classifier"),
        upper=compiled.get("upper"),
        regressors=[compiled[f"regressor_{i}"] for i in range(num_regressors)],
    )
    if flow and set(flow) <= set(compiled):
        workflow.use_row_predictors(
            {
                name: (compiled[f"workflow_{name}_median"], compiled[f"workflow_{name}_upper"])
                for name in workflow.boosters_
            }
        )
    return True
