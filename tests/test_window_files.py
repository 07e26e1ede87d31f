"""How a WindowSource opens its files: only read-only (descriptors and mappings checked in /proc, and files of
mode 0444 used by an unprivileged user), unreadable files as PermissionError, sockets and FIFOs refused without
blocking, `max_header_size`, and the O_DIRECT fallback's warning. The gather itself is in test_windows_gather.py."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import npyfeed
import numpy as np
import pytest
from _sandbox import run_on_ramfs, run_unprivileged, shared_dir

FILE_MODES = ("mmap", "read", "direct")
WINDOW = 4


def write_source(root: Path, factor_writer=np.save) -> tuple:
    """Two keys in ``<root>/factor``, ``<root>/label`` and ``<root>/index.txt``; returns (index, factors, labels)."""
    rng = np.random.default_rng(14)
    factors = {k: rng.standard_normal((30, 5)).astype("<f4") for k in ("a", "b")}
    labels = {k: rng.standard_normal((30, 2)).astype("<f4") for k in ("a", "b")}
    for sub in ("factor", "label"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for k in factors:
        factor_writer(root / "factor" / f"{k}.npy", factors[k])
        np.save(root / "label" / f"{k}.npy", labels[k])
    entries = [(f, f % 30, k) for k in factors for f in range(WINDOW - 1, 30, 3)]
    (root / "index.txt").write_text("".join(f"{f},{l},{k}\n" for f, l, k in entries))
    return entries, factors, labels


def read_oracle(root: Path) -> tuple:
    """(index entries, factors, labels) of a source written by `write_source`, read back with np.load."""
    lines = (root / "index.txt").read_text().split()
    entries = [(int(f), int(l), k) for f, l, k in (line.split(",") for line in lines)]
    keys = sorted({k for _, _, k in entries})
    load = lambda sub, k: np.load(root / sub / f"{k}.npy", max_header_size=20000)  # noqa: E731
    return entries, {k: load("factor", k) for k in keys}, {k: load("label", k) for k in keys}


def open_source(root: Path, mode: str, **kwargs) -> npyfeed.WindowSource:
    return npyfeed.WindowSource(root / "index.txt", root / "factor", root / "label", WINDOW, mode=mode, **kwargs)


def assert_all_samples(src, entries, factors, labels) -> None:
    x, y = src.get(np.arange(len(src)))
    np.testing.assert_array_equal(x, np.stack([factors[k][f - WINDOW + 1:f + 1] for f, _, k in entries]), strict=True)
    np.testing.assert_array_equal(y, np.stack([labels[k][l] for _, l, k in entries]), strict=True)


# ----------------------------------------------------------------------------------------------------------
# Read-only


def _open_files(root: Path) -> dict:
    """This process's descriptors of files under `root`: path -> list of open flags (from /proc/self/fdinfo)."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            with open(f"/proc/self/fdinfo/{fd}") as fh:
                flags = next(int(line.split()[1], 8) for line in fh if line.startswith("flags:"))
        except (FileNotFoundError, StopIteration):  # closed meanwhile (e.g. the listing's own descriptor)
            continue
        if target.startswith(str(root) + os.sep):
            found.setdefault(target, []).append(flags)
    return found


def _mappings(root: Path) -> dict:
    """This process's mappings of files under `root`: path -> list of permission strings ("r--s", ...)."""
    found = {}
    with open("/proc/self/maps") as fh:
        for line in fh:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip().startswith(str(root) + os.sep):
                found.setdefault(fields[5].strip(), []).append(fields[1])
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="needs /proc")
@pytest.mark.parametrize("mode", ["read", "direct"])
def test_descriptors_are_read_only(tmp_path, mode):
    # "read" and "direct" keep a descriptor per file while the source lives (few files here).
    entries, factors, labels = write_source(tmp_path)
    src = open_source(tmp_path, mode, threads=2)
    assert_all_samples(src, entries, factors, labels)
    held = _open_files(tmp_path)
    factor_files = {str(tmp_path / "factor" / f"{k}.npy") for k in factors}
    assert factor_files <= set(held), held  # the check below sees the factor files' descriptors
    for path, flags in held.items():
        assert all(f & os.O_ACCMODE == os.O_RDONLY for f in flags), (path, [oct(f) for f in flags])
    if mode == "direct":  # and it can tell flags apart: the direct descriptors carry O_DIRECT
        assert any(f & os.O_DIRECT for p in factor_files for f in held[p]), held


