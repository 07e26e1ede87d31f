"""What npyfeed takes from this machine, resolved in one place: how many threads a call uses (argument, else
NPYFEED_THREADS, else the CPUs given as ``cpus=``, else the CPUs we may run on), where they run (``cpus=``,
``nice=``, ``io_priority=``: the placement of npyfeed's own pool threads, checked by the core), the cache folder,
the memory available (cgroup-aware), and the largest ``.npy`` header accepted."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ._checks import ArgumentTypeError

#: The largest ``.npy`` header text accepted by default, as numpy's ``np.load``.
MAX_HEADER_SIZE = 10000

#: More threads than this is a mistake (a pool thread per request would exhaust the process).
MAX_THREADS = 1024


def resolve_threads(threads: int | None, cpus: list | None = None) -> int:
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise ArgumentTypeError(f"threads must be an int or None, not {type(threads).__name__}")
        if not 1 <= threads <= MAX_THREADS:
            raise ValueError(f"threads must be between 1 and {MAX_THREADS}, got {threads}")
        return threads
    env = os.environ.get("NPYFEED_THREADS", "").strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            raise ValueError(f"NPYFEED_THREADS must be a positive integer, got {env!r}") from None
        if not 1 <= value <= MAX_THREADS:
            raise ValueError(f"NPYFEED_THREADS must be an integer between 1 and {MAX_THREADS}, got {env!r}")
        return value
    if cpus:
        return len(cpus)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


#: IO priority classes (Linux ioprio): name -> class number.
IO_CLASSES = {"realtime": 1, "best-effort": 2, "idle": 3}


def resolve_placement(cpus, nice, io_priority) -> dict:
    """The placement arguments of the core: ``cpus`` (sorted, distinct), ``nice``, ``io_priority`` (class, level).

    Only the types and names are checked here; the values (CPU numbers this process may use, the nice range,
    the level range, privileges) are checked once, by the core, when a pool for the placement is first made.
    """
    out: dict = {}
    if cpus is not None:
        if isinstance(cpus, (str, bytes)) or not hasattr(cpus, "__iter__"):
            raise ArgumentTypeError(f"cpus must be an iterable of CPU numbers, not {type(cpus).__name__}")
        numbers = list(cpus)
        if any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) for c in numbers):
            raise ArgumentTypeError(f"cpus must be CPU numbers (int), got {numbers!r}")
        if not numbers:
            raise ValueError("cpus must name at least one CPU (None: wherever the caller's threads may run)")
        out["cpus"] = sorted({int(c) for c in numbers})
    if nice is not None:
        if isinstance(nice, bool) or not isinstance(nice, (int, np.integer)):
            raise ArgumentTypeError(f"nice must be an int or None, not {type(nice).__name__}")
        out["nice"] = int(nice)
    if io_priority is not None:
        if isinstance(io_priority, str):
            name, level = io_priority, 4
        else:
            try:
                name, level = io_priority
            except (TypeError, ValueError):
                raise ArgumentTypeError(f"io_priority must be 'idle', 'best-effort', 'realtime' or (class, level), "
                                        f"got {io_priority!r}") from None
        if name not in IO_CLASSES:
            raise ValueError(f"io_priority class must be one of {tuple(IO_CLASSES)}, got {name!r}")
        if isinstance(level, bool) or not isinstance(level, (int, np.integer)):
            raise ArgumentTypeError(f"io_priority level must be an int from 0 to 7, got {level!r}")
        out["io_priority"] = (IO_CLASSES[name], int(level))
    return out


def cache_dir() -> Path:
    """npyfeed's cache folder: ``$NPYFEED_CACHE_DIR``, else ``$XDG_CACHE_HOME/npyfeed``, else ``~/.cache/npyfeed``."""
    explicit = os.environ.get("NPYFEED_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "npyfeed"


def available_memory() -> int | None:
    """Bytes of memory this process can still use: MemAvailable, or less where a cgroup (v2 or v1) limits it."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    # A cgroup limit (v2, then v1) bounds the page cache this process's data can occupy too.
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit() and int(limit) < 2**60:
            found.append(int(limit))
        break
    return min(found) if found else None


def default_npz_memory_limit() -> int:
    """Half the memory available (`available_memory`); 0 (the core's own default, half the physical memory)
    where it cannot be read."""
    available = available_memory()
    return max(available // 2, 1) if available else 0
