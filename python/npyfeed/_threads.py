"""How many threads a call uses: argument, else NPYFEED_THREADS, else the CPUs we may run on."""

from __future__ import annotations

import os

#: More threads than this is a mistake (a pool thread per request would exhaust the process).
MAX_THREADS = 1024


def resolve_threads(threads: int | None) -> int:
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise TypeError(f"threads must be an int or None, not {type(threads).__name__}")
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
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