@pytest.mark.skipif(not os.path.isfile("/proc/self/maps"), reason="needs /proc")
def test_mappings_are_read_only(tmp_path):
    entries, factors, labels = write_source(tmp_path)
    src = open_source(tmp_path, "mmap", threads=2)
    assert_all_samples(src, entries, factors, labels)
    mapped = _mappings(tmp_path)
    assert {str(tmp_path / "factor" / f"{k}.npy") for k in factors} <= set(mapped), mapped
    for path, perms in mapped.items():
        assert all(p[1] == "-" for p in perms), (path, perms)


# Imported before the child drops root (this Python may live where user nobody cannot read).
_UNPRIVILEGED_IMPORTS = """
    import errno
    from pathlib import Path
    import numpy as np
    import numpy.testing
    import npyfeed
    from test_window_files import FILE_MODES, assert_all_samples, open_source, read_oracle
"""

_UNPRIVILEGED_OPEN = """
    root, case = Path(sys.argv[1]), sys.argv[2]
    factor = root / "factor" / "a.npy"
    if case == "read-only":
        # The control: this user cannot open the files for writing, so a non-read-only open would fail.
        try:
            os.open(factor, os.O_RDWR)
            sys.exit("opened a 0444 file for writing")
        except PermissionError:
            pass
        entries, factors, labels = read_oracle(root)
        for mode in FILE_MODES:
            assert_all_samples(open_source(root, mode, threads=2), entries, factors, labels)
            assert np.array_equal(npyfeed.load(factor, mode=mode), factors["a"])
    else:
        for mode in FILE_MODES:
            try:
                open_source(root, mode, threads=2)
                sys.exit(f"{mode}: no error for an unreadable file")
            except PermissionError as e:
                assert e.errno == errno.EACCES and e.filename == str(factor), (mode, e)
                assert str(factor) in str(e), (mode, e)
    print("ok")
"""


@pytest.mark.parametrize("case", ["read-only", "unreadable"])
def test_files_as_an_unprivileged_user(case):
    # Root reads and writes any file: the checks run in a child that has dropped root.
    with shared_dir() as root:
        write_source(root)
        for path in root.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o444)
        if case == "unreadable":
            os.chmod(root / "factor" / "a.npy", 0o000)
        proc = run_unprivileged(_UNPRIVILEGED_OPEN, root, case,
                                imports=_UNPRIVILEGED_IMPORTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1:] == ["ok"], proc.stdout


# ----------------------------------------------------------------------------------------------------------
# What is not a regular file


_OPEN_SPECIAL = """
    import errno, socket, sys
    from pathlib import Path
    import npyfeed
    root, kind, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    factor = root / "factor" / "a.npy"
    factor.unlink()
    if kind == "socket":
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(factor))
        listener.listen()
    else:
        os.mkfifo(factor)  # nobody ever writes to it: a blocking open would never return
    try:
        npyfeed.WindowSource(root / "index.txt", root / "factor", root / "label", 4, mode=mode)
        sys.exit("no error")
    except (OSError, npyfeed.NpyFormatError) as e:
        assert str(factor) in str(e), e
        print(type(e).__name__, getattr(e, "errno", None))
"""


