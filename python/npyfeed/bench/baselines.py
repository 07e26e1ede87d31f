"""The users' own ways of reading window samples, kept as they write them: what `npyfeed bench` and the repository's
benchmarks (``bench/bench_windows.py``) measure npyfeed against.

* ``load_factor_files``: every file ``np.load``-ed into a dict ``{key: array}`` (in each training process);
* the per-sample function over that dict: one index line ``b"feature_index,label_index,key"`` in, one window and
  one label row out, sliced in Python (what their ``tf.numpy_function`` calls per sample);
* the advised per-sample function: the same, but each call ``np.load``-s both whole files of its key.

A key's file may be a `.npz` archive of one array (``np.savez``), which they read as ``np.load(path)["arr_0"]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

import numpy as np


def np_load(path) -> np.ndarray:
    """``np.load(path)``; of a `.npz` archive, its only array."""
    if not str(path).endswith(".npz"):
        return np.load(path)
    with np.load(path) as archive:
        (member,) = archive.files
        return archive[member]


def load_factor_files(paths: Mapping) -> dict:
    """``{key: np.load(path)}`` for ``paths`` (key -> path), one file after another: the users' loader."""
    return {key: np_load(path) for key, path in paths.items()}


def dict_sample(held: Mapping, window: int) -> Callable[[bytes], tuple]:
    """The users' per-sample function over their preloaded dicts ``held["factor_dict"]`` and ``held["label_dict"]``
    (looked up at each call, so that the caller can release them)."""

    def get_data_from_cache(line):
        feature_index, label_index, key = line.decode().split(",")
        x = held["factor_dict"][key][int(feature_index) - window + 1: int(feature_index) + 1]
        y = held["label_dict"][key][int(label_index)]
        return x.astype(np.float32), y.astype(np.float32)

    return get_data_from_cache


def np_load_sample(factor_paths: Mapping, label_paths: Mapping, window: int) -> Callable[[bytes], tuple]:
    """The advised per-sample function: ``np.load`` of the key's whole factor and label files (key -> path), then
    one window and one label row."""

    def get_data_from_cache(string_message):  # the users' "advice" code (their f-string paths, looked up by key)
        feature_index, label_index, key = string_message.decode().split(',')
        feature_index = int(feature_index)
        label_index = int(label_index)
        factor_arr = np_load(factor_paths[key])
        label_arr = np_load(label_paths[key])
        slice_arr = factor_arr[feature_index - window + 1: feature_index + 1]
        label_value = label_arr[label_index]
        x_data = slice_arr.astype(np.float32)
        y_data = label_value.astype(np.float32)
        return x_data, y_data

    return get_data_from_cache
