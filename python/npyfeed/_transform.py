"""The gather's per-row options (``features``, ``label_columns``, ``nan``, ``posinf``, ``neginf``, ``normalize``)
as the core takes them.

Only the types are checked here (``TypeError``, and ``ValueError`` for a mean or std whose dtype is not a real
number type, as numpy would not compute with it). The values (columns in range, shapes that broadcast, a
positive and finite std) are checked once, by the C++ core, against the rows of the files, and raise
``ValueError`` from there.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from ._checks import ArgumentTypeError

#: The keyword arguments that `transform_spec` takes, shared by every WindowSource constructor.
OPTIONS = ("features", "label_columns", "nan", "posinf", "neginf", "normalize")


def _integer(value) -> bool:
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def _columns(value, name: str):
    if value is None:
        return None
    if isinstance(value, slice):
        for part in (value.start, value.stop, value.step):
            if part is not None and not _integer(part):
                raise ArgumentTypeError(f"{name}: slice bounds must be integers or None, got {value!r}")
        return slice(*(None if p is None else int(p) for p in (value.start, value.stop, value.step)))
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or not (value.size == 0 or np.issubdtype(value.dtype, np.integer)):
            raise ArgumentTypeError(f"{name} must be a sequence of integers or a slice, got an array of dtype "
                                    f"{value.dtype} and shape {value.shape}")
        return [int(c) for c in value]
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, range)):
        raise ArgumentTypeError(f"{name} must be a sequence of integers or a slice, got {value!r}")
    columns = list(value)
    for c in columns:
        if not _integer(c):
            raise ArgumentTypeError(f"{name} must be a sequence of integers or a slice, got {c!r} among {value!r}")
    return [int(c) for c in columns]


def _replacement(value, name: str):
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise ArgumentTypeError(f"{name} must be a float or None, got {value!r}")
    return float(value)


def _statistic(value, name: str) -> np.ndarray:
    if isinstance(value, (str, bytes)):
        raise ValueError(f"normalize: {name} must be real numbers, got {value!r}")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"normalize: {name} must be an array of real numbers ({e})") from None
    if array.dtype.kind not in "iuf":
        raise ValueError(f"normalize: {name} has dtype {array.dtype}; it must be an integer or float array")
    return np.ascontiguousarray(array, dtype=np.float64)


def transform_spec(features=None, label_columns=None, nan=None, posinf=None, neginf=None, normalize=None):
    """The core's ``transform`` argument: None when every option is at its default."""
    spec = {
        "features": _columns(features, "features"),
        "label_columns": _columns(label_columns, "label_columns"),
        "nan": _replacement(nan, "nan"),
        "posinf": _replacement(posinf, "posinf"),
        "neginf": _replacement(neginf, "neginf"),
        "mean": None,
        "std": None,
    }
    if normalize is not None:
        if (isinstance(normalize, (str, bytes, np.ndarray)) or not isinstance(normalize, Sequence)
                or len(normalize) != 2):
            raise ArgumentTypeError(f"normalize must be a (mean, std) pair, got {normalize!r}")
        spec["mean"] = _statistic(normalize[0], "mean")
        spec["std"] = _statistic(normalize[1], "std")
    return None if all(v is None for v in spec.values()) else spec
