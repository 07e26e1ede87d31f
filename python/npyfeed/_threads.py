"""How many threads a call uses: argument, else NPYFEED_THREADS, else the CPUs we may run on."""

from __future__ import annotations

import os


def resolve_threads(threads: int | None) -> int:
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise TypeError(f"threads must be an int or None, not {type(threads).__name__}")
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        return threads
    env = os.environ.get("NPYFEED_THREADS", "").strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            raise ValueError(f"NPYFEED_THREADS must be a positive integer, got {env!r}") from None
        if value < 1:
            raise ValueError(f"NPYFEED_THREADS must be a positive integer, got {env!r}")
        return value
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
