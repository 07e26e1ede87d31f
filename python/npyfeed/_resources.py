"""What npyfeed takes from this machine, resolved in one place: the environment variables it reads (`environment`,
the one reader, and `ENVIRONMENT`, their table), how many threads a call uses (`thread_choice`: argument, else
NPYFEED_THREADS, else the CPUs given as ``cpus=``, else this process's share of the CPUs it may run on), where they
run (``cpus=``, ``nice=``, ``io_priority=``: the placement of npyfeed's own pool threads, checked by the core), the
cache folder, the memory available (cgroup-aware), and the largest ``.npy`` header accepted."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ._checks import ArgumentTypeError

#: The largest ``.npy`` header text accepted by default, as numpy's ``np.load``.
MAX_HEADER_SIZE = 10000

#: More threads than this is a mistake (a pool thread per request would exhaust the process).
MAX_THREADS = 1024


#: Every environment variable npyfeed's Python package reads (through `environment`), and what it does; the
#: C++ core reads the ``NPYFEED_*`` variables of its own switches (the table in docs/one-node.md lists both).
ENVIRONMENT = {
    "NPYFEED_THREADS": "threads of a call that gets no threads= (replaces the default share of the CPUs)",
    "NPYFEED_CACHE_DIR": "npyfeed's cache folder (compiled indexes, warm locks)",
    "XDG_CACHE_HOME": "the cache folder's parent when NPYFEED_CACHE_DIR is not set",
    "NPYFEED_TF_OPS": "0: npyfeed.tf feeds through tf.numpy_function instead of its op library",
    "TF_FORCE_GPU_ALLOW_GROWTH": "TensorFlow's own switch, read to know how much GPU memory TensorFlow takes",
    "LOCAL_WORLD_SIZE": "processes on this node (torchrun): the default threads are the CPUs divided by it",
    "SLURM_NTASKS_PER_NODE": "processes on this node (Slurm), where LOCAL_WORLD_SIZE is not set",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "processes on this node (Open MPI's mpirun), where neither of the above is set",
}

#: The variables that say how many processes share this node, in the order they are asked.
PROCESSES_PER_NODE = ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def environment(name: str) -> str | None:
    """The value of environment variable `name`, stripped (None when unset or empty): the one place npyfeed's
    Python code reads the environment. `name` must be listed in `ENVIRONMENT`."""
    if name not in ENVIRONMENT:
        raise KeyError(f"{name} is not in npyfeed's table of environment variables")
    value = os.environ.get(name, "").strip()
    return value or None


def settings() -> dict:
    """Every environment variable npyfeed reads, with what it does and its value now.

    Returns
    -------
    dict
        ``{name: {"value": str or None, "meaning": str, "read_by": "python" or "core"}}``: the Python package's
        variables (read through one function, `environment`) and then the C++ core's (read by one unit,
        ``csrc/npyfeed/common/settings.hpp``). ``value`` is None where the variable is unset or empty. Nothing else
        in npyfeed reads the environment; the table in the docs ("Environment variables") lists the same.
    """
    from . import _core

    table = {name: {"value": environment(name), "meaning": meaning, "read_by": "python"}
             for name, meaning in ENVIRONMENT.items()}
    for name, meaning in _core.core_settings():
        table[name] = {"value": os.environ.get(name) or None, "meaning": meaning, "read_by": "core"}
    return table


def processes_per_node() -> tuple:
    """(processes sharing this node, the variable that said so), or (1, None) where no launcher says. A value
    that is not a positive integer is ignored (Slurm writes ``2(x3)`` for uneven nodes: the first number counts)."""
    for name in PROCESSES_PER_NODE:
        value = environment(name)
        if value is None:
            continue
        digits = value.split("(", 1)[0].split(",", 1)[0].strip()
        if digits.isdigit() and int(digits) >= 1:
            return int(digits), name
    return 1, None


def node_cpus() -> tuple:
    """(the CPUs this process may run on, the CPUs of the machine)."""
    try:
        mine = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        mine = os.cpu_count() or 1
    return max(1, mine), max(1, os.cpu_count() or 1, mine)


def thread_choice(threads: int | None, cpus: list | None = None) -> tuple:
    """(threads, why): `threads` if given, else ``NPYFEED_THREADS``, else one per CPU of `cpus`, else this
    process's share of the CPUs it may run on. The share: where a launcher says that P processes share the node
    (`PROCESSES_PER_NODE`) and their affinities could not all be disjoint (P x the CPUs this process may use is
    more than the machine's CPUs), the CPUs divided by P (at least 1); else all of them (a launcher that pinned
    each process to its own slice has divided the node already)."""
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise ArgumentTypeError(f"threads must be an int or None, not {type(threads).__name__}")
        if not 1 <= threads <= MAX_THREADS:
            raise ValueError(f"threads must be between 1 and {MAX_THREADS}, got {threads}")
        return threads, "threads="
    env = environment("NPYFEED_THREADS")
    if env is not None:
        try:
            value = int(env)
        except ValueError:
            raise ValueError(f"NPYFEED_THREADS must be a positive integer, got {env!r}") from None
        if not 1 <= value <= MAX_THREADS:
            raise ValueError(f"NPYFEED_THREADS must be an integer between 1 and {MAX_THREADS}, got {env!r}")
        return value, "NPYFEED_THREADS"
    if cpus:
        return len(cpus), "one per CPU of cpus="
    mine, machine = node_cpus()
    processes, said_by = processes_per_node()
    if processes > 1 and processes * mine > machine:
        share = max(1, mine // processes)
        return share, f"{mine} CPUs this process may use, shared by {processes} processes ({said_by}={processes})"
    why = f"the {mine} CPUs this process may use"
    if processes > 1:
        why += f" (its own slice: {processes} processes by {said_by}, {machine} CPUs)"
    return mine, why


def resolve_threads(threads: int | None, cpus: list | None = None) -> int:
    """The threads of a call: `thread_choice` without the reason."""
    return thread_choice(threads, cpus)[0]


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
    explicit = environment("NPYFEED_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = environment("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
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
