"""One stage's row through a predictor's boosters in native code, the same floats as LightGBM's: each booster's trees
packed into one array of nodes (`pack`) and walked by a small fixed C function (SOURCE), built by gcc once at save
(< 1 s: the code does not depend on the model, unlike pipelines.compiled_trees' ~1 min a predictor).

Why it is faster than LightGBM's single-row API on a cold cache: a booster's nodes lie in one array in tree order, and
LANES trees are walked together, so their nodes' cache misses overlap instead of following one another. Each node
takes LightGBM's decision (Tree::NumericalDecision and CategoricalDecision: NaN and zero as missing, default
directions, category bitsets) and the leaves are summed in tree order, as LightGBM sums them; a row's values within
1e-35 of zero are zero first, as LightGBM's row reader makes them; a binary booster's sum goes through LightGBM's
sigmoid. Only one row goes through it: a batch stays with the model's other row predictor (LightGBM's, or the
compiled one). Saved beside the predictor: the library, the packed arrays and a manifest tying them to the predictor's
files and this machine; anything missing, changed or foreign is not loaded (LightGBM answers, with a warning).
"""

from __future__ import annotations

import ctypes
import json
import logging
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np

from pipelines.compiled_trees import file_digest, machine, model_boosters, workflow_boosters

log = logging.getLogger(__name__)

DIRECTORY = "row_walker"  # inside a saved predictor's directory
MANIFEST, LIBRARY, ARRAYS = "manifest.json", "walker.so", "boosters.npz"
LANES = 8  # trees walked together, their cache misses overlapping (pipelines/EXPERIMENTS.md: 1 to 16 tried)
NODE = np.dtype(
    [("value", "f8"), ("child", "i4", 2), ("feature", "i4"), ("nan_right", "u1"), ("kind", "u1"), ("pad", "u1", 2)]
)
IDENTITY_OBJECTIVES = ("quantile", "regression", "regression_l1", "huber", "fair", "custom", "none")
SOURCE = r"""
#include <math.h>
#include <stdint.h>

/* value: a split's threshold (a categorical split's: its index into cat_boundaries), a leaf's value; a leaf's
   children are itself. kind 0: numerical, NaN goes to child[nan_right]; 1: categorical; 2: numerical with zero
   (and NaN) as missing, which goes to child[nan_right] */
typedef struct { double value; int32_t child[2]; int32_t feature; uint8_t nan_right, kind, pad[2]; } Node;

#define ZERO_THRESHOLD 1e-35f
#define LANES %(lanes)d

static inline int32_t step(const Node* nodes, int32_t at, const double* x, const uint32_t* cat_threshold,
                           const int32_t* cat_boundaries) {
  const Node* n = nodes + at;
  const double f = x[n->feature];
  if (__builtin_expect(n->kind == 0, 1)) return n->child[(!(f <= n->value)) ^ (isnan(f) & (n->nan_right ^ 1))];
  if (n->kind == 1) {
    if (isnan(f) || (int)f < 0) return n->child[1];
    const int v = (int)f, c = (int)n->value, start = cat_boundaries[c], words = cat_boundaries[c + 1] - start;
    return n->child[!(v / 32 < words && ((cat_threshold[start + v / 32] >> (v %% 32)) & 1))];
  }
  const double g = isnan(f) ? 0.0 : f;
  if (g >= -ZERO_THRESHOLD && g <= ZERO_THRESHOLD) return n->child[n->nan_right];
  return n->child[!(g <= n->value)];
}

/* One row's prediction: the sum of every tree's leaf in tree order (LANES trees walked together, steps[g] deep),
   through the sigmoid where sigmoid > 0. */
double walk_row(const Node* nodes, const int32_t* roots, const int32_t* steps, int64_t num_trees,
                const uint32_t* cat_threshold, const int32_t* cat_boundaries, const double* row, int64_t num_feature,
                double sigmoid) {
  double x[num_feature];
  for (int64_t i = 0; i < num_feature; ++i) x[i] = (fabs(row[i]) > ZERO_THRESHOLD || isnan(row[i])) ? row[i] : 0.0;
  double sum = 0.0;
  int64_t t = 0;
  for (; t + LANES <= num_trees; t += LANES) {
    int32_t at[LANES];
    for (int l = 0; l < LANES; ++l) at[l] = roots[t + l];
    for (int32_t s = steps[t / LANES]; s > 0; --s)
      for (int l = 0; l < LANES; ++l) at[l] = step(nodes, at[l], x, cat_threshold, cat_boundaries);
    for (int l = 0; l < LANES; ++l) sum += nodes[at[l]].value;
  }
  for (; t < num_trees; ++t) {
    int32_t at = roots[t];
    while (nodes[at].child[0] != at) at = step(nodes, at, x, cat_threshold, cat_boundaries);
    sum += nodes[at].value;
  }
  return sigmoid > 0 ? 1.0f / (1.0f + exp(-sigmoid * sum)) : sum;
}
"""