@pytest.mark.parametrize("mode", FILE_MODES)
@pytest.mark.parametrize("kind", ["socket", "fifo"])
def test_sockets_and_fifos_are_refused_without_blocking(tmp_path, kind, mode):
    # In a child with a deadline: a blocking open hangs it, not the suite.
    write_source(tmp_path)
    code = "import os, sys\n" + textwrap.dedent(_OPEN_SPECIAL)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path), kind, mode], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = {"socket": f"OSError {errno.ENXIO}", "fifo": "NpyFormatError None"}[kind]
    assert proc.stdout.strip() == expected


# ----------------------------------------------------------------------------------------------------------
# max_header_size


def write_padded(path: Path, array: np.ndarray, data_offset: int) -> None:
    """A version 2.0 file whose header is padded with spaces up to `data_offset` (np.load reads it, given
    ``max_header_size``)."""
    text = repr({"descr": np.lib.format.dtype_to_descr(array.dtype), "fortran_order": False, "shape": array.shape})
    header = (text.ljust(data_offset - 12 - 1) + "\n").encode("latin1")
    with open(path, "wb") as fh:
        fh.write(b"\x93NUMPY\x02\x00" + np.uint32(len(header)).tobytes() + header + array.tobytes())


@pytest.mark.parametrize("mode", FILE_MODES)
def test_max_header_size(tmp_path, mode):
    entries, factors, labels = write_source(tmp_path, lambda p, a: write_padded(p, a, 12032))
    factor = tmp_path / "factor" / "a.npy"
    np.testing.assert_array_equal(np.load(factor, max_header_size=12020), factors["a"], strict=True)  # oracle
    with pytest.raises(npyfeed.NpyFormatError, match="max_header_size") as excinfo:  # the default, 10000
        open_source(tmp_path, mode)
    assert excinfo.value.path in {str(tmp_path / "factor" / f"{k}.npy") for k in factors}  # opened in parallel
    with pytest.raises(npyfeed.NpyFormatError, match="max_header_size"):
        open_source(tmp_path, mode, max_header_size=12019)  # the header text is 12020 bytes
    assert_all_samples(open_source(tmp_path, mode, max_header_size=12020), entries, factors, labels)


# ----------------------------------------------------------------------------------------------------------
# The O_DIRECT fallback (its batches are checked in test_windows_gather.py)


_FALLBACK_WARNING = """
    import logging
    from pathlib import Path
    from test_window_files import assert_all_samples, open_source, write_source

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("npyfeed").addHandler(handler)
    root = Path(sys.argv[1])
    entries, factors, labels = write_source(root)
    assert_all_samples(open_source(root, "direct"), entries, factors, labels)
    messages = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    print("warned" if any("O_DIRECT" in m and str(root) in m for m in messages) else "silent", messages)
    src = open_source(root, "direct")
    assert src.direct_fallback and all(str(root) in p for p in src.direct_fallback), src.direct_fallback
    assert open_source(root, "read").direct_fallback == ()
"""


class _NoWarning(AssertionError):
    pass


def test_direct_fallback_warns(tmp_path):
    mountpoint = tmp_path / "ramfs"
    mountpoint.mkdir()
    proc = run_on_ramfs(_FALLBACK_WARNING, mountpoint)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the batches are right either way
    if not proc.stdout.startswith("warned"):
        raise _NoWarning(proc.stdout)


# ----------------------------------------------------------------------------------------------------------
# More files than the process may map


def _many_keys(root: Path, keys: int, rows: int = 8) -> tuple:
    """`keys` keys of (rows, 2) float32 factors and (rows, 1) labels, one window each at a seeded row; written
    as header + data bytes (np.save per file would dominate with tens of thousands of files)."""
    rng = np.random.default_rng(keys)
    factors = rng.standard_normal((keys, rows, 2)).astype("<f4")
    labels = rng.standard_normal((keys, rows, 1)).astype("<f4")
    for sub, arrays in (("factor", factors), ("label", labels)):
        (root / sub).mkdir(parents=True, exist_ok=True)
        header = np.lib.format.header_data_from_array_1_0(arrays[0])
        import io

        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, header)
        prefix = buf.getvalue()
        for k in range(keys):
            (root / sub / f"k{k:05d}.npy").write_bytes(prefix + arrays[k].tobytes())
    feature = rng.integers(WINDOW - 1, rows, keys)
    entries = [(int(feature[k]), int(feature[k]), f"k{k:05d}") for k in range(keys)]
    (root / "index.txt").write_text("".join(f"{f},{l},{k}\n" for f, l, k in entries))
    return entries, {f"k{k:05d}": factors[k] for k in range(keys)}, {f"k{k:05d}": labels[k] for k in range(keys)}


