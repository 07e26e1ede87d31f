"""`.npz` archives (issue 12): `load`, `load_many`, `load_factor_files` and `WindowSource`, with np.load as oracle.

Stored (np.savez) and deflated (np.savez_compressed) members in every mode, every dtype np.load reads, members of
format v1/v2/v3; zero-copy views of aligned stored members in mode "mmap" (checked against /proc/self/maps);
the key rule; the GIL released while archives inflate. Hostile archives: tests/test_hostile_npz.py.
"""

from __future__ import annotations

import io
import sys
import threading
import zipfile
from pathlib import Path

import npyfeed
import numpy as np
import pytest
from conftest import _assert_same_as_np_load

MODES = ("mmap", "read", "direct")
WRITERS = {"stored": np.savez, "deflated": np.savez_compressed}
needs_zlib = pytest.mark.skipif(not npyfeed._core.have_inflate, reason="npyfeed was built without zlib")


def arrays_of_every_kind() -> dict:
    rng = np.random.default_rng(12)
    return {
        "factors": rng.standard_normal((480, 256)).astype(np.float32),
        "f8_fortran": np.asfortranarray(rng.standard_normal((7, 5))),
        "i1": np.arange(-50, 50, dtype=np.int8).reshape(10, 10),
        "big_endian": np.arange(12, dtype=">i4").reshape(3, 4),
        "bools": rng.random(33) > 0.5,
        "c16": (rng.standard_normal(6) + 1j * rng.standard_normal(6)).astype(np.complex128),
        "f2": np.linspace(0, 1, 9, dtype=np.float16),
        "strings": np.array(["a", "bb", "ccc"]),
        "bytes": np.array([b"x", b"yz"]),
        "dates": np.array(["2024-01-01", "2025-06-30"], dtype="datetime64[D]"),
        "structured": np.array([(1, 2.5, b"ab"), (3, 4.5, b"cd")], dtype=[("i", "<i4"), ("f", "<f8"), ("s", "S2")]),
        "scalar": np.array(3.25),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "with space and ünïcode": np.arange(3),
        "dir/nested": np.arange(4, dtype=np.uint16),
    }


def check_same_as_np_load(result: dict, path: Path, mode: str) -> None:
    with np.load(path, allow_pickle=False) as archive:
        expected = {k: archive[k] for k in archive.files}
    assert isinstance(result, dict)
    assert list(result) == list(expected)  # same keys, in the archive's order
    for key, array in result.items():
        _assert_same_as_np_load(array, path, expected=expected[key])
        if array.size:
            assert array.flags.writeable == (mode != "mmap"), key


@pytest.mark.parametrize("writer", [pytest.param("stored"), pytest.param("deflated", marks=needs_zlib)])
def test_read_header_of_an_archive_member_is_np_loads_shape_and_dtype(writer, tmp_path):
    """read_header of a .npz: the only member, or `member=`; what np.load gives, none of the data read."""
    arrays = arrays_of_every_kind()
    path = tmp_path / "every.npz"
    WRITERS[writer](path, **arrays)
    with np.load(path, allow_pickle=False) as archive:
        for name in archive.files:
            header = npyfeed.read_header(path, member=name)
            want = archive[name]
            assert (header.shape, header.dtype, header.nbytes) == (want.shape, want.dtype, want.nbytes), name
            assert header.fortran_order == (want.flags.f_contiguous and not want.flags.c_contiguous), name
    with pytest.raises(ValueError, match=r"every\.npz: the archive holds 15 arrays; name the one to read"):
        npyfeed.read_header(path)
    with pytest.raises(ValueError, match=r"no member 'nope' in the archive \(it holds 'factors', 'f8_fortran'"):
        npyfeed.read_header(path, member="nope")
    one = tmp_path / "AAPL.npz"
    WRITERS[writer](one, arrays["factors"])  # saved without a name: member arr_0
    header = npyfeed.read_header(str(one))
    assert (header.shape, header.dtype) == ((480, 256), np.dtype(np.float32))
    assert header == npyfeed.read_header(one, member="arr_0")
    np.save(tmp_path / "a.npy", arrays["i1"])
    with pytest.raises(ValueError, match=r"a\.npy: member='arr_0' names an array of a \.npz archive"):
        npyfeed.read_header(tmp_path / "a.npy", member="arr_0")
    (tmp_path / "broken.npz").write_bytes(one.read_bytes()[:-30])  # the end of the central directory cut off
    with pytest.raises(npyfeed.NpyFormatError, match="broken.npz"):
        npyfeed.read_header(tmp_path / "broken.npz")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("writer", [pytest.param("stored"), pytest.param("deflated", marks=needs_zlib)])
