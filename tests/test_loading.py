"""Whole-file loads against the oracle `np.load`: every dtype, byte order, memory order, format version, shape
and mode; ownership and lifetime of the arrays; the chunked multi-thread path; the O_DIRECT fallback;
`load_factor_files`; the `threads` and `progress` arguments; the error types."""

from __future__ import annotations

import errno
import gc
import glob
import logging
import mmap
import os
import socket
import subprocess
import sys
import textwrap
import zlib
from collections import OrderedDict
from pathlib import Path

import npyfeed
import numpy as np
import pytest
from _sandbox import run_on_ramfs, run_unprivileged, shared_dir

MODES = ("auto", "mmap", "read", "direct")
VERSIONS = [(1, 0), (2, 0), (3, 0)]
MiB = 1 << 20

# ----------------------------------------------------------------------------------------------------------
# Test data


def _dtype_cases():
    cases = [("bool", np.dtype("?")), ("i1", np.dtype("i1")), ("u1", np.dtype("u1"))]
    multibyte = ["i2", "i4", "i8", "u2", "u4", "u8", "f2", "f4", "f8", ("longdouble", "g"), "c8", "c16",
                 ("clongdouble", "G"), ("M8ns", "M8[ns]"), ("m8s", "m8[s]"), "U3"]
    for code in multibyte:
        name, code = code if isinstance(code, tuple) else (code, code)
        cases += [(f"{name}-le", np.dtype("<" + code)), (f"{name}-be", np.dtype(">" + code))]
    cases += [
        ("S5", np.dtype("S5")),
        ("V4", np.dtype("V4")),
        ("struct-subarray", np.dtype([("id", "<i4"), ("pos", ">f8", (2, 3)), ("tag", "S3")])),
        ("struct-padded", np.dtype({"names": ["a", "b"], "formats": ["<i4", "<f8"], "offsets": [0, 16],
                                    "itemsize": 32})),
        ("struct-nested", np.dtype([("outer", [("x", "<u2"), ("y", ">f4")]), ("flag", "?"), ("when", "<M8[us]")])),
    ]
    return cases


DTYPE_CASES = _dtype_cases()

LAYOUTS = [  # (id, shape, order); Fortran order only where numpy writes fortran_order=True
    ("0d", (), "C"),
    ("empty", (0,), "C"),
    ("0x3", (0, 3), "C"),
    ("1d", (7,), "C"),
    ("2d", (3, 5), "C"),
    ("3d", (2, 3, 4), "C"),
    ("2d-F", (3, 5), "F"),
    ("3d-F", (2, 3, 4), "F"),
]

_ALPHABET = np.array(list("aZ 0é漢😀~"))