def _maps_now() -> int:
    with open("/proc/self/maps") as fh:
        return sum(1 for _ in fh)


def _assert_budget_of_about_20(src) -> int:
    """The source's mapping bound with NPYFEED_MAX_MAPPINGS set 40 above the maps counted just before its open:
    20 (half the room), give or take the few mappings other threads of this process made or dropped in between
    (a pool thread's first malloc arena, mappings an earlier test's source let go of). Returns the bound."""
    assert 14 <= src.mapping_limit <= 26, src.mapping_limit
    return src.mapping_limit


@pytest.mark.skipif(not os.path.isfile("/proc/self/maps"), reason="needs /proc")
def test_more_files_than_the_mapping_budget_are_mapped_on_demand(tmp_path, monkeypatch):
    """With a mapping limit (NPYFEED_MAX_MAPPINGS stands in for vm.max_map_count) that leaves room for 20
    mappings (about: see _assert_budget_of_about_20), 60 files are mapped when read, at most that many at a time,
    and every batch is still np.load's."""
    entries, factors, labels = _many_keys(tmp_path, 30)
    monkeypatch.setenv("NPYFEED_MAX_MAPPINGS", str(_maps_now() + 40))
    src = open_source(tmp_path, "mmap", threads=2, cache=False)  # (a cached index is one more mapping)
    limit = _assert_budget_of_about_20(src)
    assert len(_mappings(tmp_path)) == 0  # nothing mapped at open
    order = src.epoch_order(0, shuffle=True, seed=4)
    with src.batches(7, shuffle=True, seed=4) as it:
        for b, (x, y) in enumerate(it):
            ids = order[b * 7:(b + 1) * 7]
            want_x = np.stack([factors[entries[i][2]][entries[i][0] - WINDOW + 1:entries[i][0] + 1] for i in ids])
            np.testing.assert_array_equal(x, want_x, strict=True)
            np.testing.assert_array_equal(y, np.stack([labels[entries[i][2]][entries[i][1]] for i in ids]),
                                          strict=True)
    # The cache keeps `limit`; one it evicts while a worker still copies out of it lives until that copy ends,
    # so while a stream reads ahead there may be a few more for a moment. With nothing in flight (after each
    # synchronous get), never more than `limit`.
    assert_all_samples(src, entries, factors, labels)
    for b in range(0, len(order), 7):
        src.get(order[b:b + 7])
        assert 0 < len(_mappings(tmp_path)) <= limit
    del src, it
    assert _mappings(tmp_path) == {}  # released with the source


def test_a_file_replaced_under_an_on_demand_mapping_is_refused(tmp_path, monkeypatch):
    entries, factors, labels = _many_keys(tmp_path, 30)
    monkeypatch.setenv("NPYFEED_MAX_MAPPINGS", str(_maps_now() + 40))
    src = open_source(tmp_path, "mmap", cache=False)
    _assert_budget_of_about_20(src)
    path = tmp_path / "factor" / "k00003.npy"
    np.save(tmp_path / "new.npy", np.zeros((8, 2), np.float32))
    os.replace(tmp_path / "new.npy", path)
    with pytest.raises(OSError, match="k00003.npy") as info:
        src.get([3])
    assert info.value.errno == errno.ESTALE
    x, _ = src.get([2, 4])
    np.testing.assert_array_equal(x[0], factors["k00002"][entries[2][0] - WINDOW + 1:entries[2][0] + 1])


