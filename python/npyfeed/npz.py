"""`.npz` archives (``np.savez`` / ``np.savez_compressed``): whole-archive loads and the key rule.

An archive is recognised by its name ending in ``.npz``. Its members are read by the C++ core (``npz.cpp``):
stored members are viewed in place (``mode="mmap"``, when aligned for their dtype) or read; deflated members
are inflated with zlib, every member of every archive in parallel on the thread pool with the GIL released.
"""

from __future__ import annotations

import os

from . import _core

#: The name ``np.savez(path, array)`` gives an array passed without a keyword.
POSITIONAL_NAME = "arr_0"


def is_npz(path: str) -> bool:
    """Whether `path` names a ``.npz`` archive (by its suffix, as the users' files are named)."""
    return path.endswith(".npz")


def archive_stem(path: str) -> str:
    """The file name without ``.npz``."""
    name = os.path.basename(path)
    return name[:-4] if name.endswith(".npz") else name


def load_archives(native_paths: list, mode: str, threads: int, max_header_size: int, populate: bool,
                  **placement) -> list:
    """One ``{key: array}`` dict per archive, in directory order; `mode` already resolved ("mmap"/"read"/"direct"),
    `placement` that of `_threads.resolve_placement` (the pool the members are read and inflated on)."""
    loaded = _core.load_npz_many(native_paths, mode, threads, max_header_size, populate, **placement)
    return [dict(members) for members in loaded]


def store_keys(path: str, members: dict, key_of) -> list:
    """``[(store key, member key)]``: the key rule of `load_factor_files` for one archive.

    Each member becomes ``store_dict[member]``, except in an archive holding one array saved without a name
    (``np.savez(path, array)``: the member ``arr_0``), which becomes ``store_dict[key(path)]`` like a ``.npy`` file.
    """
    if list(members) == [POSITIONAL_NAME]:
        return [(key_of(path), POSITIONAL_NAME)]
    return [(name, name) for name in members]


def member_of(path: str, member: str | None, max_header_size: int = 10000) -> str:
    """The one member a `WindowSource` reads from `path`: `member`, or the archive's only one."""
    entries = _core.read_npz_headers(os.fsencode(path), max_header_size)
    keys = [key for key, *_ in entries]
    if member is not None:
        if member not in keys:
            raise KeyError(f"{path}: no member {member!r} in the archive (it holds {keys})")
        return member
    if len(keys) != 1:
        raise ValueError(f"{path}: the archive holds {len(keys)} arrays ({keys}); name one with member=")
    return keys[0]
