"""Property tests of whole-file loads against `np.load`, with the derandomised profile of conftest.py.

Each dtype family gets its own run, so that unsigned, complex, datetime64 and timedelta64 types (either byte
order) are always reached, not left to chance; arrays up to ~1 MiB of random bytes; headers over 4 KiB (and over
numpy's 10000-byte default cap) from structured dtypes with hundreds of fields; and, explicitly, files split into
8 MiB chunks for several threads with unusual element types. Together they take a few seconds.
"""

from __future__ import annotations

import zlib

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import npyfeed
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

MODES = ("auto", "mmap", "read", "direct")
VERSIONS = [(1, 0), (2, 0), (3, 0)]
MiB = 1 << 20
KiB = 1 << 10

_LONGDOUBLE_BITS = np.dtype("g").itemsize * 8
_SCALARS = (hnp.scalar_dtypes() | hnp.floating_dtypes(sizes=(_LONGDOUBLE_BITS,))
            | hnp.byte_string_dtypes(max_len=6) | hnp.unicode_string_dtypes(max_len=4))

FAMILIES = {
    "bool": hnp.boolean_dtypes(),
    "signed": hnp.integer_dtypes(endianness="?"),
    "unsigned": hnp.unsigned_integer_dtypes(endianness="?"),
    "float": hnp.floating_dtypes(endianness="?", sizes=(16, 32, 64, _LONGDOUBLE_BITS)),
    "complex": hnp.complex_number_dtypes(endianness="?", sizes=(64, 128, 2 * _LONGDOUBLE_BITS)),
    "datetime64": hnp.datetime64_dtypes(endianness="?"),
    "timedelta64": hnp.timedelta64_dtypes(endianness="?"),
    "bytes": hnp.byte_string_dtypes(max_len=6),
    "unicode": hnp.unicode_string_dtypes(endianness="?", max_len=4),
    "structured": (hnp.array_dtypes(_SCALARS, max_size=4, allow_subarrays=True)
                   | hnp.nested_dtypes(_SCALARS, max_leaves=6, max_itemsize=128)),
}

# CI shares two cores: slow generation is the machine, not the strategy.
_SLOW_OK = dict(suppress_health_check=[HealthCheck.too_slow])

# Element types for which every bit pattern is a valid value: arrays of them can be filled with random bytes.
RAW_FAMILIES = ("signed", "unsigned", "float", "complex", "datetime64", "timedelta64", "bytes")


def _write(path, array, version, write_npy):
    # A new inode every time: an array still mapped from an earlier example must never see the file change.
    path.unlink(missing_ok=True)
    try:
        write_npy(path, array, version)
    except UnicodeEncodeError:  # field names that 1.0/2.0 (latin-1) cannot hold: that is what 3.0 is for
        path.unlink()
        write_npy(path, array, (3, 0))
    except ValueError as e:  # a header too large for version 1.0 (65535 bytes)
        if "header" not in str(e).lower():
            raise
        path.unlink()
        write_npy(path, array, (2, 0))
    return path


@pytest.fixture(scope="module")
def example_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("properties")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_dtype_family_matches_np_load(family, example_dir, write_npy, assert_same_as_np_load):
    # hypothesis's own values (NaN, inf, extremes, empty and 0-d shapes), 25 examples per family.
    @settings(max_examples=25, **_SLOW_OK)
    @given(array=hnp.arrays(FAMILIES[family], hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=8)),
           fortran=st.booleans(), version=st.sampled_from(VERSIONS), mode=st.sampled_from(MODES))
    def check(array, fortran, version, mode):
        if fortran:
            array = np.asfortranarray(array)
        path = _write(example_dir / f"{family}.npy", array, version, write_npy)
        assert_same_as_np_load(npyfeed.load(path, mode=mode), path)

    check()


def _random_array(dtype: np.dtype, shape: tuple, order: str, seed: int) -> np.ndarray:
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    array = np.frombuffer(raw.tobytes(), dtype).reshape(shape)
    return np.asfortranarray(array) if order == "F" else array