def test_every_file_has_its_mapping_within_the_budget(tmp_path):
    entries, factors, labels = _many_keys(tmp_path, 30)
    src = open_source(tmp_path, "mmap")
    assert src.mapping_limit is None
    assert len(_mappings(tmp_path)) == 60
    assert_all_samples(src, entries, factors, labels)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isfile("/proc/sys/vm/max_map_count"), reason="needs /proc")
def test_a_source_over_66000_files_opens_and_iterates_in_mmap_mode(tmp_path):
    """33,000 keys: 66,000 files, more than the default vm.max_map_count (65,530) allows one mapping each."""
    keys = max(33_000, int(Path("/proc/sys/vm/max_map_count").read_text()) // 2 + 500)
    if keys > 40_000:
        pytest.skip("vm.max_map_count is raised on this machine: the case needs more files than it is worth")
    entries, factors, labels = _many_keys(tmp_path, keys)
    src = open_source(tmp_path, "mmap")
    assert len(src) == keys and src.mapping_limit is not None and src.mapping_limit < 2 * keys
    assert_all_samples(src, entries, factors, labels)
    count = sum(len(x) for x, _ in src.batches(4096, shuffle=True, seed=1))
    assert count == keys
    assert len(_mappings(tmp_path)) <= src.mapping_limit
    del src
    # Whole-file mmap loads hand out the mappings themselves: too many is a clear error, not a crash.
    paths = sorted(str(p) for sub in ("factor", "label") for p in (tmp_path / sub).iterdir())
    with pytest.raises(OSError, match="vm.max_map_count") as info:
        npyfeed.load_many(paths, mode="mmap")
    assert info.value.errno == errno.ENOMEM and 'mode="read"' in str(info.value)
    assert _mappings(tmp_path) == {}  # the failed load released what it had mapped


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isfile("/proc/sys/vm/max_map_count"), reason="needs /proc")
def test_reads_fall_back_to_pread_when_no_mapping_can_be_made(tmp_path, monkeypatch):
    """Someone else holds every mapping the process may have: on-demand reads use pread, same values."""
    import mmap

    entries, factors, labels = _many_keys(tmp_path, 30)
    monkeypatch.setenv("NPYFEED_MAX_MAPPINGS", str(_maps_now() + 40))
    src = open_source(tmp_path, "mmap", cache=False)
    _assert_budget_of_about_20(src)
    limit = int(Path("/proc/sys/vm/max_map_count").read_text())
    if limit > 200_000:
        pytest.skip("vm.max_map_count is raised on this machine")
    # What the gather itself maps (pool threads' stacks, their malloc arenas) is made first, by a source dropped
    # with its mappings: the gather below then needs few mappings of its own beside the ones it is refused.
    warm_up = open_source(tmp_path, "mmap", cache=False)
    warm_up.get(np.arange(len(warm_up)))
    del warm_up
    gc.collect()
    held = []
    try:
        try:
            while True:  # shared anonymous mappings never merge: one mapping each
                held.append(mmap.mmap(-1, mmap.PAGESIZE))
        except OSError as e:
            assert e.errno == errno.ENOMEM
        for _ in range(16):  # room for the gather's own allocations (threads, arenas): 16 of 60 files
            held.pop().close()
        x, y = src.get(np.arange(len(src)))
        # Refused a mapping, the cache gave back half of what it kept and halved its bound: the rest of the
        # process finds mappings to make again (8 here, the cache having held about 16).
        assert src.mapping_limit <= 10
        room = 0
        with contextlib.suppress(OSError):
            while room < 100:
                held.append(mmap.mmap(-1, mmap.PAGESIZE))
                room += 1
        assert room >= 3, (room, src.mapping_limit)
    finally:
        for m in held:
            m.close()
    np.testing.assert_array_equal(x, np.stack([factors[k][f - WINDOW + 1:f + 1] for f, _, k in entries]), strict=True)
    np.testing.assert_array_equal(y, np.stack([labels[k][l] for _, l, k in entries]), strict=True)