def _fill(view: np.ndarray, rng: np.random.Generator) -> None:
    dtype = view.dtype
    if dtype.names:
        for name in dtype.names:
            _fill(view[name], rng)  # subarray fields come back with the extra dimensions
    elif dtype.kind == "b":
        view[...] = rng.integers(0, 2, view.shape).astype(bool)
    elif dtype.kind == "U":
        chars = rng.choice(_ALPHABET, size=view.shape + (dtype.itemsize // 4,))
        view[...] = np.array(["".join(c) for c in chars.reshape(-1, chars.shape[-1])], dtype).reshape(view.shape)
    else:  # every bit pattern is a valid S, V, integer, float (NaN payloads too), complex or datetime
        raw = rng.integers(0, 256, view.size * dtype.itemsize, dtype=np.uint8)
        view[...] = np.frombuffer(raw.tobytes(), dtype).reshape(view.shape)


def sample_array(dtype, shape, order="C", seed="") -> np.ndarray:
    """Deterministic contents for `dtype` and `shape`, in memory order `order`."""
    rng = np.random.default_rng(zlib.crc32(f"{np.dtype(dtype).descr}{shape}{seed}".encode()))
    array = np.zeros(shape, dtype)
    _fill(array, rng)
    return np.asfortranarray(array) if order == "F" else array


def _o_direct_refused(directory: Path) -> bool:
    """True where the filesystem of `directory` refuses O_DIRECT opens or reads."""
    probe = directory / "o_direct_probe"
    probe.write_bytes(b"\0" * 8192)
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return True
        raise
    try:
        with mmap.mmap(-1, 4096) as buffer:  # page aligned
            os.preadv(fd, [buffer], 0)
        return False
    except OSError as e:
        if e.errno == errno.EINVAL:
            return True
        raise
    finally:
        os.close(fd)
        probe.unlink()


# ----------------------------------------------------------------------------------------------------------
# The matrix: dtypes x byte orders x layouts x versions x modes


@pytest.fixture(scope="module")
def matrix_file(tmp_path_factory, write_npy):
    """``matrix_file(dtype, shape, order, version) -> path``, written once and shared by the four modes."""
    directory = tmp_path_factory.mktemp("matrix")
    cache = {}

    def get(dtype, shape, order, version):
        key = (str(dtype.descr), dtype.str, shape, order, version)
        if key not in cache:
            array = sample_array(dtype, shape, order)
            cache[key] = write_npy(directory / f"{len(cache)}.npy", array, version)
        return cache[key]

    return get


@pytest.mark.parametrize("version", VERSIONS, ids=["v1", "v2", "v3"])
@pytest.mark.parametrize("shape, order", [(s, o) for _, s, o in LAYOUTS], ids=[i for i, _, _ in LAYOUTS])
@pytest.mark.parametrize("dtype", [d for _, d in DTYPE_CASES], ids=[i for i, _ in DTYPE_CASES])
def test_matches_np_load(matrix_file, dtype, shape, order, version, assert_same_as_np_load):
    # The four modes in one test: 960 tests instead of 3840 keeps the matrix to seconds.
    path = matrix_file(dtype, shape, order, version)
    expected = np.load(path)
    for mode in MODES:
        array = npyfeed.load(path, mode=mode)
        try:
            assert_same_as_np_load(array, path, expected=expected)
            assert array.flags.writeable == (mode != "mmap")
            assert array.base is not None  # owned by the loader's buffer or mapping
        except AssertionError as e:
            raise AssertionError(f"mode={mode!r}: {e}") from None


def test_matrix_writes_fortran_order(matrix_file):
    # Guards the matrix itself: the "-F" layouts must really produce fortran_order=True files.
    path = matrix_file(np.dtype("<f4"), (3, 5), "F", (1, 0))
    assert npyfeed.read_header(path).fortran_order
    assert npyfeed.load(path).flags.f_contiguous and not npyfeed.load(path).flags.c_contiguous


# Property tests (hypothesis) are in test_properties.py.


# ----------------------------------------------------------------------------------------------------------
# Ownership and lifetime


def _final_base(array: np.ndarray):
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base


def test_mmap_is_read_only_and_outlives_the_file(tmp_path, write_npy):
    path = write_npy(tmp_path / "a.npy", np.arange(1000, dtype="<f8").reshape(100, 10))
    expected = np.load(path)
    array = npyfeed.load(path, mode="mmap")
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array[0, 0] = 1.0
    with pytest.raises(ValueError):  # the mapping is PROT_READ: making it writable would crash on write
        array.setflags(write=True)
    assert _final_base(array) is not None
    view = array[10:20, ::2]
    os.unlink(path)
    del array
    gc.collect()
    np.testing.assert_array_equal(view, expected[10:20, ::2])
    assert float(view.sum()) == float(expected[10:20, ::2].sum())


def test_mmap_is_a_view_of_the_file(tmp_path, write_npy):
    # Zero-copy: a change to the file (same inode, same length) shows through the shared mapping,
    # while an array from "read" keeps what was read.
    path = write_npy(tmp_path / "a.npy", np.zeros(16, dtype="<i8"))
    offset = npyfeed.read_header(path).data_offset
    mapped = npyfeed.load(path, mode="mmap")
    copied = npyfeed.load(path, mode="read")
    with open(path, "r+b") as f:
        f.seek(offset + 8 * 3)
        f.write(np.int64(42).tobytes())
    assert mapped[3] == 42
    assert copied[3] == 0


@pytest.mark.parametrize("mode", ["read", "direct", "auto"])
def test_read_and_direct_return_owned_writable_arrays(tmp_path, mode, write_npy):
    path = write_npy(tmp_path / "a.npy", np.arange(100, dtype="<i4"))
    first = npyfeed.load(path, mode=mode)
    second = npyfeed.load(path, mode=mode)
    assert first.flags.writeable
    assert not np.may_share_memory(first, second)
    first[:] = -1
    np.testing.assert_array_equal(second, np.arange(100, dtype="<i4"))
    np.testing.assert_array_equal(np.load(path), np.arange(100, dtype="<i4"))
    os.unlink(path)
    del second
    gc.collect()
    assert (first == -1).all()


@pytest.mark.parametrize("order", ["C", "F"])
def test_mmap_populate(tmp_path, order, write_npy, assert_same_as_np_load):
    path = write_npy(tmp_path / "a.npy", sample_array("<f4", (300, 70), order))
    array = npyfeed.load(path, mode="mmap", populate=True)
    assert not array.flags.writeable
    assert_same_as_np_load(array, path)


def test_load_many_keeps_order_and_mixes_files(tmp_path, write_npy, assert_same_as_np_load):
    arrays = [sample_array(d, s, seed=i) for i, (d, s) in
              enumerate([("<f8", (3,)), (">i2", (2, 2)), ("S5", ()), ("<c8", (0,)), ("?", (4, 1, 2))])]
    paths = [write_npy(tmp_path / f"{i}.npy", a) for i, a in enumerate(arrays)]
    for mode in MODES:
        loaded = npyfeed.load_many(paths, mode=mode)
        assert isinstance(loaded, list) and len(loaded) == len(paths)
        for array, path in zip(loaded, paths):
            assert_same_as_np_load(array, path)
    assert npyfeed.load_many([]) == []


@pytest.mark.parametrize("kind", ["str", "bytes", "PathLike"])
def test_path_types(tmp_path, kind, write_npy, assert_same_as_np_load):
    path = write_npy(tmp_path / "a.npy", np.arange(5))
    arg = {"str": str(path), "bytes": os.fsencode(path), "PathLike": path}[kind]
    assert_same_as_np_load(npyfeed.load(arg), path)


def test_bad_mode_is_a_value_error(tmp_path, write_npy):
    path = write_npy(tmp_path / "a.npy", np.arange(5))
    for mode in ["MMAP", "", "buffered", None]:
        with pytest.raises(ValueError, match="mode"):
            npyfeed.load(path, mode=mode)


# ----------------------------------------------------------------------------------------------------------
# Large files: the chunked, multi-thread path (chunks of 8 MiB, files over 16 MiB are split)


@pytest.fixture(scope="module")
def large_files(tmp_path_factory, write_npy):
    directory = tmp_path_factory.mktemp("large")
    n = 4099 * 2049  # 67 MB of float64, not a multiple of the chunk size
    c_order = np.arange(n, dtype="<f8").reshape(4099, 2049)
    # 7-byte items in Fortran order: elements straddle every chunk boundary.
    odd = np.zeros((2048, 2731), dtype=[("a", "<i2"), ("b", ">f4"), ("c", "u1")], order="F")
    flat = np.arange(odd.size)
    odd["a"] = (flat % 30011).reshape(odd.shape)
    odd["b"] = flat.astype("f4").reshape(odd.shape)
    odd["c"] = (flat % 251).reshape(odd.shape)
    return {
        "f8-C-67MB": write_npy(directory / "c.npy", c_order),
        "V7-F-39MB": write_npy(directory / "odd.npy", odd, (2, 0)),
    }


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["f8-C-67MB", "V7-F-39MB"])
def test_large_file(large_files, name, mode, assert_same_as_np_load):
    path = large_files[name]
    assert npyfeed.read_header(path).nbytes > 2 * 8 * MiB
    assert_same_as_np_load(npyfeed.load(path, mode=mode, threads=4), path)


@pytest.mark.parametrize("mode", ["read", "direct"])
def test_large_file_one_thread(large_files, mode, assert_same_as_np_load):
    path = large_files["V7-F-39MB"]  # one thread reads the whole file in one piece
    assert_same_as_np_load(npyfeed.load(path, mode=mode, threads=1), path)


def test_large_file_mmap_populate(large_files, assert_same_as_np_load):
    path = large_files["f8-C-67MB"]
    assert_same_as_np_load(npyfeed.load(path, mode="mmap", populate=True, threads=3), path)


@pytest.mark.parametrize("end", [16 * MiB + 128, 16 * MiB + 136, 24 * MiB],
                         ids=["largest-unsplit", "smallest-split", "end-on-chunk-boundary"])
@pytest.mark.parametrize("mode", ["read", "direct", "mmap"])
def test_chunk_boundaries(tmp_path, mode, end, write_npy, assert_same_as_np_load):
    # `end` is the file offset where the data ends (the data starts at 128).
    path = write_npy(tmp_path / "a.npy", np.arange((end - 128) // 8, dtype="<u8"))
    assert npyfeed.read_header(path).data_offset == 128
    array = npyfeed.load(path, mode=mode, threads=3, populate=mode == "mmap")
    assert_same_as_np_load(array, path)


# Files up to 16 MiB are read whole; buffered, one read up to 128 KiB, else the first 4 KiB (the header) and then
# the rest, as numpy reads them. Sizes on both sides of each boundary, and a header that the first read cuts.
@pytest.mark.parametrize("file_size", [4096, 4097, 128 * 1024, 128 * 1024 + 1, 5 * MiB + 8])
@pytest.mark.parametrize("mode", ["read", "direct"])
def test_whole_file_reads_on_either_side_of_the_first_read(tmp_path, mode, file_size, write_npy,
                                                            assert_same_as_np_load):
    path = write_npy(tmp_path / "a.npy", np.arange(file_size - 128, dtype="u1"))
    assert path.stat().st_size == file_size
    assert_same_as_np_load(npyfeed.load(path, mode=mode, threads=2), path)


@pytest.mark.parametrize("mode", ["read", "direct"])
def test_a_header_longer_than_the_first_read(tmp_path, mode, write_npy, assert_same_as_np_load):
    fields = [(f"field_{i:04d}", "<f4") for i in range(300)]  # a header of about 6 KiB
    array = np.zeros(1000, dtype=fields)
    for i, (name, _) in enumerate(fields):
        array[name] = np.arange(1000) * 1000 + i
    path = write_npy(tmp_path / "a.npy", array, (2, 0))
    assert npyfeed.read_header(path).data_offset > 4096 and path.stat().st_size > 128 * 1024
    assert_same_as_np_load(npyfeed.load(path, mode=mode), path)


# ----------------------------------------------------------------------------------------------------------
# O_DIRECT


def _direct_warnings(caplog):
    return [r for r in caplog.records if r.name == "npyfeed" and r.levelno == logging.WARNING]


@pytest.mark.parametrize("size", ["small", "chunked"])
def test_direct_falls_back_on_tmpfs(shm_path, caplog, size, write_npy, assert_same_as_np_load):
    if not _o_direct_refused(shm_path):
        pytest.skip("this kernel's tmpfs accepts O_DIRECT (Linux >= 6.6); see the ramfs test")
    shape = (10, 3) if size == "small" else (5 * MiB,)
    path = write_npy(shm_path / "a.npy", sample_array("<f8", shape))
    caplog.set_level(logging.WARNING, logger="npyfeed")
    array = npyfeed.load(path, mode="direct", threads=3)
    assert_same_as_np_load(array, path)
    assert array.flags.writeable
    warnings = _direct_warnings(caplog)
    assert len(warnings) == 1
    assert str(path) in warnings[0].getMessage() and "O_DIRECT" in warnings[0].getMessage()


_RAMFS_SCRIPT = """
    import logging
    import numpy as np
    import npyfeed

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("npyfeed").addHandler(handler)
    paths = []
    for i, shape in enumerate([(10, 3), (5 << 20,)]):  # small, and chunked (40 MB)
        path = os.path.join(sys.argv[1], f"{i}.npy")
        np.save(path, np.arange(np.prod(shape), dtype="<f8").reshape(shape))
        paths.append(path)
    for array, path in zip(npyfeed.load_many(paths, mode="direct", threads=3), paths):
        expected = np.load(path)
        assert array.dtype == expected.dtype and array.shape == expected.shape, path
        assert np.array_equal(array, expected), path
        assert array.flags.writeable
    messages = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(messages) == 2, messages
    for path, message in zip(paths, messages):
        assert path in message and "O_DIRECT" in message, message
    print("fallback ok")
"""


def test_direct_falls_back_on_ramfs(tmp_path):
    # ramfs refuses O_DIRECT on every kernel; mounted in a private user+mount namespace.
    mountpoint = tmp_path / "ramfs"
    mountpoint.mkdir()
    proc = run_on_ramfs(_RAMFS_SCRIPT, mountpoint)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fallback ok" in proc.stdout


def test_direct_does_not_fall_back_where_supported(tmp_path, caplog, write_npy, assert_same_as_np_load):
    if _o_direct_refused(tmp_path):
        pytest.skip("this filesystem refuses O_DIRECT")
    path = write_npy(tmp_path / "a.npy", sample_array("<i2", (3 * MiB + 7,)))
    caplog.set_level(logging.WARNING, logger="npyfeed")
    for threads in (1, 3):
        assert_same_as_np_load(npyfeed.load(path, mode="direct", threads=threads), path)
    assert _direct_warnings(caplog) == []


# ----------------------------------------------------------------------------------------------------------
# load_factor_files


@pytest.fixture
def factor_files(tmp_path, write_npy):
    """Three files in per-stock directories, like the users' `<root>/<stock>/train/factor/<key>.npy`."""
    paths = []
    for i, stock in enumerate(["AAA", "BBB", "CCC"]):
        directory = tmp_path / stock / "train" / "factor"
        directory.mkdir(parents=True)
        paths.append(write_npy(directory / f"{stock.lower()}.v{i}.npy", sample_array("<f4", (20 + i, 8), seed=i)))
    return paths


def test_load_factor_files_default_keys(factor_files, assert_same_as_np_load):
    store = {}
    result = npyfeed.load_factor_files(factor_files, store)
    assert result is store
    assert list(store) == ["aaa.v0", "bbb.v1", "ccc.v2"]  # the file name without ".npy", in order
    for path in factor_files:
        assert_same_as_np_load(store[path.name[:-4]], path)


def test_load_factor_files_custom_key_and_mapping(factor_files, assert_same_as_np_load):
    store = OrderedDict(old=1)
    result = npyfeed.load_factor_files([str(p) for p in factor_files], store,
                                       key=lambda p: Path(p).parts[-4], mode="mmap")
    assert result is store
    assert list(store) == ["old", "AAA", "BBB", "CCC"]
    assert store["old"] == 1
    for path in factor_files:
        assert_same_as_np_load(store[path.parts[-4]], path)


def test_load_factor_files_new_dict(factor_files):
    result = npyfeed.load_factor_files(factor_files)
    assert isinstance(result, dict) and len(result) == 3


def test_load_factor_files_duplicate_key(factor_files):
    store = {"x": 1}
    with pytest.raises(ValueError, match="'same'"):
        npyfeed.load_factor_files(factor_files, store, key=lambda p: "same")
    assert store == {"x": 1}


@pytest.mark.parametrize("mode", ["read", "mmap"])
def test_one_file_listed_twice_is_loaded_as_once(factor_files, tmp_path, mode, assert_same_as_np_load):
    """As the users' np.load loop would: the same file under its own name, another spelling of its path or a
    link to it is no clash of keys; another file of that name still is."""
    first = factor_files[0]
    link = tmp_path / first.name
    link.symlink_to(first)
    store = npyfeed.load_factor_files([first, str(first.parent / ".." / "factor" / first.name), link, *factor_files],
                                      {}, mode=mode)
    assert list(store) == [p.name[:-4] for p in factor_files]
    for path in factor_files:
        assert_same_as_np_load(store[path.name[:-4]], path)
    other = tmp_path / "other" / first.name
    other.parent.mkdir()
    other.write_bytes(first.read_bytes())  # the same bytes, but another file
    with pytest.raises(ValueError, match=f"two files map to the key '{first.name[:-4]}'"):
        npyfeed.load_factor_files([first, other], {}, mode=mode)


@pytest.mark.parametrize("given", ["folder", "folder_bytes", "folder_path", "file", "number", "list_of_numbers"])
@pytest.mark.parametrize("call", ["load_factor_files", "load_many"])
def test_a_single_path_instead_of_a_list_is_a_type_error_naming_the_argument(factor_files, given, call):
    """load_factor_files("/data/factor", {}) would read each character of the string as a path: a TypeError (also a
    ValueError) that names the argument, and suggests the glob for a folder; nothing is filled."""
    folder = factor_files[0].parent
    value = {"folder": str(folder), "folder_bytes": os.fsencode(folder), "folder_path": folder,
             "file": str(factor_files[0]), "number": 3, "list_of_numbers": [3]}[given]
    name = "in_files" if call == "load_factor_files" else "paths"
    store = {"x": 1}
    with pytest.raises(TypeError, match=rf"^{name}\b") as info:
        npyfeed.load_factor_files(value, store) if call == "load_factor_files" else npyfeed.load_many(value)
    assert isinstance(info.value, ValueError)
    if given.startswith("folder"):
        assert f"sorted(glob.glob({str(folder / '*.npy')!r}))" in str(info.value)
    assert store == {"x": 1}
    # The suggested call works, and equals np.load.
    loaded = npyfeed.load_factor_files(sorted(glob.glob(str(folder / "*.npy"))), {})
    np.testing.assert_array_equal(loaded[factor_files[0].name[:-4]], np.load(factor_files[0]), strict=True)


def _make_bad(path: Path, kind: str) -> Path:
    if kind == "missing":
        return path.with_name("missing.npy")
    if kind == "corrupt":
        path.write_bytes(b"not a npy file at all" * 10)
    elif kind == "truncated":
        size = path.stat().st_size
        os.truncate(path, size - 5)
    elif kind == "directory":
        path = path.with_name("dir.npy")
        path.mkdir()
    return path


@pytest.mark.parametrize("mode", ["read", "mmap"])
@pytest.mark.parametrize("position", [0, 1, 2], ids=["first", "middle", "last"])
@pytest.mark.parametrize("kind", ["missing", "corrupt", "truncated", "directory"])
def test_load_factor_files_bad_file_leaves_dict_untouched(factor_files, kind, position, mode):
    paths = list(factor_files)
    paths[position] = _make_bad(paths[position], kind)
    keep = np.arange(3)
    store = {"aaa.v0": keep, "other": "value"}
    before = dict(store)
    with pytest.raises((OSError, ValueError)) as excinfo:
        npyfeed.load_factor_files(paths, store, mode=mode)
    assert str(paths[position]) in str(excinfo.value)
    expected_type = {"missing": FileNotFoundError, "directory": IsADirectoryError}.get(kind, npyfeed.NpyFormatError)
    assert type(excinfo.value) is expected_type
    assert list(store) == list(before)
    assert all(store[k] is before[k] for k in before)


def test_load_factor_files_progress(factor_files, capsys):
    pytest.importorskip("tqdm")
    store = npyfeed.load_factor_files(factor_files, {}, progress=True)
    assert len(store) == 3
    err = capsys.readouterr().err
    assert "npyfeed 3 files" in err and "100%" in err


# ----------------------------------------------------------------------------------------------------------
# threads and NPYFEED_THREADS


@pytest.mark.parametrize("threads, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError),
                                            (True, TypeError), ("2", TypeError)],
                         ids=["zero", "negative", "float", "bool", "str"])
def test_bad_threads(tmp_path, threads, error, write_npy):
    path = write_npy(tmp_path / "a.npy", np.arange(5))
    with pytest.raises(error, match="threads"):
        npyfeed.load(path, threads=threads)
    with pytest.raises(error, match="threads"):
        npyfeed.load_factor_files([path], {}, threads=threads)


@pytest.mark.parametrize("value", ["0", "-2", "abc", "1.5", "2 threads"])
def test_bad_env_threads(tmp_path, monkeypatch, value, write_npy):
    path = write_npy(tmp_path / "a.npy", np.arange(5))
    monkeypatch.setenv("NPYFEED_THREADS", value)
    with pytest.raises(ValueError, match="NPYFEED_THREADS"):
        npyfeed.load(path)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
def test_env_threads_grows_the_pool(tmp_path, monkeypatch, write_npy, assert_same_as_np_load):
    # More threads than this process has now: after the load the pool must hold at least that many workers.
    wanted = len(os.listdir("/proc/self/task")) + 8
    monkeypatch.setenv("NPYFEED_THREADS", str(wanted))
    paths = [write_npy(tmp_path / f"{i}.npy", np.arange(100) * i) for i in range(2 * wanted)]
    for array, path in zip(npyfeed.load_many(paths), paths):
        assert_same_as_np_load(array, path)
    assert len(os.listdir("/proc/self/task")) >= wanted + 1


@pytest.mark.parametrize("threads", [7, 64])
def test_any_thread_count_works(large_files, threads, assert_same_as_np_load):
    path = large_files["V7-F-39MB"]
    assert_same_as_np_load(npyfeed.load(path, threads=threads), path)


_COUNT_THREADS = textwrap.dedent("""
    import os, sys
    import npyfeed
    tasks = lambda: len(os.listdir("/proc/self/task"))
    before = tasks()
    threads = None if sys.argv[1] == "None" else int(sys.argv[1])
    npyfeed.load_many(sys.argv[2:], mode="read", threads=threads)
    print(tasks() - before)
""")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
@pytest.mark.parametrize("env, threads, expected", [("5", None, 5), ("5", 3, 3), (None, None, "cpus")],
                         ids=["env", "argument-wins", "default-cpus"])
def test_thread_count_used(tmp_path, env, threads, expected, write_npy):
    # Counted in a fresh process: the workers the first load starts are the threads it was told to use.
    paths = [str(write_npy(tmp_path / f"{i}.npy", np.arange(1000) + i)) for i in range(12)]
    environ = {k: v for k, v in os.environ.items() if k != "NPYFEED_THREADS"}
    if env is not None:
        environ["NPYFEED_THREADS"] = env
    proc = subprocess.run([sys.executable, "-c", _COUNT_THREADS, str(threads), *paths], env=environ,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    if expected == "cpus":
        expected = len(os.sched_getaffinity(0))
    assert int(proc.stdout) == expected


# ----------------------------------------------------------------------------------------------------------
# progress


def test_progress_bar_on_stderr(large_files, capsys, assert_same_as_np_load):
    pytest.importorskip("tqdm")
    path = large_files["f8-C-67MB"]
    arrays = npyfeed.load_many([path, path], progress=True, threads=2)
    assert_same_as_np_load(arrays[1], path)
    err = capsys.readouterr().err
    assert "npyfeed 2 files" in err
    assert "100%" in err
    assert "128M" in err  # the total, in bytes (2 x 67 MB = 128 MiB)


def test_no_progress_by_default(tmp_path, capfd, write_npy):
    path = write_npy(tmp_path / "a.npy", np.arange(5))
    npyfeed.load_many([path])
    npyfeed.load_factor_files([path])
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_progress_without_tqdm_says_what_to_install(tmp_path, monkeypatch, write_npy):
    path = write_npy(tmp_path / "a.npy", np.arange(5))
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    for load in (npyfeed.load_many, npyfeed.load_factor_files):
        with pytest.raises(ImportError, match=r"npyfeed\[progress\]"):
            load([path], progress=True)
    assert npyfeed.load_factor_files([path])["a"].tolist() == list(range(5))  # the default needs no tqdm


# ----------------------------------------------------------------------------------------------------------
# Error types


@pytest.mark.parametrize("mode", MODES)
def test_missing_file(tmp_path, mode):
    path = tmp_path / "nope.npy"
    with pytest.raises(FileNotFoundError) as excinfo:
        npyfeed.load(path, mode=mode)
    assert excinfo.value.filename == str(path)
    assert excinfo.value.errno == errno.ENOENT
    assert str(path) in str(excinfo.value)


def test_missing_file_read_header(tmp_path):
    path = tmp_path / "nope.npy"
    with pytest.raises(FileNotFoundError) as excinfo:
        npyfeed.read_header(path)
    assert excinfo.value.filename == str(path)


@pytest.mark.parametrize("mode", MODES)
def test_directory(tmp_path, mode):
    path = tmp_path / "x.npy"
    path.mkdir()
    with pytest.raises(IsADirectoryError) as excinfo:
        npyfeed.load(path, mode=mode)
    assert excinfo.value.filename == str(path)
    assert excinfo.value.errno == errno.EISDIR
    with pytest.raises(IsADirectoryError):
        npyfeed.read_header(path)


def test_format_error_type(tmp_path):
    assert issubclass(npyfeed.NpyFormatError, ValueError)
    path = tmp_path / "text.npy"
    path.write_text("hello, this is not a .npy file\n")
    with pytest.raises(ValueError) as excinfo:  # what users already catch
        npyfeed.load(path)
    error = excinfo.value
    assert isinstance(error, npyfeed.NpyFormatError)
    assert error.path == str(path)
    assert error.offset == 0
    assert str(path) in str(error)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cut", [8, 1, "all-data", "half-header"])
def test_truncated_data(tmp_path, mode, cut, write_npy):
    path = write_npy(tmp_path / "a.npy", np.arange(1000, dtype="<f8"))
    size = path.stat().st_size
    offset = npyfeed.read_header(path).data_offset
    new_size = {"all-data": offset, "half-header": offset // 2}[cut] if isinstance(cut, str) else size - cut
    os.truncate(path, new_size)
    with pytest.raises(npyfeed.NpyFormatError) as excinfo:
        npyfeed.load(path, mode=mode)
    assert excinfo.value.path == str(path)
    assert str(path) in str(excinfo.value)
    assert isinstance(excinfo.value.offset, int) and 0 <= excinfo.value.offset <= new_size
    with pytest.raises(npyfeed.NpyFormatError):
        npyfeed.read_header(path)


def test_truncated_large_file(tmp_path, write_npy):
    path = write_npy(tmp_path / "a.npy", np.arange(5 * MiB, dtype="<f8"))
    os.truncate(path, path.stat().st_size - 4096)
    for mode in MODES:
        with pytest.raises(npyfeed.NpyFormatError, match="truncated") as excinfo:
            npyfeed.load(path, mode=mode, threads=3)
        assert excinfo.value.path == str(path)


@pytest.mark.parametrize("mode", ["read", "mmap"])
def test_load_many_names_the_failing_file(tmp_path, mode, write_npy):
    good = [write_npy(tmp_path / f"{i}.npy", np.arange(10)) for i in range(5)]
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY\x09\x00")
    with pytest.raises(npyfeed.NpyFormatError) as excinfo:
        npyfeed.load_many(good[:2] + [bad] + good[2:], mode=mode)
    assert excinfo.value.path == str(bad)


@pytest.mark.parametrize("mode", MODES)
def test_socket_is_refused(tmp_path, mode):
    path = tmp_path / "s.npy"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen()
        with pytest.raises(OSError) as excinfo:
            npyfeed.load(path, mode=mode)
        assert excinfo.value.errno == errno.ENXIO and excinfo.value.filename == str(path)
        with pytest.raises(OSError):
            npyfeed.read_header(path)


# Imported before the child drops root (this Python may live where user nobody cannot read).
_UNPRIVILEGED_IMPORTS = """
    import errno
    import numpy as np
    import npyfeed
"""

_UNPRIVILEGED_LOADS = """
    readable, unreadable = sys.argv[1:3]
    # The control: this user cannot open the files for writing, so an open that is not read-only would fail.
    try:
        os.open(readable, os.O_RDWR)
        sys.exit("opened a 0444 file for writing")
    except PermissionError:
        pass
    expected = np.load(readable)
    for mode in ("auto", "mmap", "read", "direct"):
        assert npyfeed.load(readable, mode=mode).tobytes() == expected.tobytes(), mode
        for call in (lambda: npyfeed.load(unreadable, mode=mode),
                     lambda: npyfeed.load_many([readable, unreadable], mode=mode),
                     lambda: npyfeed.read_header(unreadable)):
            try:
                call()
                sys.exit(f"{mode}: no error for a chmod 000 file")
            except PermissionError as e:
                assert e.errno == errno.EACCES and e.filename == unreadable and unreadable in str(e), (mode, e)
    print("ok")
"""


def test_read_only_and_unreadable_files_as_an_unprivileged_user(write_npy):
    # Files are opened read-only (a 0444 file loads in every mode), and a chmod 000 file is a PermissionError
    # naming it; run as user nobody, since root may read and write any file.
    with shared_dir() as directory:
        readable = write_npy(directory / "readable.npy", sample_array("<f8", (300, 7)))
        unreadable = write_npy(directory / "unreadable.npy", np.arange(10))
        os.chmod(readable, 0o444)
        os.chmod(unreadable, 0o000)
        proc = run_unprivileged(_UNPRIVILEGED_LOADS, readable, unreadable, imports=_UNPRIVILEGED_IMPORTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1:] == ["ok"], proc.stdout
