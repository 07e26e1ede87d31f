"""The physical limits of this machine, measured without compiled code: memory copy (into recycled and into fresh
buffers), mapping cached files, the disk's O_DIRECT sequential and random reads, the same random reads through the
page cache; the page-cache eviction they rely on (``posix_fadvise(DONTNEED)``), the machine's facts and a table
printer.

`npyfeed bench` (`npyfeed.bench`) and the repository's benchmarks (``bench/common.py`` re-exports these) measure
the limits beside their contenders in the same run. Units: GB = 1e9 bytes; bandwidths are bytes per second.
"""

from __future__ import annotations

import mmap
import os
import platform
import resource
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .._resources import available_memory  # a machine fact the benchmarks report: MemAvailable, or a cgroup's limit

__all__ = ["GB", "PAGE", "DIRECT_ALIGN", "evict", "Pass", "time_batches", "memcpy_bandwidth", "fresh_buffer",
           "fresh_copy_bandwidth", "page_touch_bandwidth", "odirect_seq_bandwidth", "RandomReadResult",
           "odirect_random_bandwidth", "buffered_random_bandwidth", "READS_IN_FLIGHT", "random_read_limit",
           "format_table", "machine_info", "available_memory", "cpu_model", "describe_cpu", "last_level_cache_bytes"]

GB = 1e9
PAGE = mmap.PAGESIZE
DIRECT_ALIGN = 4096  # O_DIRECT alignment used by the limit probes (what every Linux block device accepts)


# ----------------------------------------------------------------------------------------- page cache


