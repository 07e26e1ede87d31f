"""The users' layout, written in one place: ``<base>/factor/<key>.npy`` (shape ``(T, F...)``),
``<base>/label/<key>.npy`` (``(T, L...)``) and an index text file of ``feature_index,label_index,key`` lines, where
``<base>`` is ``<root>/<stock>/<mode>`` in the users' tree. What the demo, the benchmarks and the tests generate
their data sets with (each with its own values)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Callable

import numpy as np


def layout_dirs(base) -> tuple:
    """``(<base>/factor, <base>/label)``, made if missing."""
    factor_dir, label_dir = os.path.join(base, "factor"), os.path.join(base, "label")
    os.makedirs(factor_dir, exist_ok=True)
    os.makedirs(label_dir, exist_ok=True)
    return factor_dir, label_dir


def write_key(base, key: str, factor: np.ndarray, label: np.ndarray,
              save: Callable[[str, np.ndarray], None] = np.save) -> tuple:
    """Key `key`'s factor and label files under `base` (``save(path, array)``, default ``np.save``); their paths."""
    factor_dir, label_dir = layout_dirs(base)
    paths = os.path.join(factor_dir, f"{key}.npy"), os.path.join(label_dir, f"{key}.npy")
    save(paths[0], factor)
    save(paths[1], label)
    return paths


def index_text(entries: Iterable) -> str:
    """Index lines ``feature_index,label_index,key`` of ``(feature_index, label_index, key)`` entries."""
    return "".join(f"{f},{lr},{key}\n" for f, lr, key in entries)


def write_index(path, text: str, *, sync: bool = False) -> str:
    """An index file of `text` (`index_text`'s lines, or any text a test wants); with `sync`, fsync'ed."""
    with open(path, "w") as f:
        f.write(text)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    return str(path)