def test_load_equals_np_load(writer, mode, tmp_path):
    path = tmp_path / "all.npz"
    WRITERS[writer](path, **arrays_of_every_kind())
    check_same_as_np_load(npyfeed.load(path, mode=mode), path, mode)


@needs_zlib
@pytest.mark.parametrize("mode", MODES)
def test_positional_arrays_and_members_of_every_format_version(mode, tmp_path):
    path = tmp_path / "versions.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for version in [(1, 0), (2, 0), (3, 0)]:
            buf = io.BytesIO()
            array = np.arange(20, dtype=np.float64) * version[0]
            if version == (3, 0):
                array = np.zeros(3, dtype=[("ünï", "<i4")])  # v3: a utf-8 header
            np.lib.format.write_array(buf, array, version=version)
            z.writestr(f"v{version[0]}.npy", buf.getvalue())
    check_same_as_np_load(npyfeed.load(path, mode=mode), path, mode)
    np.savez(tmp_path / "pos.npz", np.arange(3), np.ones(2))
    assert list(npyfeed.load(tmp_path / "pos.npz", mode=mode)) == ["arr_0", "arr_1"]


def _mapping_of(address: int) -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5] if len(fields) > 5 else ""
    return ""


def _data_offset_in_archive(path: Path, name: str) -> int:
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
    raw = path.read_bytes()
    name_len, extra_len = np.frombuffer(raw[info.header_offset + 26:info.header_offset + 30], "<u2")
    member_at = info.header_offset + 30 + int(name_len) + int(extra_len)
    return member_at + npyfeed._core.parse_header_bytes(raw[member_at:member_at + 4096])["data_offset"]


def test_stored_members_are_zero_copy_views_when_aligned(tmp_path):
    # np.savez does not align member data: "ab" (a 2-character key) lands float32 data on a multiple of 4,
    # "abc" does not. The aligned one is a view of the archive's mapping; the other a read-only aligned copy.
    path = tmp_path / "s.npz"
    a = np.arange(4800 * 256, dtype=np.float32).reshape(4800, 256)
    np.savez(path, ab=a, abc=a)
    assert _data_offset_in_archive(path, "ab.npy") % 4 == 0
    assert _data_offset_in_archive(path, "abc.npy") % 4 != 0
    loaded = npyfeed.load(path, mode="mmap")
    view, copy = loaded["ab"], loaded["abc"]
    assert _mapping_of(view.ctypes.data) == str(path)
    assert view.ctypes.data - _mapping_of_start(view.ctypes.data) == _data_offset_in_archive(path, "ab.npy")
    assert _mapping_of(copy.ctypes.data) != str(path)
    assert copy.ctypes.data % 64 == 0
    assert not view.flags.writeable and not copy.flags.writeable
    np.testing.assert_array_equal(view, a)
    np.testing.assert_array_equal(copy, a)
    # populate=True faults the view in now (and still returns the same data).
    np.testing.assert_array_equal(npyfeed.load(path, mode="mmap", populate=True)["ab"], a)
    # read/direct: owned, writable, 64-byte aligned.
    for mode in ("read", "direct"):
        owned = npyfeed.load(path, mode=mode)["ab"]
        assert owned.flags.writeable and owned.ctypes.data % 64 == 0 and _mapping_of(owned.ctypes.data) != str(path)


