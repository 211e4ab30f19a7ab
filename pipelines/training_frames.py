"""The label and feature frames of labelled stages that training and evaluation read: one label row per stage (its
identity, its task group, its outcome), and the feature rows beside them, with the history copies training fits on
and the with/without-ancestors copies a test is scored on."""

from __future__ import annotations

import numpy as np
import pandas as pd

from maestro.contract import StageTrace, task_id
from pipelines.features import UNKNOWN, Featurizer
from pipelines.history import hide_labels, without_labels


def label_frame(stages: list[StageTrace]) -> pd.DataFrame:
    """Identity, grouping and labels of labelled stages, aligned with their feature rows."""
    return pd.DataFrame(
        {
            "workflow_id": [s.workflow_id for s in stages],
            "stage_id": [s.stage_id for s in stages],
            "role": [s.role for s in stages],
            "app": [s.app or UNKNOWN for s in stages],
            "group": [task_id(s) for s in stages],
            "tokens": [s.output_tokens for s in stages],
            "is_tool": [bool(s.is_tool_call) for s in stages],
        }
    )


def select_stages(stages: list[StageTrace], labels: pd.DataFrame) -> list[StageTrace]:
    """The stages among `stages` that a label frame holds (its stages as they are: the "full" copy where it has
    copies), in the order of `stages`: a split's stages back from its labels."""
    rows = labels[labels["copy"].eq("full")] if "copy" in labels else labels
    wanted = set(zip(rows["workflow_id"].astype(str), rows["stage_id"].astype(str)))
    return [s for s in stages if (s.workflow_id, s.stage_id) in wanted]


def training_frame(
    featurizer: Featurizer, stages: list[StageTrace], seed: int = 0, progress: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Feature rows and label rows of labelled `stages`: as they are ("full"), and, when the featurizer's
    config asks for history copies, again for the stages with parents with every label of the workflow
    hidden ("none", fitted on) and with a random half hidden ("partial", calibrated on only). Labels
    gain `copy` and `calibrate_only`."""
    labels = label_frame(stages)
    frames, parts = [featurizer.transform(stages, progress=progress)], [labels.assign(copy="full")]
    if featurizer.config.history_copies:
        has_parents = np.array([bool(s.parent_ids) for s in stages])
        for copy, share in (("none", 1.0), ("partial", 0.5)):
            X = featurizer.transform(hide_labels(stages, share, seed), progress=progress)
            frames.append(X[has_parents])
            parts.append(labels[has_parents].assign(copy=copy))
    labels = pd.concat(parts, ignore_index=True)
    return pd.concat(frames, ignore_index=True), labels.assign(calibrate_only=labels["copy"].eq("partial"))


def evaluation_frame(
    featurizer: Featurizer, stages: list[StageTrace], progress: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Feature and label rows of labelled test `stages` twice: as they are ("full" copy: the ancestors'
    outcomes known) and with every label stripped ("none": what a stage sent alone gets)."""
    labels = label_frame(stages)
    X = [
        featurizer.transform(stages, progress=progress),
        featurizer.transform([without_labels(s) for s in stages], progress=progress),
    ]
    return (
        pd.concat(X, ignore_index=True),
        pd.concat([labels.assign(copy="full"), labels.assign(copy="none")], ignore_index=True),
    )
