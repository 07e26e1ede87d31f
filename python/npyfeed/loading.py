"""Whole-file loads: `read_header`, `load`, `load_many` and the drop-in `load_factor_files`."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import _core, npz
from ._checks import ArgumentTypeError
from ._resources import MAX_HEADER_SIZE, resolve_placement, resolve_threads

__all__ = ["Header", "read_header", "load", "load_many", "load_factor_files", "MODES"]

log = logging.getLogger("npyfeed")

#: The read modes. "auto" means "read" for whole-file loads and "mmap" for `WindowSource` (docs/modes.md).
MODES = ("auto", "mmap", "read", "direct")

PathLike = "str | os.PathLike[str]"


@dataclass(frozen=True)
class Header:
    """A parsed `.npy` header.

    Attributes
    ----------
    shape : tuple of int
    dtype : numpy.dtype
        Exactly the dtype ``np.load`` would return (byte order included).
    fortran_order : bool
    version : tuple of int
        Format version, ``(1, 0)``, ``(2, 0)`` or ``(3, 0)``.
    data_offset : int
        Byte offset of the array data in the file.
    nbytes : int
        Bytes of array data (``prod(shape) * itemsize``).
    file_size : int
        Size of the file in bytes (at least ``data_offset + nbytes``).
    """

    shape: tuple
    dtype: np.dtype
    fortran_order: bool
    version: tuple
    data_offset: int
    nbytes: int
    file_size: int


def _fspath(path) -> str:
    try:
        path = os.fspath(path)
    except TypeError:
        raise ArgumentTypeError(f"expected a path, got {type(path).__name__}") from None
    return os.fsdecode(path) if isinstance(path, bytes) else path


def _path_list(paths, name: str) -> list:
    """`paths`, an iterable of paths, as a list of str; one path where several are expected (its characters would
    be taken for paths) or an item that is not a path raise `ArgumentTypeError` naming the argument."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        path = os.fsdecode(paths)
        files = os.path.join(path if os.path.isdir(path) else "<folder>", "*.npy")
        raise ArgumentTypeError(f"{name} must be a sequence of paths, got the single path {path!r}: pass [path], "
                                f"or a folder's files as sorted(glob.glob({files!r}))")
    try:
        items = list(paths)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be a sequence of paths, got {paths!r}") from None
    try:
        return [_fspath(p) for p in items]
    except TypeError as e:
        raise ArgumentTypeError(f"{name}: {e}") from None


def _native(path: str) -> bytes:
    """The path as the OS sees it: bytes, so names that are not valid utf-8 reach the C++ core intact."""
    return os.fsencode(path)


