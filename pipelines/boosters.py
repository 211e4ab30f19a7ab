"""LightGBM boosters at predict time: the float matrix they read, one row through the single-row C API, the
bagged regressor, and a classifier that may be a constant."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field

import lightgbm as lgb
import numpy as np
import pandas as pd


def as_matrix(X: pd.DataFrame, categories: list[list] | None) -> np.ndarray:
    """The matrix LightGBM builds from a frame: categoricals as codes of their training categories
    (`categories`, in column order), unknown or missing values as NaN, everything as float64."""
    is_categorical = np.array([isinstance(dtype, pd.CategoricalDtype) for dtype in X.dtypes], bool)
    matrix = np.empty(X.shape, np.float64)
    numeric = np.flatnonzero(~is_categorical)
    if len(numeric):
        matrix[:, numeric] = X.iloc[:, numeric].to_numpy(dtype=np.float64, na_value=np.nan)
    for j, known in zip(np.flatnonzero(is_categorical), categories or []):
        column = X.iloc[:, j]
        if list(column.cat.categories) != list(known):
            column = column.cat.set_categories(known)
        codes = column.cat.codes.to_numpy()
        matrix[:, j] = np.where(codes < 0, np.nan, codes)
    return matrix


def column_matrix(columns: dict, names: list[str], num_rows: int) -> np.ndarray:
    """The C-contiguous (num_rows, len(names)) float64 matrix of `columns` (name → num_rows values, a list or an
    array; None: NaN) in `names` order. One row is built from one flat list: numpy's shape discovery over a list
    of one-value lists costs ~20 µs more."""
    if num_rows == 1:
        return np.array([[columns[c][0] for c in names]], np.float64)
    matrix = np.array([columns.get(c, ()) for c in names], np.float64).reshape(len(names), num_rows)
    return np.ascontiguousarray(matrix.T)


def raw_score(classifier: lgb.Booster | float, X: pd.DataFrame | np.ndarray) -> np.ndarray:
    """The tool-call classifier's uncalibrated scores (a constant where training held one class only)."""
    return np.full(len(X), classifier) if isinstance(classifier, float) else classifier.predict(X)


class RowPredictor:
    """Booster.predict for float64 matrices of the booster's columns. One row goes through LightGBM's single-row
    C API, everything it is called with made once here: its config and thread count (Booster.predict spends ~30 µs
    a call on checks and set-up, more than the trees take for one row), and the ctypes pointers to a row buffer and
    an output buffer (an array's `.ctypes.data` builds a helper object, ~10 µs a call). More rows: one
    Booster.predict call."""

    def __init__(self, booster: lgb.Booster):
        from lightgbm.basic import _LIB, _c_str, _safe_call

        self.booster, self._lib, self._check = booster, _LIB, _safe_call
        self._config = ctypes.c_void_p()
        _safe_call(
            _LIB.LGBM_BoosterPredictForMatSingleRowFastInit(
                booster._handle,
                ctypes.c_int(0),
                ctypes.c_int(0),
                ctypes.c_int(-1),  # normal prediction, every tree
                ctypes.c_int(1),
                ctypes.c_int32(booster.num_feature()),
                _c_str("num_threads=1"),  # float64 rows
                ctypes.byref(self._config),
            )
        )
        self._predict = _LIB.LGBM_BoosterPredictForMatSingleRowFast
        self._row = np.zeros(booster.num_feature(), np.float64)
        self._out = np.zeros(1, np.float64)
        self._out_len = ctypes.c_int64()
        self._arguments = (
            self._config,
            ctypes.c_void_p(self._row.ctypes.data),
            ctypes.byref(self._out_len),
            ctypes.c_void_p(self._out.ctypes.data),
        )
        self._lock = threading.Lock()  # one row buffer, one output buffer and one fast config: one row at a time

    def __call__(self, matrix: np.ndarray) -> np.ndarray:
        if len(matrix) != 1:
            return self.booster.predict(matrix)
        with self._lock:
            self._row[:] = matrix[0]
            self._check(self._predict(*self._arguments))
            return self._out.copy()

    def __del__(self) -> None:
        if getattr(self, "_config", None) is not None and self._config.value:
            self._lib.LGBM_FastConfigFree(self._config)


@dataclass
class Regressor:
    """One booster, or the mean of several (`booster` and `more`), on top of a constant `base`."""

    booster: lgb.Booster
    base: float
    more: list = field(default_factory=list)

    @property
    def boosters(self) -> list[lgb.Booster]:
        return [self.booster, *getattr(self, "more", [])]  # models saved before bagging have no `more`

    def predict(self, X: pd.DataFrame | np.ndarray) -> np.ndarray:
        return sum(booster.predict(X) for booster in self.boosters) / len(self.boosters) + self.base