def _trees(model_string: str) -> list[dict[str, str]]:
    """The `key=value` lines of each tree of a LightGBM model string."""
    trees = []
    for line in model_string[: model_string.find("end of trees")].splitlines():
        if line.startswith("Tree="):
            trees.append({})
        elif trees and "=" in line:
            key, value = line.split("=", 1)
            trees[-1][key] = value
    return trees


def _sigmoid(head: str) -> float | None:
    """The sigmoid a booster's output goes through (0: none), read from its model string's header; None where the
    walker cannot answer as LightGBM does (several outputs, averaged trees, an objective with another transform)."""
    header = dict(line.split("=", 1) for line in head.splitlines() if "=" in line)
    objective = header.get("objective", "").split()
    if header.get("num_tree_per_iteration") != "1" or "average_output" in head.splitlines() or not objective:
        return None
    if objective[0] == "binary":
        return float(dict(o.split(":") for o in objective[1:]).get("sigmoid", 1.0))
    return 0.0 if objective[0] in IDENTITY_OBJECTIVES else None


def _depth(left: list[int], right: list[int]) -> int:
    """The longest path from a tree's root to a leaf (children < 0: leaves), in splits."""
    depth, stack = 0, [(0, 0)]
    while stack:
        node, d = stack.pop()
        if node < 0:
            depth = max(depth, d)
        else:
            stack += [(left[node], d + 1), (right[node], d + 1)]
    return depth


def _tree_nodes(tree: dict[str, str], base: int, cat_base: int) -> tuple[list[tuple], int]:
    """A tree's splits then leaves as NODE rows (children offset by `base`, category sets by `cat_base`), and its
    depth."""
    leaves = [float(v) for v in tree["leaf_value"].split()]
    num_splits = int(tree["num_leaves"]) - 1
    leaf_row = lambda i: (leaves[i], (base + num_splits + i,) * 2, 0, 0, 0, (0, 0))
    if num_splits == 0:
        return [leaf_row(0)], 0
    child = lambda c: base + c if c >= 0 else base + num_splits + ~c
    columns = ("split_feature", "threshold", "decision_type", "left_child", "right_child")
    feature, threshold, decision, left, right = ([float(v) for v in tree[c].split()] for c in columns)
    rows = []
    for f, value, d, lo, hi in zip(feature, threshold, map(int, decision), map(int, left), map(int, right)):
        missing, default_right = (d >> 2) & 3, int(not d & 2)
        if d & 1:  # categorical: the value indexes the tree's category sets
            kind, value, nan_right = 1, float(int(value) + cat_base), 1
        else:  # missing type None: NaN reads as 0.0; NaN: the default direction; Zero: kind 2
            kind = 2 if missing == 1 else 0
            nan_right = default_right if missing else int(not 0.0 <= value)
        rows.append((value, (child(lo), child(hi)), int(f), nan_right, kind, (0, 0)))
    return rows + [leaf_row(i) for i in range(num_splits + 1)], _depth(list(map(int, left)), list(map(int, right)))


def pack(booster) -> dict[str, np.ndarray] | None:
    """A LightGBM booster's trees as the arrays walk_row reads, or None where it cannot answer as LightGBM does
    (an objective whose output transform it lacks, several outputs, linear trees)."""
    model_string = booster.model_to_string(num_iteration=-1)
    sigmoid, trees = _sigmoid(model_string[: model_string.find("Tree=")]), _trees(model_string)
    if sigmoid is None or any(t.get("is_linear", "0") != "0" for t in trees):
        return None
    nodes, roots, depths, cat_threshold, cat_boundaries = [], [], [], [], [0]
    for tree in trees:
        rows, depth = _tree_nodes(tree, len(nodes), len(cat_boundaries) - 1)
        if int(tree.get("num_cat", "0")):
            cat_boundaries += [cat_boundaries[-1] + int(b) for b in tree["cat_boundaries"].split()[1:]]
            cat_threshold += [int(w) for w in tree["cat_threshold"].split()]
        roots.append(len(nodes))
        nodes += rows
        depths.append(depth)
    steps = [max(depths[g : g + LANES]) for g in range(0, len(depths) - len(depths) % LANES, LANES)]
    return {
        "nodes": np.array(nodes, NODE),
        "roots": np.array(roots, np.int32),
        "steps": np.array(steps or [0], np.int32),
        "cat_threshold": np.array(cat_threshold or [0], np.uint32),
        "cat_boundaries": np.array(cat_boundaries, np.int32),
        "num_feature": np.array(booster.num_feature(), np.int64),
        "sigmoid": np.array(sigmoid, np.float64),
    }


