"""npyfeed.warm and ``npyfeed warm``: residency before and after, against an oracle that does not use mincore.

The oracle is mincore over a mapping made with ctypes, independently of npyfeed's C++. Files live on a disk-backed folder (pytest's tmp_path; tmpfs pages are always resident) and are evicted with
``fsync`` + ``POSIX_FADV_DONTNEED``, as the benchmarks simulate a cold cache.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import mmap
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import npyfeed
import numpy as np
import pytest
from npyfeed.bench import measure
from npyfeed.cli import main as cli_main

PAGE = os.sysconf("SC_PAGE_SIZE")


def _evict(path) -> None:
    measure.evict([path])


def _resident_pages(path) -> tuple:
    """(pages in the page cache, pages) of `path`."""
    vector = _residency(path)
    return sum(vector), len(vector)


def _residency(path) -> list:
    """Per page of `path`, whether it is in the page cache: mincore over a mapping made here through ctypes (a
    probe by reading, even with RWF_NOWAIT, would start readahead and change what it measures)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pages = -(-size // PAGE)
        if size == 0:
            return []
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vector = ctypes.create_string_buffer(pages)
            assert libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
            return [bool(b & 1) for b in vector.raw[:pages]]
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


@pytest.fixture
def data_set(tmp_path):
    """Two directories of .npy files (and one other file), evicted from the page cache; skips where eviction
    does not work (a filesystem that keeps everything in memory)."""
    rng = np.random.default_rng(7)
    files = []
    for sub, count in (("factor", 3), ("label", 2)):
        (tmp_path / sub).mkdir()
        for k in range(count):
            path = tmp_path / sub / f"k{k}.npy"
            np.save(path, rng.standard_normal((700 + 300 * k, 64)).astype(np.float32))
            files.append(path)
    (tmp_path / "factor" / "notes.txt").write_text("not a .npy file\n" * 1000)
    for path in files:
        _evict(path)
    if any(_resident_pages(p)[0] > 0 for p in files):
        pytest.skip("this filesystem keeps evicted pages resident")
    return tmp_path, files


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("NPYFEED_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def test_warm_reads_what_is_not_resident_and_reports_it(data_set):
    root, files = data_set
    sizes = {p: p.stat().st_size for p in files}
    before = {p: p.read_bytes() for p in files}
    for p in files:
        _evict(p)
    first = files[0]
    with open(first, "rb") as f:  # half of one file is in the cache already
        f.read(sizes[first] // 2)
    resident_first = _resident_pages(first)[0] * PAGE

    report = npyfeed.warm(root)

    assert report.files == len(files)  # only *.npy
    assert report.bytes == sum(sizes.values())
    assert report.resident_after == report.bytes
    assert abs(report.resident_before - resident_first) <= 2 * PAGE
    # The half that was cached is not read again (pieces are 8 MiB: this small file is one piece, read whole
    # because it was not all resident), the other files are read once.
    assert sum(sizes[p] for p in files[1:]) <= report.bytes_read <= report.bytes
    for p in files:
        assert _resident_pages(p)[0] == _resident_pages(p)[1], p  # the oracle agrees: every page cached
        assert p.read_bytes() == before[p]  # nothing the user gave us is modified
    assert set(report.directories) == {str(root / "factor"), str(root / "label")}
    assert report.directories[str(root / "factor")].files == 3
    assert report.directories[str(root / "label")].bytes == sum(sizes[p] for p in files[3:])

    again = npyfeed.warm(root)
    assert again.bytes_read == 0 and again.resident_before == again.bytes


def test_check_reads_nothing(data_set):
    root, files = data_set
    report = npyfeed.warm([root / "factor", files[3]], check=True)
    assert report.files == 4
    assert report.bytes_read == 0
    assert report.resident_before == report.resident_after == 0
    assert all(_resident_pages(p)[0] == 0 for p in files)  # still cold


def test_a_large_file_is_read_in_pieces_that_skip_resident_ones(tmp_path):
    path = tmp_path / "big.npy"
    np.save(path, np.arange(5 << 20, dtype=np.float32))  # 20 MiB: three 8 MiB pieces
    _evict(path)
    if _resident_pages(path)[0] > 0:
        pytest.skip("this filesystem keeps evicted pages resident")
    fd = os.open(path, os.O_RDONLY)
    try:  # the first piece is cached (kernel readahead may cache some of the next one too)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        os.pread(fd, 8 << 20, 0)
    finally:
        os.close(fd)
    size = path.stat().st_size
    piece_pages = (8 << 20) // PAGE
    vector = _residency(path)
    pieces = [vector[k:k + piece_pages] for k in range(0, len(vector), piece_pages)]
    assert all(pieces[0]) and not all(pieces[-1])
    expected = sum(min(8 << 20, size - k * (8 << 20)) for k, piece in enumerate(pieces) if not all(piece))
    report = npyfeed.warm(path, threads=2)
    assert report.bytes_read == expected <= size - (8 << 20)  # whole pieces, and never the resident first one
    assert report.resident_after == size


def test_processes_warming_at_once_read_each_byte_once(data_set, tmp_path):
    root, files = data_set
    script = textwrap.dedent("""
        import sys, time, npyfeed
        start = float(sys.argv[2])
        while time.time() < start:
            time.sleep(0.001)
        print(npyfeed.warm(sys.argv[1], threads=1).bytes_read)
    """)
    import time

    start = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", script, str(root), str(start)], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    total = sum(int(out) for out in outputs)
    assert total == sum(p.stat().st_size for p in files)
    # The lock file is gone with its last holder (the test's own cache folder: conftest).
    assert not list(Path(os.environ["NPYFEED_CACHE_DIR"]).glob("warm-*.lock"))


def _someone_waits_on(fd: int) -> bool:
    """Whether, within 20 s, /proc/locks shows a process waiting for an flock on the file `fd` is open on."""
    inode = f":{os.fstat(fd).st_ino} "
    for _ in range(2000):
        with open("/proc/locks") as locks:
            if any("->" in line and inode in line for line in locks):
                return True
        time.sleep(0.01)
    return False


def _hold(path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_waiter_whose_lock_file_its_holder_removed_waits_for_the_new_one(tmp_path):
    """The holder removes the lock file before letting go; a process that waited on that file must then lock the
    one the name holds now (another process may have created and taken it), never go on holding a nameless one."""
    from npyfeed.warm import _data_set_lock

    files = [str(tmp_path / "a.npy")]
    lock = _data_set_lock(files, enabled=True)
    path = lock._path
    first = _hold(path)
    entered = threading.Event()

    def take_turn():
        with lock:
            entered.set()

    waiter = threading.Thread(target=take_turn)
    waiter.start()
    try:
        assert _someone_waits_on(first)
        os.unlink(path)  # the holder lets go as npyfeed does: removed while still held ...
        second = _hold(path)  # ... and another process creates and takes a new one at once
        os.close(first)
        assert _someone_waits_on(second)  # the waiter moved on to the new file
        assert not entered.is_set()
        os.close(second)
    finally:
        waiter.join(timeout=30)
    assert entered.is_set()
    assert not path.exists()


def test_without_a_writable_cache_dir_it_warns_and_still_warms(data_set, monkeypatch, caplog):
    root, files = data_set
    blocker = root / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("NPYFEED_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot be created
    with caplog.at_level(logging.WARNING, logger="npyfeed"):
        report = npyfeed.warm(root)
    assert report.resident_after == report.bytes
    assert any("no lock" in r.getMessage() for r in caplog.records)


def test_bad_paths_are_named(tmp_path):
    missing = tmp_path / "nope.npy"
    with pytest.raises(FileNotFoundError) as info:
        npyfeed.warm([missing])
    assert info.value.filename == str(missing)
    fifo = tmp_path / "fifo.npy"
    os.mkfifo(fifo)
    with pytest.raises(npyfeed.NpyFormatError, match="regular file") as info:
        npyfeed.warm(fifo)  # refused at once, never blocks
    assert str(fifo) in str(info.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert npyfeed.warm(empty).files == 0


def test_cli(data_set, capsys):
    root, files = data_set
    assert cli_main(["warm", "--check", str(root)]) == 0
    out = capsys.readouterr().out
    assert str(root / "factor") in out and "total" in out and "0%" in out
    assert cli_main(["warm", "--quiet", str(root)]) == 0
    out = capsys.readouterr().out
    assert "100%" in out.splitlines()[-2]  # the total line: everything resident after
    assert cli_main(["warm", str(root / "missing")]) == 1
    assert "missing" in capsys.readouterr().err


def test_progress_bar_counts_bytes(data_set, capsys):
    pytest.importorskip("tqdm")
    root, files = data_set
    npyfeed.warm(root, progress=True)
    err = capsys.readouterr().err
    assert "npyfeed 5 files" in err


def test_a_window_source_warms_its_factor_and_label_files(tmp_path):
    factor_dir, label_dir = tmp_path / "factor", tmp_path / "label"
    factor_dir.mkdir()
    label_dir.mkdir()
    for key in ("a", "b"):
        np.save(factor_dir / f"{key}.npy", np.ones((50, 3), np.float32))
        np.save(label_dir / f"{key}.npy", np.ones((50, 1), np.float32))
    np.save(factor_dir / "unused.npy", np.ones((50, 3), np.float32))  # no index line names it
    (tmp_path / "index.txt").write_text("9,9,a\n9,9,b\n")
    src = npyfeed.WindowSource([tmp_path / "index.txt"], factor_dir, label_dir, window=5)
    assert src.files == (str(factor_dir / "a.npy"), str(factor_dir / "b.npy"), str(label_dir / "a.npy"),
                         str(label_dir / "b.npy"))
    report = npyfeed.warm(src, lock=False)
    assert report.files == 4 and report.resident_after == report.bytes
    assert npyfeed.WindowSource.from_arrays([(9, 9, "a")], {"a": np.ones((50, 3))}, {"a": np.ones((50, 1))}, 5).files == ()
