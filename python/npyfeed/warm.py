"""Bringing a data set into the page cache once per machine, and reporting how much of it is there.

Ten training processes over one data set in ``mode="mmap"`` share one copy of it in the page cache; ``warm``
fills that cache up front with large parallel reads (so the first epochs do not pay random cold reads), and
``warm(..., check=True)`` reports what is resident without reading. Run ``npyfeed warm DATA`` once per node,
then start the trainers: processes that call it at the same time take turns on a lock per data set, and the
later ones find the pages resident and read nothing.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import _core
from ._resources import cache_dir, resolve_threads
from .loading import _fspath, _native, _progress_bar
from .windows import WindowSource

__all__ = ["warm", "WarmReport", "DirectoryResidency"]

log = logging.getLogger("npyfeed")


@dataclass(frozen=True)
class DirectoryResidency:
    """Files of one directory: how many, their bytes, and the bytes in the page cache before and after."""

    files: int
    bytes: int
    resident_before: int
    resident_after: int


@dataclass(frozen=True)
class WarmReport:
    """What `warm` found and did.

    Attributes
    ----------
    directories : dict of str -> DirectoryResidency
        Per directory of the files (sorted by name).
    bytes, resident_before, resident_after : int
        Totals over every file.
    bytes_read : int
        Bytes this call read (0 with ``check=True`` or when everything was resident already).
    seconds : float
        Wall time, the wait for another process's warm included.
    """

    directories: dict = field(repr=False)
    bytes: int
    resident_before: int
    resident_after: int
    bytes_read: int
    seconds: float

    @property
    def files(self) -> int:
        """Files over every directory."""
        return sum(d.files for d in self.directories.values())

    def table(self) -> str:
        """A plain-text table: one line per directory and a total."""
        def row(name, d):
            return (f"{d.files:>8} {_size(d.bytes):>10} {_percent(d.resident_before, d.bytes):>8} "
                    f"{_percent(d.resident_after, d.bytes):>8}  {name}")

        lines = [f"{'files':>8} {'size':>10} {'before':>8} {'after':>8}  directory"]
        lines += [row(name, d) for name, d in self.directories.items()]
        total = DirectoryResidency(self.files, self.bytes, self.resident_before, self.resident_after)
        lines.append(row("total", total))
        rate = self.bytes_read / self.seconds / 1e9 if self.seconds > 0 else 0.0
        lines.append(f"read {_size(self.bytes_read)} in {self.seconds:.1f} s ({rate:.2f} GB/s)")
        return "\n".join(lines)


def warm(paths, *, threads: int | None = None, progress: bool = False, check: bool = False,
         pattern: str = "*.npy", lock: bool = True) -> WarmReport:
    """Bring files into the page cache (large parallel reads, GIL released) and report residency.

    Parameters
    ----------
    paths : path, sequence of paths, or WindowSource
        Files, and directories searched recursively for `pattern`; or a `WindowSource`, whose factor and label
        files are warmed.
    threads : int, optional
        Parallel reads. Default: ``NPYFEED_THREADS``, else the CPUs this process may use, but at least 8
        (reading is IO-bound: a device serves several reads at once).
    progress : bool
        Show a tqdm bar in bytes (``pip install 'npyfeed[progress]'``).
    check : bool
        Only report residency (``mincore``); read nothing.
    pattern : str
        File-name pattern for directories (``"*"`` for every file).
    lock : bool
        Take a lock per data set (a file in `cache_dir()`), so that processes warming the same files at once
        take turns and read each byte once. Where the cache folder cannot be written, a warning is logged and
        the warm goes on without a lock.

    Returns
    -------
    WarmReport

    Raises
    ------
    FileNotFoundError, OSError, NpyFormatError
        A path that does not exist, a file that cannot be read, or a path that is not a regular file.
    """
    started = time.monotonic()
    files = _files_of(paths, pattern)
    nthreads = max(8, resolve_threads(None)) if threads is None else resolve_threads(threads)
    bar = _progress_bar(progress and not check, len(files))
    native = [_native(f) for f in files]
    try:
        with _data_set_lock(files, enabled=lock and not check and bool(files)):
            sizes, bytes_read = _core.warm_files(native, nthreads, not check, bar.update_to if bar else None)
    finally:
        if bar is not None:
            bar.close()
    directories: dict = {}
    for path, (size, before, after) in zip(files, sizes):
        d = directories.setdefault(os.path.dirname(path), [0, 0, 0, 0])
        d[0] += 1
        d[1] += size
        d[2] += before
        d[3] += after
    per_dir = {name: DirectoryResidency(*directories[name]) for name in sorted(directories)}
    return WarmReport(per_dir, sum(s for s, _, _ in sizes), sum(b for _, b, _ in sizes),
                      sum(a for _, _, a in sizes), bytes_read, time.monotonic() - started)


def _files_of(paths, pattern: str) -> list:
    if isinstance(paths, WindowSource):
        return list(paths.files)
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    files = []
    for p in paths:
        p = _fspath(p)
        if os.path.isdir(p):
            files += sorted(str(f) for f in Path(p).rglob(pattern) if f.is_file())
        elif os.path.lexists(p):
            files.append(p)
        else:
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", p)
    return files


class _data_set_lock:
    """An exclusive ``flock`` on ``cache_dir()/warm-<digest of the file list>.lock`` (nothing when disabled).

    The holder removes the lock file before letting go, so none is left behind; a process that waited on the file
    it removed finds that the name no longer holds the file it locked, and locks the one the name holds now (the
    index cache's lock files work the same way: csrc/npyfeed/index/index_cache.cpp)."""

    def __init__(self, files: list, *, enabled: bool):
        self._fd = None
        if not enabled:
            return
        names = "\0".join(sorted(os.path.realpath(f) for f in files))
        digest = hashlib.sha256(names.encode("utf-8", "surrogateescape"))
        folder = cache_dir()
        self._path = folder / f"warm-{digest.hexdigest()[:24]}.lock"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self._unlocked(e)
            return
        self._open()

    def _open(self) -> None:
        try:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            self._unlocked(e)

    def _unlocked(self, e: OSError) -> None:
        self._fd = None
        log.warning("npyfeed.warm: no lock (cannot write %s: %s); processes warming at once may read twice",
                    self._path.parent, e.strerror)

    def _names_the_locked_file(self) -> bool:
        try:
            named = os.stat(self._path)
        except FileNotFoundError:
            return False
        held = os.fstat(self._fd)
        return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)

    def __enter__(self):
        while self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # released by close(), also if this process dies
            if self._names_the_locked_file():
                break
            os.close(self._fd)  # removed by the holder this one waited for: lock the file the name holds now
            self._open()
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            try:
                os.unlink(self._path)  # while still held
            except OSError:
                pass  # a folder this process may not write: the file stays, as a lock still
            os.close(self._fd)
            self._fd = None


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole else "-"