class RowWalker:
    """One packed booster, called as RowPredictor is (a float64 matrix of the booster's columns → its predictions):
    one row through walk_row, more rows through `batch` (the model's other row predictor)."""

    def __init__(self, library: ctypes.CDLL, arrays: dict[str, np.ndarray], batch):
        self.arrays, self.batch = arrays, batch
        self.num_feature = int(arrays["num_feature"])
        self._row, self._walk = np.zeros(self.num_feature, np.float64), library.walk_row
        pointer = lambda name: ctypes.c_void_p(arrays[name].ctypes.data)
        self._arguments = (
            *map(pointer, ("nodes", "roots", "steps")),
            ctypes.c_int64(len(arrays["roots"])),
            *map(pointer, ("cat_threshold", "cat_boundaries")),
            ctypes.c_void_p(self._row.ctypes.data),
            ctypes.c_int64(self.num_feature),
            ctypes.c_double(float(arrays["sigmoid"])),
        )
        self._lock = threading.Lock()  # one row buffer: one row at a time

    def __call__(self, matrix: np.ndarray) -> np.ndarray:
        if len(matrix) != 1:
            return self.batch(matrix)
        with self._lock:
            self._row[:] = matrix[0]
            return np.array([self._walk(*self._arguments)])


def build_library(directory: Path) -> Path:
    """SOURCE built by gcc into `directory`: the library's path (RuntimeError where gcc is missing or fails)."""
    if shutil.which("gcc") is None:
        raise RuntimeError("no gcc on PATH")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "walker.c").write_text(SOURCE % {"lanes": LANES})
    command = ["gcc", "-O2", "-std=c99", "-shared", "-fPIC", "-o", LIBRARY, "walker.c", "-lm"]
    built = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    if built.returncode != 0:
        raise RuntimeError(f"gcc failed: {built.stderr.strip()[-500:]}")
    return directory / LIBRARY


def load_library(path: Path) -> ctypes.CDLL:
    library = ctypes.CDLL(str(path))
    library.walk_row.argtypes = (ctypes.c_void_p,) * 3 + (ctypes.c_int64,) + (ctypes.c_void_p,) * 3
    library.walk_row.argtypes += (ctypes.c_int64, ctypes.c_double)
    library.walk_row.restype = ctypes.c_double
    return library


def save(model, workflow, directory: Path, model_sha256: str) -> dict | None:
    """Build the walker and pack the boosters into `directory` (gcc on PATH), with the manifest tying them to the
    predictor files they came from (`model_sha256`); the manifest, or None with a warning where gcc is missing or
    fails (LightGBM then answers one row, as before)."""
    shutil.rmtree(directory, ignore_errors=True)
    boosters = {**model_boosters(model), **workflow_boosters(workflow)}
    packed = {name: arrays for name, b in boosters.items() if (arrays := pack(b)) is not None}
    try:
        if not packed:
            raise RuntimeError("no booster it can walk")
        build_library(directory)
    except RuntimeError as error:
        log.warning("train.row_walker: %s; LightGBM answers one row", error)
        shutil.rmtree(directory, ignore_errors=True)
        return None
    np.savez(directory / ARRAYS, **{f"{name}/{key}": a for name, arrays in packed.items() for key, a in arrays.items()})
    manifest = {
        **machine(),
        "model_sha256": model_sha256,
        "files": {f: file_digest(directory / f) for f in (LIBRARY, ARRAYS)},
        "boosters": sorted(packed),
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def attach(model, workflow, directory: Path, model_sha256: str) -> bool:
    """Have `model` and `workflow` answer one row through the walker saved in `directory`, where it was built here,
    for this predictor's files, and is unchanged; else they stay as they are, with a warning saying why."""
    if not (directory / MANIFEST).exists():
        return False
    manifest = json.loads((directory / MANIFEST).read_text())
    problem = _problem(manifest, directory, model_sha256)
    if problem is None:
        try:
            library = load_library(directory / LIBRARY)
            with np.load(directory / ARRAYS) as stored:
                arrays = {key: stored[key] for key in stored.files}
        except (OSError, AttributeError, ValueError) as error:
            problem = f"they do not load ({error})"
    if problem is not None:
        log.warning("row walker in %s not used, LightGBM answers one row: %s", directory, problem)
        return False
    walk = lambda name, batch: (
        batch
        if name not in manifest["boosters"]
        else RowWalker(library, {k.split("/", 1)[1]: a for k, a in arrays.items() if k.startswith(f"{name}/")}, batch)
    )
    rows = model._rows
    model.use_row_predictors(
        classifier=walk("classifier", rows["classifier"]),
        upper=walk("upper", rows["upper"]) if rows["upper"] is not None else None,
        regressors=[walk(f"regressor_{i}", r) for i, r in enumerate(rows["regressors"])],
    )
    if workflow is not None and workflow.boosters_ is not None:
        workflow.use_row_predictors(
            {
                name: (walk(f"workflow_{name}_median", median), walk(f"workflow_{name}_upper", upper))
                for name, (median, upper) in workflow._rows.items()
            }
        )
    return True


def _problem(manifest: dict, directory: Path, model_sha256: str) -> str | None:
    if {k: manifest.get(k) for k in machine()} != machine():
        return f"built on {manifest.get('system')}/{manifest.get('machine')}, this is {machine()}"
    if manifest.get("model_sha256") != model_sha256:
        return "built for other predictor files"
    for name, digest in manifest["files"].items():
        if not (directory / name).exists():
            return f"{name} is missing"
        if file_digest(directory / name) != digest:
            return f"{name} changed after it was built"
    return None