def _mapping_of_start(address: int) -> int:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return lo - int(line.split()[2], 16)  # minus the mapping's file offset
    raise AssertionError("address not mapped")


@pytest.mark.parametrize("writer", [pytest.param("stored"), pytest.param("deflated", marks=needs_zlib)])
def test_load_many_mixes_npy_and_npz_in_order(writer, tmp_path, write_npy):
    a, b = np.arange(10.0), np.arange(6).reshape(2, 3)
    write_npy(tmp_path / "a.npy", a)
    WRITERS[writer](tmp_path / "b.npz", x=b, y=a)
    write_npy(tmp_path / "c.npy", b)
    out = npyfeed.load_many([tmp_path / "a.npy", tmp_path / "b.npz", tmp_path / "c.npy"])
    np.testing.assert_array_equal(out[0], a)
    assert list(out[1]) == ["x", "y"]
    np.testing.assert_array_equal(out[1]["x"], b)
    np.testing.assert_array_equal(out[2], b)


@needs_zlib
def test_load_factor_files_key_rule(tmp_path, write_npy):
    factors = {k: np.full((4, 3), i, dtype=np.float32) for i, k in enumerate(["AAA", "BBB", "CCC", "DDD"])}
    np.savez_compressed(tmp_path / "day1.npz", AAA=factors["AAA"], BBB=factors["BBB"])  # named members
    np.savez_compressed(tmp_path / "CCC.npz", factors["CCC"])  # one positional array: the file's key
    write_npy(tmp_path / "DDD.npy", factors["DDD"])
    store = npyfeed.load_factor_files([tmp_path / "day1.npz", tmp_path / "CCC.npz", tmp_path / "DDD.npy"], {})
    assert sorted(store) == ["AAA", "BBB", "CCC", "DDD"]
    for k, v in factors.items():
        np.testing.assert_array_equal(store[k], v)
    # key= applies to .npy files and positional archives.
    store = npyfeed.load_factor_files([tmp_path / "CCC.npz"], key=lambda p: "k_" + Path(p).stem)
    assert list(store) == ["k_CCC"]


@needs_zlib
def test_load_factor_files_duplicate_keys_name_both_files(tmp_path, write_npy):
    np.savez_compressed(tmp_path / "one.npz", AAA=np.zeros(2), BBB=np.ones(2))
    np.savez_compressed(tmp_path / "two.npz", BBB=np.ones(3))
    write_npy(tmp_path / "AAA.npy", np.zeros(1))
    store = {"kept": 1}
    with pytest.raises(ValueError, match="'BBB'") as info:
        npyfeed.load_factor_files([tmp_path / "one.npz", tmp_path / "two.npz"], store)
    assert str(tmp_path / "one.npz") in str(info.value) and str(tmp_path / "two.npz") in str(info.value)
    with pytest.raises(ValueError, match="'AAA'") as info:
        npyfeed.load_factor_files([tmp_path / "AAA.npy", tmp_path / "one.npz"], store)
    assert str(tmp_path / "AAA.npy") in str(info.value) and str(tmp_path / "one.npz") in str(info.value)
    assert store == {"kept": 1}


@needs_zlib
def test_other_python_threads_run_while_archives_inflate(tmp_path):
    rng = np.random.default_rng(0)
    paths = []
    for i in range(4):
        paths.append(tmp_path / f"f{i}.npz")
        np.savez_compressed(paths[-1], **{f"m{j}": rng.integers(0, 50, (3000, 256)).astype(np.float32)
                                          for j in range(4)})
    npyfeed.load_many(paths[:1])  # warm-up
    counter = 0
    started, stop = threading.Event(), threading.Event()

    def spin():
        nonlocal counter
        started.set()
        while not stop.is_set():
            counter += 1
            if counter % 1000 == 0:
                import time

                time.sleep(1e-4)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(100.0)  # the main thread gives the GIL up only where npyfeed releases it
    thread = threading.Thread(target=spin)
    try:
        thread.start()
        started.wait()
        before = counter
        out = npyfeed.load_many(paths, threads=2)
        during = counter - before
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert during > 1000
    assert len(out) == 4 and all(len(d) == 4 for d in out)


