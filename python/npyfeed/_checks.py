"""Argument checks shared by every public function: what the core cannot say (Python types, readable names).

A wrong *type* raises `ArgumentTypeError`, a `TypeError` that is also a `ValueError` (npyfeed 0.2 raised
`ValueError` for both, and code written against it keeps working); a wrong *value* raises `ValueError`. Value
checks that the core makes anyway (a shard index against the number of shards, a memory budget of 0) are left
to it, so that each is written once.
"""

from __future__ import annotations

import numpy as np


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (a `TypeError`; also a `ValueError`, as npyfeed 0.2 raised)."""


def is_int(value) -> bool:
    """An integer (Python or numpy), not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def integer(value, name: str, low: int | None = None, high: int | None = None, *, what: str | None = None) -> int:
    """`value` as an int in ``[low, high)`` (either bound may be None); `what` describes it in the message."""
    if what is None:
        what = "a positive integer" if low == 1 and high is None else f"an integer in {_range_text(low, high)}"
    if not is_int(value):
        raise ArgumentTypeError(f"{name} must be {what}, got {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value >= high):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


def positive(value, name: str) -> int:
    return integer(value, name, 1)


def non_negative(value, name: str) -> int:
    return integer(value, name, 0, what="a non-negative integer")


def u64(value, name: str) -> int:
    """A seed: an integer in [0, 2**64)."""
    return integer(value, name, 0, 2**64, what="an integer in [0, 2**64)")


#: Epochs are integers in ``[0, EPOCH_LIMIT)`` at every entry point (the plan, its iterators, the framework
#: adapters, ``npyfeed.tf.dataset``). The plan itself could count to 2**64, but TensorFlow counts epochs in an
#: int64 range (``repeat()`` forever is the range ``[epoch, 2**62)``): one range everywhere means an epoch valid
#: for the numpy iterator is valid for every other consumer, and a checkpoint moves between them.
EPOCH_LIMIT = 2**62


def epoch(value, name: str = "epoch") -> int:
    """An epoch: an integer in [0, 2**62) (`EPOCH_LIMIT`)."""
    return integer(value, name, 0, EPOCH_LIMIT, what="an integer in [0, 2**62)")


def boolean(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def sample_ids(value) -> np.ndarray:
    """`value` as a 1-d int64 array of sample ids (the core checks their range)."""
    ids = np.asarray(value)
    if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
        raise ArgumentTypeError("sample_ids must be a 1-d sequence of integers")
    return ids.astype(np.int64, copy=False)


def _range_text(low, high) -> str:
    return f"[{'-inf' if low is None else low}, {'inf' if high is None else high})"