def evict(paths: Iterable[str]) -> None:
    """Drop `paths` from the page cache (written back first: dirty pages of a file just written would stay). Pages
    still mapped by a live mapping stay: release arrays first."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------------------------- timing


@dataclass
class Pass:
    """One timed run over batches (`time_batches`), from its start to the last batch taken."""

    batches: int = 0
    samples: int = 0
    first_samples: int = 0  # in the first batch
    first_s: float = 0.0  # from the start to the first batch
    seconds: float = 0.0  # from the start to the last batch
    cpu_s: float = 0.0  # this process's CPU time (user + system, every thread)
    minor_faults: int = 0
    read_bytes: int = 0  # read from storage by this process (/proc/self/io, read-ahead included)
    stopped: str = "end"  # what ended it: "batches", "samples", "seconds" or "end" (the batches ran out)
    first: tuple | None = None  # the first batch, with keep_first

    @property
    def samples_per_s(self) -> float:
        """Samples over the whole run, the first batch (a pipeline's start-up, a cold read) included."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_samples_per_s(self) -> float:
        """Samples after the first batch over the time from its arrival to the last batch's: the rate once
        started (a pipeline's start-up, paid once per epoch, left out); `samples_per_s` with one batch."""
        if self.batches < 2 or self.seconds <= self.first_s:
            return self.samples_per_s
        return (self.samples - self.first_samples) / (self.seconds - self.first_s)


def time_batches(batches, most_batches: int | None = None, most_samples: int | None = None,
                 seconds: float | None = None, keep_first: bool = False) -> Pass:
    """Take ``(x, y)`` batches (x's first axis the samples) until `most_batches` or `most_samples` are taken,
    `seconds` have passed since the first batch, or they run out; then close the iterator where it can be closed
    (npyfeed's, generators). `batches` is an iterable, or a function returning one that is called on the clock
    (an iterator's start then counts, or an open). The result of each batch is dropped before the next is asked
    for, except the first with `keep_first`."""

    def counters() -> tuple:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return time.perf_counter(), usage.ru_utime + usage.ru_stime, usage.ru_minflt, _storage_read_bytes()

    out = Pass()
    t0, cpu0, faults0, read0 = counters()
    iterator = iter(batches() if callable(batches) else batches)
    try:
        for x, y in iterator:
            now = time.perf_counter() - t0
            n = int(x.shape[0])
            if out.batches == 0:
                out.first_s, out.first_samples = now, n
                out.first = (x, y) if keep_first else None
            out.batches, out.samples, out.seconds = out.batches + 1, out.samples + n, now
            del x, y
            if most_batches is not None and out.batches >= most_batches:
                out.stopped = "batches"
            elif most_samples is not None and out.samples >= most_samples:
                out.stopped = "samples"
            elif seconds is not None and now - out.first_s >= seconds:
                out.stopped = "seconds"
            else:
                continue
            break
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    _, cpu1, faults1, read1 = counters()
    out.cpu_s, out.minor_faults, out.read_bytes = cpu1 - cpu0, faults1 - faults0, read1 - read0
    return out


def _storage_read_bytes() -> int:
    """Bytes this process has had read from storage (``read_bytes`` of /proc/self/io, read-ahead included; 0 where
    the system does not say)."""
    try:
        with open("/proc/self/io") as f:
            return int(next(line for line in f if line.startswith("read_bytes:")).split()[1])
    except (OSError, StopIteration, ValueError):
        return 0


# --------------------------------------------------------------------------------------------- limits


def _run_threads(threads: int, work: Callable[[int], None]) -> float:
    """Run work(t) for t in range(threads) at once (released together by a barrier); wall seconds."""
    barrier = threading.Barrier(threads + 1)
    errors: list = []

    def body(t: int) -> None:
        barrier.wait()
        try:
            work(t)
        except BaseException as e:  # re-raised in the caller
            errors.append(e)

    pool = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    barrier.wait()
    t0 = time.perf_counter()
    for th in pool:
        th.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed


def memcpy_bandwidth(threads: int, nbytes_per_thread: int = 256 << 20, repeats: int = 5) -> float:
    """GB/s of `threads` threads each copying its own pre-faulted buffer (np.copyto releases the GIL).

    This is the ceiling for anything that fills an owned array from memory (page cache or RAM): read + write.
    """
    n = max(1, nbytes_per_thread // 8)
    src = [np.ones(n, dtype=np.float64) for _ in range(threads)]
    dst = [np.zeros(n, dtype=np.float64) for _ in range(threads)]  # written: its pages are faulted in now
    best = min(_run_threads(threads, lambda t: np.copyto(dst[t], src[t])) for _ in range(repeats))
    return threads * n * 8 / best / GB


def fresh_buffer(nbytes: int) -> mmap.mmap:
    """A new private anonymous mapping of `nbytes`, as malloc returns a multi-MB block: untouched pages.

    No madvise: transparent huge pages only if the system's THP mode is "always" (numpy's own allocations,
    by contrast, ask for huge pages from 4 MB up).
    """
    return mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _aligned_buffer(size: int) -> mmap.mmap:
    """Anonymous mapping: page-aligned, as O_DIRECT wants."""
    return mmap.mmap(-1, max(size, DIRECT_ALIGN))


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def odirect_seq_bandwidth(paths: Sequence[str], threads: int, chunk: int = 64 << 20,
                          fresh: bool = False) -> float | None:
    """GB/s reading whole files with O_DIRECT (page cache bypassed), files shared among `threads` threads.

    Each file is read front to back in requests of up to `chunk` bytes (a whole file per request for the
    data set's files). Bytes counted are file bytes. With ``fresh=False`` each thread reuses one buffer: the
    disk's own figure. With ``fresh=True`` every file goes to a new buffer (`fresh_buffer`, kept until the end):
    the same plus the first-touch cost of the destination, what a loader returning owned arrays pays.
    None if the filesystem refuses O_DIRECT.
    """
    sizes = [os.path.getsize(p) for p in paths]
    total = sum(sizes)
    lock = threading.Lock()
    it = iter(range(len(paths)))
    bufsize = min(chunk, _round_up(max(sizes, default=1), DIRECT_ALIGN))
    bufs = [_aligned_buffer(bufsize) for _ in range(threads)]
    kept: list = []

    def work(t: int) -> None:
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            fd = os.open(paths[i], os.O_RDONLY | os.O_DIRECT)
            try:
                offset, size = 0, sizes[i]
                if fresh:
                    buf = fresh_buffer(_round_up(size, DIRECT_ALIGN))
                    kept.append(buf)
                    view, step = memoryview(buf), len(buf)
                else:
                    view, step = memoryview(bufs[t]), bufsize
                while offset < size:
                    want = min(step, _round_up(size - offset, DIRECT_ALIGN))
                    got = os.preadv(fd, [view[offset:offset + want] if fresh else view[:want]], offset)
                    if got <= 0:
                        break
                    offset += got
            finally:
                os.close(fd)

    try:
        evict(paths)
        elapsed = _run_threads(threads, work)
    except OSError as e:
        if e.errno == 22:  # EINVAL: no O_DIRECT here (tmpfs, some FUSE)
            return None
        raise
    finally:
        for b in bufs + kept:
            b.close()
    return total / elapsed / GB


@dataclass
class RandomReadResult:
    gbps: float
    iops: float
    block: int
    reads: int
    threads: int


def odirect_random_bandwidth(paths: Sequence[str], threads: int, block: int = 100 * 1024, reads: int = 2000,
                             seed: int = 0) -> RandomReadResult | None:
    """O_DIRECT reads of `block` bytes (rounded up to 4 KiB) at seeded random aligned offsets of random files.

    The disk's limit for a loader that reads windows instead of whole files. None if O_DIRECT is refused.
    """
    return _random_read_bandwidth(paths, threads, block, reads, seed, os.O_DIRECT)


def buffered_random_bandwidth(paths: Sequence[str], threads: int, block: int = 100 * 1024, reads: int = 2000,
                              seed: int = 0) -> RandomReadResult | None:
    """The reads of `odirect_random_bandwidth` (same offsets for the same seed) through the page cache, every file
    evicted first: the limit for a loader whose cold reads go through the page cache (npyfeed's "mmap" and
    "read" modes, ``np.load``), which pays the cache's page allocation and insertion and, here, a copy out.
    None if no file holds a block."""
    return _random_read_bandwidth(paths, threads, block, reads, seed, 0)


def _random_read_bandwidth(paths: Sequence[str], threads: int, block: int, reads: int, seed: int,
                           flags: int) -> RandomReadResult | None:
    """`reads` reads of `block` bytes (rounded up to 4 KiB) at seeded random aligned offsets of random files, opened
    with `flags` added; None if no file holds a block, or if the flags are refused (EINVAL: O_DIRECT)."""
    block = _round_up(block, DIRECT_ALIGN)
    sizes = np.array([os.path.getsize(p) for p in paths])
    usable = sizes // DIRECT_ALIGN * DIRECT_ALIGN - block
    ok = np.flatnonzero(usable >= 0)
    if len(ok) == 0:
        return None
    rng = np.random.default_rng(seed)
    files = ok[rng.integers(0, len(ok), size=reads)]
    offsets = (rng.random(reads) * (usable[files] // DIRECT_ALIGN + 1)).astype(np.int64) * DIRECT_ALIGN
    fds: list = []
    bufs = [_aligned_buffer(block) for _ in range(threads)]
    try:
        fds = [os.open(p, os.O_RDONLY | flags) for p in paths]
        evict(paths)

        def work(t: int) -> None:
            view = memoryview(bufs[t])
            for r in range(t, reads, threads):
                os.preadv(fds[files[r]], [view], int(offsets[r]))

        elapsed = _run_threads(threads, work)
    except OSError as e:
        if e.errno == 22 and flags:
            return None
        raise
    finally:
        for fd in fds:
            os.close(fd)
        for b in bufs:
            b.close()
    return RandomReadResult(reads * block / elapsed / GB, reads / elapsed, block, reads, threads)


#: Reads in flight per gather thread at which `random_read_limit` probes: one (a page fault in a mapping, a read),
#: 4 (mode="direct"'s queue) and 16 (a cold batch's read-ahead hints queue many windows at once).
READS_IN_FLIGHT = (1, 4, 16)


def random_read_limit(paths: Sequence[str], threads: int, block: int, reads: int = 2000, seed: int = 0,
                      buffered: bool = False) -> RandomReadResult | None:
    """The disk's limit for a gather of `threads` threads that reads windows of `block` bytes: the best of
    `odirect_random_bandwidth` (`buffered_random_bandwidth` with `buffered`, the limit of reads through the page
    cache) at `READS_IN_FLIGHT` reads per thread (its ``threads`` says which). None where no probe ran."""
    probe = buffered_random_bandwidth if buffered else odirect_random_bandwidth
    results = [probe(paths, depth * threads, block=block, reads=reads, seed=seed) for depth in READS_IN_FLIGHT]
    return max((r for r in results if r is not None), key=lambda r: r.gbps, default=None)


def fresh_copy_bandwidth(threads: int, buffer_bytes: int, count: int, repeats: int = 3) -> float:
    """GB/s copying `count` buffers of `buffer_bytes` into fresh buffers (`fresh_buffer`), over `threads` threads.

    What a loader that hands out new owned arrays pays at least: the copy plus the first-touch page faults of
    each new buffer (page allocation, zeroing, page-table updates; in a VM also the hypervisor's share). Every
    buffer is kept until the run ends, as a load keeps its arrays, so no run recycles its own pages.
    """
    n = max(1, buffer_bytes // 8)
    src = np.ones(n, dtype=np.float64)
    per_thread = [range(t, count, threads) for t in range(threads)]

    def run() -> float:
        kept: list = [[] for _ in range(threads)]

        def work(t: int) -> None:
            for _ in per_thread[t]:
                buf = fresh_buffer(n * 8)
                np.copyto(np.frombuffer(buf, dtype=np.float64, count=n), src)
                kept[t].append(buf)

        elapsed = _run_threads(threads, work)
        for bufs in kept:
            for b in bufs:
                b.close()
        return elapsed

    best = min(run() for _ in range(repeats))
    return count * n * 8 / best / GB


def page_touch_bandwidth(paths: Sequence[str], threads: int) -> float:
    """GB/s of mapping cached files and reading one byte per page, over `threads` threads.

    The ceiling for populating mappings of files in the page cache (what ``load(mode="mmap", populate=True)``
    does): one page-table fill per page and no copy. Warm the files first.
    """
    per_thread = [paths[t::threads] for t in range(threads)]

    def work(t: int) -> None:
        for path in per_thread[t]:
            size = os.path.getsize(path)
            if size == 0:
                continue
            with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mm:
                view = np.frombuffer(mm, dtype=np.uint8)
                int(view[::PAGE].sum())  # a strided reduction: one touch per page, GIL released
                del view

    elapsed = _run_threads(threads, work)
    return sum(os.path.getsize(p) for p in paths) / elapsed / GB


# ---------------------------------------------------------------------------------------- output


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """A plain-text table; `align` has one 'l' or 'r' per column (default: first left, rest right)."""
    cells = [[str(c) for c in header]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    align = align or "l" + "r" * (len(header) - 1)

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def machine_info() -> dict:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = None
    return {"cpus": cpus, "memory_bytes": mem, "kernel": platform.release(), "python": platform.python_version(),
            "numpy": np.__version__, "cpu": cpu_model(), "last_level_cache_bytes": last_level_cache_bytes()}


def cpu_model() -> str | None:
    """The CPU as /proc/cpuinfo tells it: its model name, then its family and model numbers and its widest vector
    unit, e.g. ``"AMD EPYC (family 26, model 2, AVX-512)"`` (a virtual machine's model name alone often says no
    more than the vendor's line); None where the system does not say."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return describe_cpu(f.read())
    except OSError:
        return None


def describe_cpu(cpuinfo: str) -> str | None:
    """`cpu_model` of the text of a /proc/cpuinfo (its first processor's block)."""
    fields: dict = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if not key.strip():
            break  # the first processor's block ends
        fields.setdefault(key.strip(), value.strip())
    name = next((fields[k] for k in ("model name", "Processor", "cpu model") if k in fields), None)
    if name is None:
        return None
    flags = set(fields.get("flags", "").split())
    facts = [f"family {fields['cpu family']}" if "cpu family" in fields else None,
             f"model {fields['model']}" if "model" in fields else None,
             "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None]
    facts = [fact for fact in facts if fact]
    return f"{name} ({', '.join(facts)})" if facts else name


def last_level_cache_bytes() -> int | None:
    """Bytes of the largest data or unified cache of cpu0's highest level (sysfs), or None where it says none."""
    best = (0, 0)
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind, level, size = ((index / f).read_text().strip() for f in ("type", "level", "size"))
            nbytes = int(size.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and nbytes > 0:
            best = max(best, (int(level), nbytes))
    return best[1] or None
