"""Where the time goes on this machine, for these files: ``npyfeed bench`` and `run`.

On the user's own index, factor and label files, read-only, one run measures side by side: the users' ways (their
``np.load`` dict sliced per sample; the advised ``np.load`` of both files per sample), npyfeed's numpy iterator in
each read mode (warm, and cold where the page cache of those files can be dropped), ``shuffle="blocks"`` from a
cold cache, ``npyfeed.tf.dataset`` (when TensorFlow is installed), and the physical limits of the machine (memory
copy; the disk's sequential and random reads on those files). From these figures, `recommend` derives a mode, a
thread count, an order and the samples/s to expect per process.

What is measured on a large data set is a seeded sample of its keys (about `SAMPLE_BYTES` of files) and, per row,
a bounded time; ``full=True`` takes every key and, for npyfeed's rows, a whole epoch. Nothing is written to the
data's folders: the index is parsed in memory (no compiled-index cache), a sampled index goes to a temporary
folder that is removed afterwards, and the files that were in the page cache before are read back into it at the
end, so that a training job on the same node is not slowed by the cold measurements.

Its measuring tools are public for scripts of one's own: `npyfeed.bench.measure` (the machine's limits, page-cache
eviction) and `npyfeed.bench.baselines` (the users' own loaders), which the repository's benchmarks share.

This module imports only numpy and npyfeed; TensorFlow is imported by the ``npyfeed.tf.dataset`` row only, and
matplotlib by `BenchReport.plot` only.
"""

from __future__ import annotations

import errno
import os
import time

from .. import _checks
from .._resources import resolve_threads
from ..loading import _fspath
from ..windows import BOUNDS
from ._report import (  # the row names and thresholds a report is read by, with the report's types
    BLOCKS_ROW,
    DEFAULT_SECONDS,
    DICT_BYTES,
    DICT_ROW,
    FIT_FRACTION,
    ITERATOR,
    MAX_COLD_RESIDENCY,
    MIN_SAMPLED_KEYS,
    MODES,
    NP_LOAD_ROW,
    ROW_ORDER,
    SAMPLE_BYTES,
    TF_ROW,
    WIDTH,
    BenchReport,
    Limit,
    Recommendation,
    Row,
    recommend,
)

__all__ = ["run", "recommend", "BenchReport", "Row", "Limit", "Recommendation", "ITERATOR", "DICT_ROW", "NP_LOAD_ROW",
           "BLOCKS_ROW", "TF_ROW", "ROW_ORDER", "MODES", "SAMPLE_BYTES", "DEFAULT_SECONDS", "MIN_SAMPLED_KEYS",
           "DICT_BYTES", "MAX_COLD_RESIDENCY", "FIT_FRACTION", "WIDTH"]


# ------------------------------------------------------------------------------------------------- run


def run(index_files, factor_dir, label_dir, *, window: int, batch_size: int, processes: int = 1,
        threads: int | None = None, full: bool = False, seconds: float = DEFAULT_SECONDS, cold: bool = True,
        tf: bool = True, progress: bool = True, seed: int = 0, bounds: str = "error",
        sample_bytes: int = SAMPLE_BYTES) -> BenchReport:
    """Measure the ways of reading these files on this machine, and recommend one.

    Parameters
    ----------
    index_files : str, os.PathLike or sequence of them
        As for `npyfeed.WindowSource`.
    factor_dir, label_dir : str or os.PathLike
        As for `npyfeed.WindowSource`.
    window, batch_size : int
        W and B, as in training.
    processes : int
        Training processes per node, for the recommendation.
    threads : int, optional
        Gather threads of npyfeed's rows and of the limits (default: as `npyfeed.WindowSource`).
    full : bool
        Every key, and a whole epoch per npyfeed row (the users' rows stay bounded by `seconds`). Default: a
        seeded sample of keys of about `sample_bytes` when the data set is larger, and `seconds` per row.
    seconds : float
        Seconds per row (after its first batch).
    cold : bool
        Also measure from a cold page cache: drop the sampled files from it (``posix_fadvise``), checked with
        ``mincore``; rows whose files stay cached are skipped with a note. ``False`` also skips the disk limits.
    tf : bool
        Measure ``npyfeed.tf.dataset`` when TensorFlow is installed.
    progress : bool
        A progress bar on stderr (tqdm; step lines without it).
    seed : int
        The key sample and the shuffled order.
    bounds : {"error", "skip", "pad"}
        As for `npyfeed.WindowSource`.
    sample_bytes : int
        Bytes of files to sample when not `full`.

    Returns
    -------
    BenchReport

    Raises
    ------
    FileNotFoundError, NotADirectoryError
        A folder, index file or data file that is not there (named).
    NpyFormatError, OSError
        A data file that cannot be read or is not a valid ``.npy`` file (named).
    ValueError, IndexError
        An argument out of range; a malformed index line or a window outside its file (file and line named).
    """
    started = time.perf_counter()
    window = _checks.positive(window, "window")
    batch_size = _checks.positive(batch_size, "batch_size")
    processes = _checks.positive(processes, "processes")
    sample_bytes = _checks.positive(sample_bytes, "sample_bytes")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    if bounds not in BOUNDS:
        raise ValueError(f"bounds must be one of {BOUNDS}, got {bounds!r}")
    nthreads = resolve_threads(threads)
    factor_dir, label_dir = _fspath(factor_dir), _fspath(label_dir)
    for folder in (factor_dir, label_dir):
        if not os.path.exists(folder):
            raise FileNotFoundError(errno.ENOENT, "no such folder", folder)
        if not os.path.isdir(folder):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", folder)
    from ._run import Bench

    bench = Bench(index_files, factor_dir, label_dir, window, batch_size, nthreads, full, float(seconds), cold, tf,
                  progress, seed, bounds, sample_bytes)
    try:
        bench.measure()
    finally:
        bench.close()
    report = bench.report(processes)
    report.seconds = time.perf_counter() - started
    return report