@st.composite
def _large_arrays(draw):
    """Arrays of 64 KiB to 1 MiB of random bytes, 1 to 3 dimensions, either memory order."""
    dtype = draw(st.one_of(*(FAMILIES[f] for f in RAW_FAMILIES)))
    nbytes = draw(st.integers(64 * KiB, MiB))
    items = max(nbytes // dtype.itemsize, 1)
    ndim = draw(st.integers(1, 3))
    shape = [items]
    for _ in range(ndim - 1):  # split the items over the dimensions
        side = draw(st.integers(1, 64))
        shape = [max(shape[0] // side, 1), *shape[1:], side]
    order = draw(st.sampled_from("CF"))
    return _random_array(dtype, tuple(shape), order, draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=20, **_SLOW_OK)
@given(array=_large_arrays(), version=st.sampled_from(VERSIONS), mode=st.sampled_from(MODES),
       threads=st.sampled_from([1, 2, 3]))
def test_larger_arrays_match_np_load(example_dir, array, version, mode, threads, write_npy, assert_same_as_np_load):
    path = _write(example_dir / "large.npy", array, version, write_npy)
    assert_same_as_np_load(npyfeed.load(path, mode=mode, threads=threads), path)


_FIELD_TYPES = ["<i4", ">u2", "<f8", ">c8", "|b1", "<M8[s]", ">m8[us]", "|S3", "<U2", "|u1"]


@st.composite
def _many_field_dtypes(draw):
    """Structured dtypes of 300 to 1500 fields: headers of roughly 5 to 40 KB. Names (latin-1 and beyond) and
    types come from a drawn seed: cheap to generate however many fields."""
    count = draw(st.integers(300, 1500))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    alphabet = [chr(c) for c in range(0x21, 0x100) if chr(c) not in "'\"\\"] + ["é", "漢", "😀"]
    names = [f"f{i}_" + "".join(rng.choice(alphabet, rng.integers(0, 9))) for i in range(count)]
    return np.dtype([(name, _FIELD_TYPES[t]) for name, t in zip(names, rng.integers(0, len(_FIELD_TYPES), count))])


@settings(max_examples=12, **_SLOW_OK)
@given(dtype=_many_field_dtypes(), rows=st.integers(0, 3), version=st.sampled_from(VERSIONS),
       mode=st.sampled_from(MODES), seed=st.integers(0, 2**32 - 1))
def test_headers_over_4_kib_match_np_load(example_dir, dtype, rows, version, mode, seed, write_npy,
                                          assert_same_as_np_load):
    array = _random_array(dtype, (rows,), "C", seed)  # compared byte for byte
    path = _write(example_dir / "fields.npy", array, version, write_npy)
    header = npyfeed.read_header(path, max_header_size=1 << 20)
    assert header.data_offset > 4 * KiB
    expected = np.load(path, max_header_size=1 << 20)
    assert_same_as_np_load(npyfeed.load(path, mode=mode, max_header_size=1 << 20), path, expected=expected)
    if header.data_offset > 10000:  # numpy's cap, and npyfeed's default
        with pytest.raises(npyfeed.NpyFormatError, match="max_header_size"):
            npyfeed.load(path, mode=mode)


# ----------------------------------------------------------------------------------------------------------
# The chunked path (files over 16 MiB are read in 8 MiB chunks by several threads), with unusual types


CHUNKED = [  # (id, dtype, shape, order): 17-26 MiB, not multiples of the chunk size
    ("u2-be", ">u2", (9 * MiB + 7,), "C"),
    ("c8-F", "<c8", (1501, 1801), "F"),
    ("c16-be", ">c16", (3, 5 * 73_001 + 1), "C"),
    ("m8ms-be", ">m8[ms]", (2_300_001,), "C"),
    ("M8us-F", "<M8[us]", (1709, 1601), "F"),
]


@pytest.fixture(scope="module")
def chunked_files(tmp_path_factory, write_npy):
    directory = tmp_path_factory.mktemp("chunked")
    files = {}
    for i, (name, dtype, shape, order) in enumerate(CHUNKED):
        array = _random_array(np.dtype(dtype), shape, order, zlib.crc32(name.encode()))
        files[name] = write_npy(directory / f"{name}.npy", array, VERSIONS[i % 3])
    return files


@pytest.mark.parametrize("name", [c[0] for c in CHUNKED])
def test_chunked_files_match_np_load(chunked_files, name, assert_same_as_np_load):
    path = chunked_files[name]
    assert npyfeed.read_header(path).nbytes > 2 * 8 * MiB  # split into chunks
    expected = np.load(path)
    for mode in ("mmap", "read", "direct"):
        assert_same_as_np_load(npyfeed.load(path, mode=mode, threads=3, populate=mode == "mmap"), path,
                               expected=expected)
