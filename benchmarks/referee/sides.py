"""Which tasks the referee trains on, tunes on and reports on.

Tasks (not stages, not workflows) are split, so that no task has stages on two sides: `train` (70 %) fits the
predictor and fixes the SLOs; the other 30 % are replayed, halved by a hash of the task id into `dev` (for choosing
policies) and `locked` (reported once per change). Both splits hash the task id (`pipelines.featurize.locked_split`),
so a task's side never depends on the rest of the data or a seed. `--folds K` instead assigns the tasks to K folds by
the same kind of hash, and each fold is replayed with a predictor trained on the other K − 1. `--folds family`
groups the traces by app family instead (`FAMILIES`): each family is replayed with the predictor trained on the other
families. Its apps' SLOs come from what a live system has for an app it never served: the owner's declaration, made
from a pilot. A seeded `CALIBRATION_FRACTION` of the family's tasks (by a salted hash of the task id) is that pilot:
its workflows fix the family's per-app SLOs by the same rule as every other app's (`SLOTable.declared`), and they
are never replayed nor trained on. Policy parameters are never chosen per family.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from maestro.contract import StageTrace, read_traces, task_id, write_jsonl
from pipelines.featurize import locked_split

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
DEFAULT_TRACES = (SHARED / "dev-traces" / "dev_traces.jsonl", *sorted((SHARED / "agent-traces").glob("*.jsonl")))
SIDES = ("dev", "locked")
CALIBRATION_FRACTION = 0.3  # a left-out family's tasks that make its owner's pilot (SLOs only, never replayed)
# app (a trace's `app` field) -> app family; telecom and telecom-solo run the same tasks, so they are one family
FAMILIES = {
    "chatdev_warehouse": "chatdev",
    "autogen_notebooks": "autogen",
    "tau2_retail": "tau2-retail",
    "tau2_telecom": "tau2-telecom",
    "tau2_telecom_solo": "tau2-telecom",
    "tau2_medical_triage": "tau2-medical-triage",
}


@dataclass
class Split:
    """One train side, the replayed side it is judged on, and the replayed apps' calibration tasks (their SLOs'
    source where the train side has none of their apps; empty otherwise)."""

    name: str
    train: list[StageTrace]
    test: list[StageTrace]
    calibration: list[StageTrace] = field(default_factory=list)

    def write(self, work: Path) -> tuple[Path, Path]:
        work.mkdir(parents=True, exist_ok=True)
        train, test = work / "train.jsonl", work / "test.jsonl"
        write_jsonl(self.train, train)
        write_jsonl(self.test, test)
        return train, test


def read_all(paths) -> list[StageTrace]:
    stages = []
    for path in paths:
        result = read_traces(path)
        if result.errors:
            print(result.report(limit=3))
        stages += result.stages
    return stages


def task_bucket(stage: StageTrace, buckets: int, salt: str) -> int:
    """A task's bucket by a salted hash of its id: stable whatever else is in the data."""
    return int(hashlib.sha256(f"{salt}:{task_id(stage)}".encode()).hexdigest(), 16) % buckets


def side_split(stages: list[StageTrace], side: str, test_fraction: float = 0.3) -> Split:
    """The train side and one half (`dev` or `locked`) of the held-out tasks."""
    if side not in SIDES:
        raise ValueError(f"--side must be one of {', '.join(SIDES)}, got '{side}'")
    train_idx, test_idx = locked_split(stages, test_fraction)
    held = [stages[i] for i in test_idx]
    want = SIDES.index(side)
    return Split(side, [stages[i] for i in train_idx], [s for s in held if task_bucket(s, 2, "referee-side") == want])


def fold_splits(stages: list[StageTrace], folds: int) -> list[Split]:
    """K task folds: each replayed with a predictor trained on the others."""
    if folds < 2:
        raise ValueError(f"--folds must be >= 2, got {folds}")
    bucket = [task_bucket(s, folds, "referee-fold") for s in stages]
    splits = []
    for k in range(folds):
        train = [s for s, b in zip(stages, bucket) if b != k]
        test = [s for s, b in zip(stages, bucket) if b == k]
        if not train or not test:
            raise ValueError(f"fold {k} of {folds} has no tasks on one side: use fewer folds")
        splits.append(Split(f"fold{k}", train, test))
    return splits


def app_family(stage: StageTrace) -> str:
    """The app family of a stage's trace, by its `app` field."""
    try:
        return FAMILIES[stage.app]
    except KeyError:
        raise ValueError(
            f"trace '{stage.workflow_id}' has app {stage.app!r}, of no known family; known apps: "
            f"{', '.join(FAMILIES)} (add the app to FAMILIES in benchmarks/referee/sides.py, or use --folds K)"
        ) from None


def is_calibration(stage: StageTrace) -> bool:
    """Whether the stage's task is in its family's calibration pilot (`CALIBRATION_FRACTION` of tasks, by hash)."""
    return task_bucket(stage, 1000, "referee-calibration") < round(1000 * CALIBRATION_FRACTION)


def family_splits(stages: list[StageTrace]) -> list[Split]:
    """Leave one family out: each family replayed but for its calibration tasks, the other families the train side
    (families in `FAMILIES` order)."""
    family = [app_family(s) for s in stages]
    present = [f for f in dict.fromkeys(FAMILIES.values()) if f in family]
    if len(present) < 2:
        raise ValueError(f"--folds family needs traces of two families or more, got {present or 'none'}")
    return [family_split(name, stages, family) for name in present]


def family_split(name: str, stages: list[StageTrace], family: list[str]) -> Split:
    held = [s for s, f in zip(stages, family) if f == name]
    split = Split(
        name,
        [s for s, f in zip(stages, family) if f != name],
        [s for s in held if not is_calibration(s)],
        [s for s in held if is_calibration(s)],
    )
    for app in dict.fromkeys(s.app for s in held):
        sides = [side for side in ("test", "calibration") if not any(s.app == app for s in getattr(split, side))]
        if sides:
            raise ValueError(
                f"family '{name}': app '{app}' has no task on the {' and '.join(sides)} side of its calibration "
                f"split ({CALIBRATION_FRACTION:.0%} of its tasks fix its SLO): add traces of more of its tasks"
            )
    return split


def split_model(split: Split, work: Path, retrain: bool = False) -> Path:
    """The split's predictor, trained on its train side only, in `work/<split>/model` (cached)."""
    train_path, _ = split.write(work / split.name)
    return train_model(train_path, work / split.name / "model", retrain)


def train_model(train: Path, out: Path, retrain: bool = False) -> Path:
    """The predictor trained on `train` with `maestro train`, reused while `out` holds one trained on the same
    stages (their digest in `out/train.sha256`), unless `retrain`."""
    digest = hashlib.sha256(train.read_bytes()).hexdigest()
    stamp = out / "train.sha256"
    fresh = (out / "predictor.joblib").exists() and stamp.exists() and stamp.read_text() == digest
    if retrain or not fresh:
        from maestro.cli import main as maestro

        maestro(["train", "--traces", str(train), "--out", str(out)])
        stamp.write_text(digest)
    return out