# ----------------------------------------------------------------------------------------------------------
# WindowSource over .npz factor and label files


def _window_data(tmp_path: Path, writer: str, **extra):
    rng = np.random.default_rng(3)
    keys = ["k1", "k2"]
    factors = {k: rng.standard_normal((50, 8)).astype(np.float32) for k in keys}
    labels = {k: rng.standard_normal((50, 2)).astype(np.float32) for k in keys}
    for d in ("f_npy", "l_npy", "f_npz", "l_npz"):
        (tmp_path / d).mkdir()
    for k in keys:
        np.save(tmp_path / "f_npy" / f"{k}.npy", factors[k])
        np.save(tmp_path / "l_npy" / f"{k}.npy", labels[k])
        WRITERS[writer](tmp_path / "f_npz" / f"{k}.npz", **{extra.get("member", "arr_0"): factors[k]},
                        **extra.get("others", {}))
        WRITERS[writer](tmp_path / "l_npz" / f"{k}.npz", **{extra.get("member", "arr_0"): labels[k]},
                        **extra.get("others", {}))
    index = tmp_path / "index.txt"
    index.write_text("".join(f"{fi},{fi},{k}\n" for k in keys for fi in range(4, 50, 3)))
    return index


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("writer", [pytest.param("stored"), pytest.param("deflated", marks=needs_zlib)])
def test_window_source_reads_npz_like_npy(writer, mode, tmp_path):
    index = _window_data(tmp_path, writer)
    ref = npyfeed.WindowSource(index, tmp_path / "f_npy", tmp_path / "l_npy", window=5, mode=mode)
    src = npyfeed.WindowSource(index, tmp_path / "f_npz", tmp_path / "l_npz", window=5, mode=mode)
    ids = np.arange(len(ref))
    assert all(f.endswith(".npz") for f in src.files) and len(src.files) == 4
    for got, want in zip(src.get(ids), ref.get(ids)):
        np.testing.assert_array_equal(got, want)
    assert np.abs(ref.get(ids)[0]).sum() > 0


@needs_zlib
def test_window_source_member_argument_and_memory_bound(tmp_path):
    index = _window_data(tmp_path, "deflated", member="x", others={"other": np.zeros(3)})
    with pytest.raises(ValueError, match="holds 2 arrays") as info:
        npyfeed.WindowSource(index, tmp_path / "f_npz", tmp_path / "l_npz", window=5)
    assert str(tmp_path / "f_npz") in str(info.value)
    with pytest.raises(ValueError, match="no member 'nope'"):
        npyfeed.WindowSource(index, tmp_path / "f_npz", tmp_path / "l_npz", window=5, member="nope")
    ref = npyfeed.WindowSource(index, tmp_path / "f_npy", tmp_path / "l_npy", window=5)
    src = npyfeed.WindowSource(index, tmp_path / "f_npz", tmp_path / "l_npz", window=5, member="x")
    np.testing.assert_array_equal(src.get([0, 7])[0], ref.get([0, 7])[0])
    # 2 keys x (50*8 + 50*2) float32 = 4000 bytes held in memory: a 3000-byte bound is refused, naming a file.
    with pytest.raises(ValueError, match="npz_memory_limit") as info:
        npyfeed.WindowSource(index, tmp_path / "f_npz", tmp_path / "l_npz", window=5, member="x",
                             npz_memory_limit=3000)
    assert ".npz" in str(info.value)
    npyfeed.WindowSource(index, tmp_path / "f_npz", tmp_path / "l_npz", window=5, member="x", npz_memory_limit=4000)
