"""What a `WindowSource` reads, found and turned into the core's objects: index files and the compiled index
cache, an index given as ``(feature_index, label_index, key)`` tuples, the keys of a dense source, each key's
files or arrays, and the arguments every constructor shares (`window`, `dtype`, `bounds`).

Only what the core cannot say is checked here (types, keys that cannot name a file, keys without arrays); the
values are checked once, by the C++ WindowSource.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
from collections.abc import Sequence

import numpy as np

from . import _checks, _core
from ._resources import cache_dir as _default_cache_dir
from .loading import _fspath, _native

log = logging.getLogger("npyfeed")

#: Policies for windows or label rows outside their arrays.
BOUNDS = ("error", "skip", "pad")
#: Policies for keys without a factor or label file.
MISSING = ("error", "skip")


# -- the arguments every constructor shares ---------------------------------------------------------------
def check_common(window, dtype, bounds) -> tuple:
    """`window` as an int and `dtype` as a numpy dtype, `bounds` checked to be a string."""
    # Only what the core cannot say: the types. The values (window >= 1, float32/float64, the bounds
    # policy) are checked once, by the C++ WindowSource, and raise ValueError from there.
    if not _checks.is_int(window):
        raise _checks.ArgumentTypeError(f"window must be a positive integer, got {window!r}")
    if not isinstance(bounds, str):
        raise _checks.ArgumentTypeError(f"bounds must be one of {BOUNDS}, got {bounds!r}")
    return int(window), np.dtype(dtype)


def dtype_name(dtype: np.dtype) -> str:
    """The output dtype as the core takes it."""
    # "float32"/"float64" for native dtypes; anything else by its full text (">f4"), which the core refuses.
    return dtype.name if dtype.isnative else dtype.str


# -- the index ----------------------------------------------------------------------------------------------
def index_paths(index_files) -> list:
    """One index file or several, as a non-empty list of paths. A path that names no file but holds a glob pattern
    (``*``, ``?``, ``[``) is replaced by the files it matches, sorted; one that matches none raises
    ``FileNotFoundError`` naming the pattern."""
    if isinstance(index_files, (str, bytes, os.PathLike)):
        index_files = [index_files]
    paths = []
    for path in map(_fspath, index_files):
        if os.path.lexists(path) or not glob.has_magic(path):
            paths.append(path)  # a name that exists is never a pattern, whatever its characters
            continue
        matched = sorted(p for p in glob.glob(path) if not os.path.isdir(p))
        if not matched:
            raise FileNotFoundError(errno.ENOENT, "index_files: the pattern matches no file", path)
        paths += matched
    if not paths:
        raise ValueError("no index files given")
    return paths


def load_index(index_files, cache: bool, cache_dir, threads: int):
    """The compiled index of `index_files` (through the cache unless `cache` is false), the cache file used (or
    None) and whether this call compiled the index files."""
    paths = [_native(p) for p in index_paths(index_files)]
    _checks.boolean(cache, "cache")
    if not cache:
        folder = ""
    else:
        folder = _native(_fspath(cache_dir) if cache_dir is not None else str(_default_cache_dir()))
    index, cache_path, built, warning = _core.load_index(paths, folder, threads)
    if warning:
        log.warning("npyfeed: %s", warning)
    return index, cache_path, built


def index_from_tuples(index) -> object:
    """The core index of a sequence of ``(feature_index, label_index, key)`` tuples (never cached)."""
    rows = list(index)
    if not rows:
        raise ValueError("the index is empty")
    try:
        features, labels, keys = zip(*rows)
    except (TypeError, ValueError):
        raise ValueError("index entries must be (feature_index, label_index, key) tuples") from None
    feature_arr = np.asarray(features)
    label_arr = np.asarray(labels)
    for name, arr in (("feature_index", feature_arr), ("label_index", label_arr)):
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} values must be integers")
    keys = [str(k) for k in keys]
    for k in set(keys):
        if not _is_utf8(k):
            raise ValueError(f"index entry {keys.index(k)}: key {k!r} is not UTF-8 text")
    return _core.index_from_columns(feature_arr.astype(np.int64), label_arr.astype(np.int64), keys, "<index list>")


def open_index(index, cache: bool, cache_dir, threads: int):
    """`WindowSource.from_arrays`'s `index`: index files (as `load_index`) or a sequence of tuples (never cached),
    as (core index, cache file or None, whether this call compiled the index files)."""
    if isinstance(index, (str, bytes, os.PathLike)) or (
            isinstance(index, Sequence) and index and isinstance(index[0], (str, bytes, os.PathLike))):
        return load_index(index, cache, cache_dir, threads)
    return index_from_tuples(index), None, False


def check_folders(factor_dir, label_dir) -> tuple:
    """The two folders as paths; ``FileNotFoundError`` (or ``NotADirectoryError``) names one that is not a folder,
    rather than every key's files as missing."""
    folders = _fspath(factor_dir), _fspath(label_dir)
    for what, folder in zip(("factor_dir", "label_dir"), folders):
        if not os.path.isdir(folder):
            if os.path.exists(folder):
                raise NotADirectoryError(errno.ENOTDIR, f"{what} is not a folder", folder)
            raise FileNotFoundError(errno.ENOENT, f"{what} does not exist (no key can have a file)", folder)
    return folders


# -- the keys of a dense source ------------------------------------------------------------------------------
def dense_keys(factor_dir: str, label_dir: str) -> list:
    """Keys with a factor file (`.npy` or `.npz`) in `factor_dir` and a label file in `label_dir`, sorted."""
    try:
        names = os.listdir(factor_dir)
    except OSError as e:
        raise type(e)(e.errno, f"WindowSource.dense: cannot list the factor folder: {e.strerror}", factor_dir) from None
    stems = sorted({n[:-4] for n in names if n.endswith((".npy", ".npz")) and len(n) > 4})
    keys = [k for k in stems if os.path.isfile(os.path.join(factor_dir, k + ".npy"))
            or os.path.isfile(os.path.join(factor_dir, k + ".npz"))]
    keys = [k for k in keys if os.path.exists(os.path.join(label_dir, k + ".npy"))
            or os.path.exists(os.path.join(label_dir, k + ".npz"))]
    if not keys:
        raise ValueError(f"WindowSource.dense: no key has a factor file in {factor_dir} (<key>.npy or <key>.npz) "
                         f"and a label file in {label_dir}")
    for k in keys:
        if not _is_utf8(k):
            raise ValueError(f"WindowSource.dense: {os.path.join(factor_dir, k)!r}.npy/.npz: the file name is not "
                             "UTF-8 text, and keys are: rename it, or pass keys= without it")
    return keys


def _is_utf8(key: str) -> bool:
    """Whether `key` is UTF-8 text (a file name that is not comes from os.listdir with surrogate escapes)."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_keys(keys) -> list:
    """The keys a user names for a dense source: distinct strings that each name a file."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (Sequence, np.ndarray)):
        raise _checks.ArgumentTypeError(f"keys must be a sequence of key names, got {keys!r}")
    out, seen = [], set()
    for k in keys:
        if not isinstance(k, str):
            raise _checks.ArgumentTypeError(f"keys must be strings, got {k!r}")
        if not k or k in (".", "..") or "/" in k or "\0" in k or (os.sep != "/" and os.sep in k):
            raise ValueError(f"keys: {k!r} cannot name a file")
        if not _is_utf8(k):
            raise ValueError(f"keys: {k!r} is not UTF-8 text")
        if k in seen:
            raise ValueError(f"keys: {k!r} is given twice")
        seen.add(k)
        out.append(k)
    if not out:
        raise ValueError("keys: no key given")
    return out


# -- each key's files or arrays -------------------------------------------------------------------------------
def key_files(folder: str, keys) -> list:
    """``<folder>/<k>.npy`` for each key (the core falls back to ``<k>.npz`` where there is no such file)."""
    return [os.path.join(folder, k + ".npy") for k in keys]


def files_read(paths) -> tuple:
    """The files a source opened over `paths` reads: ``<k>.npz`` where it fell back to it (one stat each, after
    a successful open)."""
    return tuple(p if os.path.exists(p) else p[:-4] + ".npz" for p in paths)


def key_arrays(keys, factors, labels) -> tuple:
    """([factor array], [label array]) of `keys`, C-contiguous (a copy only where an array is not); a
    ``KeyError`` names the keys without one."""
    missing = [k for k in keys if k not in factors or k not in labels]
    if missing:
        shown = ", ".join(repr(k) for k in missing[:5])
        raise KeyError(f"{len(missing)} of {len(keys)} keys have no factor or label array: {shown}"
                       + (", ..." if len(missing) > 5 else ""))
    return [np.ascontiguousarray(factors[k]) for k in keys], [np.ascontiguousarray(labels[k]) for k in keys]