def _resolve_mode(mode: str, auto: str) -> str:
    """The one check of `mode` (the core checks it again only as a library); "auto" becomes `auto`."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return auto if mode == "auto" else mode


def read_header(path, *, member: str | None = None, max_header_size: int = MAX_HEADER_SIZE) -> Header:
    """Read and validate the header of a `.npy` file, or of one array of a `.npz` archive, without reading its
    data.

    Parameters
    ----------
    path : str or os.PathLike
        A `.npy` file, or a `.npz` archive (by its name; its directory and every member's header are checked).
    member : str, optional
        An archive's member to describe, by its name without ``.npy`` (as `WindowSource`'s ``member=``);
        default: the archive's only array. A member's ``data_offset`` and ``file_size`` are within its `.npy`
        bytes (its uncompressed size), not within the archive.
    max_header_size : int
        Largest header text accepted, as in ``np.load`` (default 10000).

    Returns
    -------
    Header

    Raises
    ------
    NpyFormatError
        The file is not a valid `.npy` file (or `.npz` archive), or is shorter than its header promises.
    ValueError
        An archive holding several arrays without `member`, a `member` it does not hold (its members named), or
        a `member` for a `.npy` file.
    OSError
        The file cannot be opened or read (``FileNotFoundError``, ``IsADirectoryError``, ...).
    """
    path = _fspath(path)
    if not npz.is_npz(path):
        if member is not None:
            raise ValueError(f"{path}: member={member!r} names an array of a .npz archive, and this is a .npy file")
        return Header(**_core.read_header(_native(path), max_header_size))
    headers = {key: header for key, header, *_ in _core.read_npz_headers(_native(path), max_header_size)}
    if member is None and len(headers) != 1:
        raise ValueError(f"{path}: the archive holds {len(headers)} arrays; name the one to read (member=)")
    if member is not None and member not in headers:
        raise ValueError(f"{path}: no member {member!r} in the archive (it holds {', '.join(map(repr, headers))})")
    return Header(**(headers[member] if member is not None else next(iter(headers.values()))))


def load(path, *, mode: str = "auto", threads: int | None = None, populate: bool = False,
         max_header_size: int = MAX_HEADER_SIZE, cpus=None, nice: int | None = None, io_priority=None):
    """Load one `.npy` file, or every array of a `.npz` archive; equal to ``np.load(path)``.

    Parameters
    ----------
    path : str or os.PathLike
        A `.npy` file, or a `.npz` archive (by its name): then the result is a dict ``{member: array}``
        equal to ``dict(np.load(path))``, every member loaded now (in parallel).
    mode : {"auto", "mmap", "read", "direct"}
        How to read it (docs/modes.md). ``"auto"`` (the default) is ``"read"``: an owned, writable array like
        ``np.load``'s. ``"mmap"`` returns a read-only zero-copy view (for `.npz`: of stored members whose data is
        aligned for their dtype; other members are read-only copies).
    threads : int, optional
        Threads for a large file (default: ``NPYFEED_THREADS`` or the CPUs this process may use).
    populate : bool
        With ``mode="mmap"``, fault every page in now (in parallel) instead of on first touch.
    max_header_size : int
        Largest header text accepted (default 10000, as numpy).
    cpus, nice, io_priority
        Where npyfeed's threads for this load run; see `load_many`.

    Raises
    ------
    NpyFormatError, OSError
    """
    return load_many([path], mode=mode, threads=threads, populate=populate, max_header_size=max_header_size,
                     cpus=cpus, nice=nice, io_priority=io_priority)[0]


def load_many(paths: Iterable, *, mode: str = "auto", threads: int | None = None, progress: bool = False,
              populate: bool = False, max_header_size: int = MAX_HEADER_SIZE, cpus=None, nice: int | None = None,
              io_priority=None) -> list:
    """Load many `.npy` files (and `.npz` archives) in parallel with the GIL released.

    Parameters
    ----------
    paths : iterable of str or os.PathLike
        The files (a single path is refused: see Raises).
    mode : {"auto", "mmap", "read", "direct"}
        As in `load`; ``"auto"`` (the default) is ``"read"``.
    threads : int, optional
        Default: ``NPYFEED_THREADS``, else one per CPU in `cpus`, else the CPUs this process may use.
    progress : bool
        Show a tqdm progress bar in bytes.
    populate : bool
        With ``mode="mmap"``, fault all pages in now, in parallel.
    max_header_size : int
    cpus : iterable of int, optional
        CPUs npyfeed's own threads for this call run on (their affinity); the caller's threads and other
        calls' threads are never changed. Default: wherever the thread that started them may run.
    nice : int, optional
        Niceness of those threads, -20 to 19 (lower than the process's needs privileges).
    io_priority : {"idle", "best-effort", "realtime"} or (class, level), optional
        Linux IO priority of those threads: a class, or a class and a level from 0 (highest) to 7 (default
        4). ``"idle"`` reads only when no one else uses the disk; ``"realtime"`` needs privileges.

    Returns
    -------
    list
        In the order of `paths`: a numpy.ndarray per `.npy` file, a dict ``{member: array}`` per `.npz` archive.

    Raises
    ------
    NpyFormatError, OSError
        For the first file that fails; the message names it. Nothing is returned then.
    TypeError
        `paths` is a single path (a ``str``, ``bytes`` or ``os.PathLike``) rather than a sequence of them, or an
        item is not a path; the message names the argument (the error is also a ``ValueError``).
    ValueError
        Bad arguments, e.g. `cpus` this process cannot use (offline, or outside its cpuset).
    PermissionError
        A `nice` or `io_priority` that needs privileges this process lacks.
    """
    paths = _path_list(paths, "paths")
    core_mode = _resolve_mode(mode, auto="read")
    placement = resolve_placement(cpus, nice, io_priority)
    nthreads = resolve_threads(threads, placement.get("cpus"))
    archives = [p for p in paths if npz.is_npz(p)]
    files = [p for p in paths if not npz.is_npz(p)]
    bar = _progress_bar(progress, len(files))
    try:
        results = _core.load_many([_native(p) for p in files], core_mode, nthreads, max_header_size, populate,
                                  bar.update_to if bar is not None else None, **placement) if files else []
    finally:
        if bar is not None:
            bar.close()
    loaded = iter(npz.load_archives([_native(p) for p in archives], core_mode, nthreads, max_header_size, populate,
                                    **placement) if archives else [])
    results = iter(results)
    arrays = []
    for path in paths:
        if npz.is_npz(path):
            arrays.append(next(loaded))
            continue
        array, fell_back = next(results)
        if fell_back:
            log.warning("npyfeed: O_DIRECT refused for %s; used buffered reads instead", path)
        arrays.append(array)
    return arrays


def _default_key(path: str) -> str:
    name = os.path.basename(path)
    return name[:-4] if name.endswith((".npy", ".npz")) else name


def load_factor_files(in_files: Sequence, store_dict: MutableMapping | None = None, *,
                      key: Callable[[str], object] | None = None, mode: str = "auto",
                      threads: int | None = None, progress: bool = False, populate: bool = False,
                      max_header_size: int = MAX_HEADER_SIZE, cpus=None, nice: int | None = None,
                      io_priority=None) -> MutableMapping:
    """Drop-in for the users' ``load_factor_files(in_files, store_dict)``, in parallel.

    Fills ``store_dict[key(path)] = array`` for every `.npy` file and returns `store_dict`. A `.npz` archive
    gives ``store_dict[member] = array`` for each of its members, except an archive holding one array saved
    without a name (``np.savez(path, array)``, member ``arr_0``), which is filled as a `.npy` file would be:
    ``store_dict[key(path)]``, by default the file name without ``.npz``.

    Parameters
    ----------
    in_files : sequence of str or os.PathLike
        The files, e.g. ``sorted(glob.glob(f"{folder}/*.npy"))``; a folder or a single path is refused.
    store_dict : mutable mapping, optional
        Filled in place (a new dict if None).
    key : callable, optional
        Maps a path to its key; default: the file name without ``.npy`` (or ``.npz``).
    mode, threads, progress, populate, max_header_size, cpus, nice, io_priority
        As in `load_many`. ``mode="mmap"`` shares one copy of the data between all processes.

    Raises
    ------
    NpyFormatError, OSError
        Naming the failing file. `store_dict` is then left exactly as it was.
    TypeError
        `in_files` is a single path (a folder's name, say) rather than a sequence of paths, or an item is not a
        path: the message names `in_files` (the error is also a ``ValueError``).
    ValueError
        Two files (or members of two files) map to the same key; the message names both. One file listed twice
        (under any of its names) is loaded as once.
    """
    if store_dict is None:
        store_dict = {}
    paths = _path_list(in_files, "in_files")
    key_of = key or _default_key
    seen: dict = {}  # key -> (where it comes from, the file)

    def claim(k, source: str, path: str) -> None:
        if k in seen and not _same_file(seen[k][1], path):  # one file listed twice gives the same arrays
            raise ValueError(f"two files map to the key {k!r}: {seen[k][0]} and {source}")
        seen[k] = (source, path)

    for p in paths:
        if not npz.is_npz(p):
            claim(key_of(p), p, p)
    arrays = load_many(paths, mode=mode, threads=threads, progress=progress, populate=populate,
                       max_header_size=max_header_size, cpus=cpus, nice=nice, io_priority=io_priority)
    filled = []
    for p, array in zip(paths, arrays):
        if npz.is_npz(p):
            for k, member in npz.store_keys(p, array, key_of):
                claim(k, p if k != member else f"{p} (member {member!r})", p)
                filled.append((k, array[member]))
        else:
            filled.append((key_of(p), array))
    store_dict.update(filled)  # only after every file loaded: no half-filled dict
    return store_dict


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class _BytesBar:
    def __init__(self, tqdm_cls, files: int):
        self._bar = tqdm_cls(total=0, unit="B", unit_scale=True, unit_divisor=1024, desc=f"npyfeed {files} files")

    def update_to(self, done: int, total: int) -> None:
        if self._bar.total != total:
            self._bar.total = total
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        self._bar.close()


def _progress_bar(progress: bool, files: int):
    if not progress:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        raise ImportError("progress=True needs tqdm: pip install 'npyfeed[progress]'") from None
    return _BytesBar(tqdm, files)
