"""The compiled index cache behind WindowSource (issue 8, item 1).

Every source here is compared with the numpy oracle and with ``cache=False``: the cache is built by the first
open and reused (same file, same inode) by later ones, in this process or others; an index file edited or touched
makes it stale (rebuilt); a corrupted or truncated cache file is rebuilt with the same results; a cache dir that
cannot be written warns and works from memory; processes opening together build it once; malformed lines and
describe() still name file and line. The format itself (every corrupted byte refused) is in
tests/cpp/test_index_cache.cpp.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import npyfeed
import numpy as np
import pytest
from _sandbox import run_unprivileged, shared_dir
from npyfeed import _layout

WINDOW = 4
KEYS = ("a", "b", "c")
ROWS = 40


def write_data(root: Path, entries: list) -> Path:
    rng = np.random.default_rng(7)
    for key in KEYS:
        factor = rng.standard_normal((ROWS, 3)).astype(np.float32)
        _layout.write_key(root, key, factor, rng.standard_normal((ROWS, 2)).astype(np.float32))
    write_index(root, entries)
    return root


def write_index(root: Path, entries: list, name: str = "index.txt") -> Path:
    path = root / name
    path.write_text(_layout.index_text(entries))
    return path


def entries_for(seed: int, n: int = 300) -> list:
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(WINDOW - 1, ROWS)), int(rng.integers(0, ROWS)), KEYS[int(rng.integers(0, 3))])
            for _ in range(n)]


def oracle(root: Path, entries: list) -> tuple:
    factors = {k: np.load(root / "factor" / f"{k}.npy") for k in KEYS}
    labels = {k: np.load(root / "label" / f"{k}.npy") for k in KEYS}
    x = np.stack([factors[k][f - WINDOW + 1:f + 1] for f, _, k in entries])
    y = np.stack([labels[k][l] for _, l, k in entries])
    return x, y


def open_source(root: Path, **kwargs) -> npyfeed.WindowSource:
    return npyfeed.WindowSource(root / "index.txt", root / "factor", root / "label", WINDOW, threads=2, **kwargs)


def assert_matches(src: npyfeed.WindowSource, expected: tuple) -> None:
    x, y = src.get(np.arange(len(src)))
    np.testing.assert_array_equal(x, expected[0])
    np.testing.assert_array_equal(y, expected[1])


def cache_files(folder: Path) -> list:
    return sorted(p for p in folder.glob("index-*.npyidx"))


@pytest.fixture
def data(tmp_path):
    entries = entries_for(1)
    return write_data(tmp_path / "data", entries), entries


def test_built_once_then_reused(data, tmp_path):
    root, entries = data
    cache_dir = tmp_path / "cache"
    first = open_source(root, cache_dir=cache_dir)
    assert first._index_built
    assert first.index_cache is not None and Path(first.index_cache).parent == cache_dir
    assert cache_files(cache_dir) == [Path(first.index_cache)]
    st = os.stat(first.index_cache)
    assert_matches(first, oracle(root, entries))
    second = open_source(root, cache_dir=cache_dir)
    assert not second._index_built  # read the cache, compiled nothing
    assert second.index_cache == first.index_cache
    again = os.stat(second.index_cache)
    assert (again.st_ino, again.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)  # not rewritten
    assert_matches(second, oracle(root, entries))
    # The default folder: NPYFEED_CACHE_DIR (a private one per test, see conftest).
    default = open_source(root)
    assert Path(default.index_cache).parent == Path(os.environ["NPYFEED_CACHE_DIR"])
    assert_matches(default, oracle(root, entries))


def test_cache_false_writes_nothing_and_matches(data, tmp_path):
    root, entries = data
    src = open_source(root, cache=False, cache_dir=tmp_path / "cache")
    assert src.index_cache is None
    assert not (tmp_path / "cache").exists()
    assert_matches(src, oracle(root, entries))
    with pytest.raises(TypeError):
        open_source(root, cache="yes")


@pytest.mark.parametrize("change", ["edit", "touch", "replace"])
def test_stale_after_the_index_changes(data, tmp_path, change):
    root, entries = data
    cache_dir = tmp_path / "cache"
    old = open_source(root, cache_dir=cache_dir)
    old_inode = os.stat(old.index_cache).st_ino
    if change == "edit":
        entries = entries_for(2)  # same number of lines
        write_index(root, entries)
    elif change == "touch":
        st = os.stat(root / "index.txt")
        os.utime(root / "index.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    else:  # a new file renamed over the old one: same size and mtime, new inode
        st = os.stat(root / "index.txt")
        write_index(root, entries, "new.txt")
        os.utime(root / "new.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(root / "new.txt", root / "index.txt")
    new = open_source(root, cache_dir=cache_dir)
    assert new._index_built
    assert new.index_cache == old.index_cache  # the same entry, rebuilt in place
    assert os.stat(new.index_cache).st_ino != old_inode
    assert_matches(new, oracle(root, entries))
    assert_matches(old, oracle(root, entries_for(1)))  # the old mapping is still valid for the old source


@pytest.mark.parametrize("damage", ["flip-columns", "flip-header", "truncate", "empty", "garbage"])
def test_corrupt_cache_is_rebuilt_with_the_same_results(data, tmp_path, damage):
    root, entries = data
    cache_dir = tmp_path / "cache"
    path = Path(open_source(root, cache_dir=cache_dir).index_cache)
    good = path.read_bytes()
    if damage == "flip-columns":
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0x40  # inside the feature/label/key columns
        path.write_bytes(bytes(bad))
    elif damage == "flip-header":
        bad = bytearray(good)
        bad[40] ^= 1  # the source count
        path.write_bytes(bytes(bad))
    elif damage == "truncate":
        path.write_bytes(good[: len(good) - 100])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(os.urandom(len(good)))
    src = open_source(root, cache_dir=cache_dir)
    assert src._index_built
    assert_matches(src, oracle(root, entries))
    assert path.read_bytes() == good


def test_unwritable_cache_dir_warns_and_works(data, tmp_path, caplog):
    root, entries = data
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, so no folder can be made under it")
    with caplog.at_level(logging.WARNING, logger="npyfeed"):
        src = open_source(root, cache_dir=blocker / "cache")
    assert src.index_cache is None
    assert any("cannot use the index cache" in r.getMessage() for r in caplog.records)
    assert_matches(src, oracle(root, entries))


def test_read_only_cache_dir(data):
    """As an unprivileged user (a child that drops root, when the tests run as root), a cache folder it cannot
    write: a warning, no cache, and the same samples as without one."""
    root, _ = data
    with shared_dir() as shared:
        copy = shared / "data"
        shutil.copytree(root, copy)
        for path in [copy, *copy.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o444)
        cache_dir = shared / "ro"
        cache_dir.mkdir()
        cache_dir.chmod(0o555)
        proc = run_unprivileged("""
            import logging
            from pathlib import Path
            root, cache_dir = Path(sys.argv[1]), sys.argv[2]
            messages = []
            handler = logging.Handler()
            handler.emit = lambda record: messages.append(record.getMessage())
            logging.getLogger("npyfeed").addHandler(handler)
            args = (root / "index.txt", root / "factor", root / "label", 4)
            src = npyfeed.WindowSource(*args, cache_dir=cache_dir)
            plain = npyfeed.WindowSource(*args, cache=False)
            ids = np.arange(len(src))
            same = all(np.array_equal(a, b) for a, b in zip(src.get(ids), plain.get(ids)))
            print(src.index_cache is None, any("index cache" in m for m in messages), same, os.listdir(cache_dir))
        """, copy, cache_dir, imports="import numpy as np, npyfeed\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "True True True []", proc.stdout


def test_processes_opening_together_build_once(data, tmp_path):
    root, entries = data
    cache_dir = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import json, sys, zlib
        import numpy as np, npyfeed
        sys.stdin.readline()  # all start together
        src = npyfeed.WindowSource({str(root / "index.txt")!r}, {str(root / "factor")!r}, {str(root / "label")!r},
                                   {WINDOW}, threads=1, cache_dir={str(cache_dir)!r})
        x, y = src.get(np.arange(len(src)))
        print(json.dumps({{"built": src._index_built, "cache": src.index_cache,
                          "crc": zlib.crc32(x.tobytes() + y.tobytes())}}))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(6)]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    x, y = oracle(root, entries)
    expected = __import__("zlib").crc32(x.tobytes() + y.tobytes())
    assert [r["crc"] for r in results] == [expected] * len(procs)
    assert sum(r["built"] for r in results) == 1
    assert len({r["cache"] for r in results}) == 1
    assert cache_files(cache_dir) == [Path(results[0]["cache"])]
    assert sorted(cache_dir.iterdir()) == cache_files(cache_dir)  # no temporary file and no lock file left


def test_the_cache_folder_holds_one_file_per_entry(data, tmp_path):
    """Opens of many index files, some of which fail (a malformed line, a window outside its key), leave the
    entries of those that opened and nothing else: no lock file per entry, none for a failed open."""
    root, _ = data
    cache_dir = tmp_path / "cache"
    opened = 0
    for n in range(12):
        entries = entries_for(100 + n, 50)
        path = write_index(root, entries, f"index-{n}.txt")
        if n % 3 == 1:
            path.write_text(path.read_text() + "1,x,a\n")  # malformed
        elif n % 3 == 2:
            path.write_text(path.read_text() + f"{ROWS + 3},0,a\n")  # outside key a
        for _ in range(2):  # built, then found
            try:
                src = npyfeed.WindowSource(path, root / "factor", root / "label", WINDOW, threads=1,
                                           cache_dir=cache_dir)
            except (ValueError, IndexError):
                assert n % 3 != 0
                continue
            assert_matches(src, oracle(root, entries))
            opened += 1
    assert opened == 2 * 4
    # The window outside its key fails after the index compiled: its entry stays, for the next open.
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted(p.name for p in cache_files(cache_dir))
    assert len(cache_files(cache_dir)) == 4 + 4


def test_a_lock_file_nobody_holds_is_removed_by_the_next_open(data, tmp_path):
    """Left by an older npyfeed (one per entry) or a process killed while holding it; one in use stays."""
    import fcntl

    root, entries = data
    cache_dir = tmp_path / "cache"
    entry = Path(open_source(root, cache_dir=cache_dir).index_cache)
    lock = Path(str(entry) + ".lock")
    lock.write_text("")
    src = open_source(root, cache_dir=cache_dir)
    assert not src._index_built and not lock.exists()
    assert_matches(src, oracle(root, entries))
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert_matches(open_source(root, cache_dir=cache_dir), oracle(root, entries))
        assert lock.exists()
    finally:
        os.close(fd)


@pytest.mark.parametrize("cache", [True, False])
def test_malformed_line_names_file_and_line(data, tmp_path, cache):
    root, _ = data
    lines = [f"{f},{l},{k}" for f, l, k in entries_for(3, 250000)]  # 2 MB: several parse chunks of 1 MiB
    lines[241234] = "7,oops,a"
    (root / "index.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"index\.txt:241235: label_index is not an integer \(line: '7,oops,a'\)"):
        open_source(root, cache=cache, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir()) if (tmp_path / "cache").exists() else True  # no lock file either


@pytest.mark.parametrize("cache", [True, False])
def test_describe_skip_and_errors_name_lines(data, tmp_path, cache):
    root, _ = data
    entries = entries_for(4, 40000)
    entries[30001] = (ROWS + 5, 0, "b")  # outside factor b
    text = "".join(("\n" if i % 1000 == 0 else "") + f"{f},{l},{k}\n" for i, (f, l, k) in enumerate(entries))
    (root / "index.txt").write_text(text)
    line_of = {}
    line = 0
    for i in range(len(entries)):
        line += 2 if i % 1000 == 0 else 1
        line_of[i] = line
    with pytest.raises(IndexError, match=rf"index\.txt:{line_of[30001]}: key 'b': window rows \[42, 46\)"):
        open_source(root, cache=cache, cache_dir=tmp_path / "cache")
    src = open_source(root, cache=cache, cache_dir=tmp_path / "cache", bounds="skip")
    kept = [e for i, e in enumerate(entries) if i != 30001]
    assert src.skipped == 1 and len(src) == len(kept)
    assert_matches(src, oracle(root, kept))
    for sample in (0, 1, 30000, 30001, len(kept) - 1):
        i = sample if sample < 30001 else sample + 1
        f, l, k = entries[i]
        assert src.describe(sample) == (f"{root / 'index.txt'}:{line_of[i]}: key '{k}', feature_index {f}, "
                                        f"label_index {l}")


def test_from_arrays_with_index_files_uses_the_cache(data, tmp_path):
    root, entries = data
    factors = {k: np.load(root / "factor" / f"{k}.npy") for k in KEYS}
    labels = {k: np.load(root / "label" / f"{k}.npy") for k in KEYS}
    first = npyfeed.WindowSource.from_arrays(root / "index.txt", factors, labels, WINDOW, cache_dir=tmp_path / "c")
    second = npyfeed.WindowSource.from_arrays(root / "index.txt", factors, labels, WINDOW, cache_dir=tmp_path / "c")
    assert first._index_built and not second._index_built
    assert_matches(second, oracle(root, entries))
    listed = npyfeed.WindowSource.from_arrays(entries, factors, labels, WINDOW)
    assert listed.index_cache is None
    assert_matches(listed, oracle(root, entries))
