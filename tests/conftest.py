"""Shared fixtures: writing `.npy` files, the `np.load` oracle, a tmpfs directory, the hypothesis profile."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import windows_data
from hypothesis import settings

# Derandomised so that CI runs the same examples every time; no deadline because a load's first call
# starts the thread pool.
settings.register_profile("npyfeed", derandomize=True, max_examples=60, deadline=None, print_blob=True)
settings.load_profile("npyfeed")


def _write_npy(path, array: np.ndarray, version=(1, 0)) -> Path:
    """Writes `array` to `path` as a `.npy` file of format `version`, the way ``np.save`` does."""
    path = Path(path)
    with open(path, "wb") as fp:
        np.lib.format.write_array(fp, array, version=version, allow_pickle=False)
    return path


NUMPY_2 = np.lib.NumpyVersion(np.__version__) >= "2.0.0"


def flags_are_comparable(expected: np.ndarray) -> bool:
    """False for the contiguity flags of a zero-itemsize array under numpy 1.x, which marks what np.load makes
    of it both C- and F-contiguous (numpy 2, and npyfeed under either, only C-contiguous): no byte to order."""
    return NUMPY_2 or expected.dtype.itemsize > 0


def _assert_same_as_np_load(actual: np.ndarray, path, *, expected: np.ndarray | None = None,
                            check_aligned: bool = True) -> None:
    """`actual` equals ``np.load(path)``: type, dtype (byte order, fields, offsets), shape, memory order, bytes.

    `expected`: ``np.load(path)`` already loaded, to save loading it again.
    """
    if expected is None:
        expected = np.load(path, allow_pickle=False)
    assert type(actual) is np.ndarray
    assert actual.dtype == expected.dtype
    assert actual.dtype.str == expected.dtype.str  # byte order
    assert actual.dtype.descr == expected.dtype.descr  # field names, offsets, padding
    assert actual.shape == expected.shape
    if expected.size > 0:  # numpy leaves the strides of zero-size arrays arbitrary
        assert actual.strides == expected.strides
    if flags_are_comparable(expected):
        assert actual.flags.c_contiguous == expected.flags.c_contiguous
        assert actual.flags.f_contiguous == expected.flags.f_contiguous
    if check_aligned:
        assert actual.flags.aligned
    # Byte equality is exact for NaN payloads, padding bytes and unnamed void fields alike.
    assert actual.tobytes(order="A") == expected.tobytes(order="A")
    if expected.dtype.fields is None and expected.dtype.kind != "V":
        # numpy 1.x's assert_array_equal compares NaN long-double complex values with ==, which warns.
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(actual, expected, strict=True)


@pytest.fixture(scope="session")
def write_npy():
    """``write_npy(path, array, version=(1, 0)) -> Path``."""
    return _write_npy


@pytest.fixture(scope="session")
def assert_same_as_np_load():
    """``assert_same_as_np_load(actual, path, *, expected=None, check_aligned=True)``."""
    return _assert_same_as_np_load


@pytest.fixture
def shm_path():
    """A fresh directory on tmpfs (``/dev/shm``), removed afterwards."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    path = Path(tempfile.mkdtemp(prefix="npyfeed-test-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _private_index_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own npyfeed cache dir (compiled indexes), never the user's ``~/.cache``."""
    monkeypatch.setenv("NPYFEED_CACHE_DIR", str(tmp_path_factory.mktemp("npyfeed-cache")))


# -- the window tests' shared data sets (tests/windows_data.py builds them) ---------------------------------

@pytest.fixture(scope="module")
def small(tmp_path_factory) -> windows_data.DataSet:
    """6 keys of (30..60, 5) float64 factors and (rows, 2) float32 labels; W=6; 60 samples."""
    rng = np.random.default_rng(41)
    factors = {f"s{k}": windows_data.sample_values(rng, "<f8", (int(rng.integers(30, 61)), 5)) for k in range(6)}
    labels = {k: windows_data.sample_values(rng, "<f4", (len(v), 2)) for k, v in factors.items()}
    entries = windows_data.random_entries(rng, factors, labels, 6, per_key=10)
    return windows_data.write_dataset(tmp_path_factory.mktemp("small"), factors, labels, entries, 6)


@pytest.fixture(scope="module")
def ordered(tmp_path_factory) -> windows_data.DataSet:
    """103 samples over 4 keys (a prime, so batches and shards never divide it evenly)."""
    rng = np.random.default_rng(51)
    factors = {f"o{k}": windows_data.sample_values(rng, "<f4", (80, 3)) for k in range(4)}
    labels = {k: windows_data.sample_values(rng, "<f4", (80, 1)) for k in factors}
    entries = [(int(rng.integers(3, 80)), int(rng.integers(0, 80)), f"o{int(rng.integers(0, 4))}") for _ in range(103)]
    return windows_data.write_dataset(tmp_path_factory.mktemp("ordered"), factors, labels, entries, 4)
