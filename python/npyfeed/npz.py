"""`.npz` archives (``np.savez`` / ``np.savez_compressed``): whole-archive loads and the key rule.

An archive is recognised by its name ending in ``.npz``. Its members are read by the C++ core (``npz.cpp``):
stored members are viewed in place (``mode="mmap"``, when aligned for their dtype) or read; deflated members
are inflated with zlib, every member of every archive in parallel on the thread pool with the GIL released.
"""

from __future__ import annotations

from . import _core

#: The name ``np.savez(path, array)`` gives an array passed without a keyword.
POSITIONAL_NAME = "arr_0"


def is_npz(path: str) -> bool:
    """Whether `path` names a ``.npz`` archive (by its suffix, as the users' files are named)."""
    return path.endswith(".npz")


def load_archives(native_paths: list, mode: str, threads: int, max_header_size: int, populate: bool,
                  **placement) -> list:
    """One ``{key: array}`` dict per archive, in directory order; `mode` already resolved ("mmap"/"read"/"direct"),
    `placement` that of `_resources.resolve_placement` (the pool the members are read and inflated on)."""
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
