"""Live statistics of a pipeline: is the input the bottleneck?

Every plan counts, always on, what its consumer took and how long it waited for it, the CPU time the gathers took,
how far the read-ahead was, what ``shuffle="blocks"`` read and what ``gather="device"`` uploaded; each plan also
counts into its source's totals. `WindowSource.stats`, `Plan.stats`, `BatchIterator.stats`, the ``stats()`` of a
dataset made by `npyfeed.tf.dataset` and of the Keras and PyTorch adapters return them as a plain dict
(`FIELDS`); `summary` says in one line whether the consumer was input-bound. `StatsLogger` is the framework-neutral
half of the Keras callbacks (`npyfeed.tf.StatsCallback`, `npyfeed.keras.StatsCallback`), `EpochStatsCallback`
their shared body; per epoch they also say how the process's threads shared the CPUs (`thread_times`,
`cpu_share`, `cpu_summary`): whether the model's main thread waited for a core while npyfeed's workers ran.
"""

from __future__ import annotations

import os
import time
import weakref

from ._checks import ArgumentTypeError

__all__ = ["FIELDS", "INPUT_BOUND", "CPU_WAIT", "as_dict", "difference", "summary", "thread_times", "cpu_share",
           "cpu_summary", "StatsLogger", "EpochStatsCallback"]

#: The keys of a stats dict, with what each counts. Counts are since the plan (or source) was made.
FIELDS = {
    "batches": "batches handed to the consumer",
    "samples": "their samples",
    "bytes": "their bytes (x and y, in the output dtype)",
    "samples_per_second": "samples / elapsed_seconds",
    "elapsed_seconds": "from the consumer's first request to the last batch it received",
    "wait_seconds": "time the consumer waited for batches (from asking to having)",
    "wait_fraction": "wait_seconds / elapsed_seconds: the share of its time the consumer waited for input",
    "gather_seconds": "CPU time the gathers of those batches took, summed over their workers (not time blocked in "
                      "a read or a page fault, nor time waiting for a core)",
    "ready_batches": "batches that were complete when the consumer asked for them",
    "read_ahead": "complete batches waiting when the consumer asked, on average (0: it always waited)",
    "blocks_read": 'shuffle="blocks": blocks whose files were all read',
    "block_bytes_read": 'shuffle="blocks": bytes of the files read whole',
    "block_read_seconds": 'shuffle="blocks": worker time those reads took',
    "block_waits": 'shuffle="blocks": blocks whose read the consumer had to wait for (cache misses)',
    "block_hits": 'shuffle="blocks": blocks read ahead, ready when first needed (blocks_read - block_waits)',
    "device_bytes": 'gather="device": bytes of arrays uploaded to the device',
}

#: `summary` calls a consumer input-bound when it waited at least this share of its time.
INPUT_BOUND = 0.10

#: `cpu_summary` says the cores are shared when the main thread waited at least this share of the time for one.
CPU_WAIT = 0.05

_NS = 1e-9


def difference(after: dict, before: dict) -> dict:
    """Raw counters `after` less `before` (`counts` of the same stats at two moments): what happened between.
    The elapsed time is the difference of the two elapsed times."""
    return {k: after[k] - before.get(k, 0) for k in after}


def as_dict(raw: dict) -> dict:
    """The public stats dict (`FIELDS`, in that order) of raw counters."""
    elapsed = raw["elapsed_ns"] * _NS
    batches = raw["batches"]
    out = {
        "batches": batches,
        "samples": raw["samples"],
        "bytes": raw["bytes"],
        "samples_per_second": raw["samples"] / elapsed if elapsed > 0 else 0.0,
        "elapsed_seconds": elapsed,
        "wait_seconds": raw["wait_ns"] * _NS,
        "wait_fraction": min(raw["wait_ns"] * _NS / elapsed, 1.0) if elapsed > 0 else 0.0,
        "gather_seconds": raw["gather_ns"] * _NS,
        "ready_batches": raw["ready_batches"],
        "read_ahead": raw["read_ahead_sum"] / batches if batches else 0.0,
        "blocks_read": raw["blocks_read"],
        "block_bytes_read": raw["block_bytes_read"],
        "block_read_seconds": raw["block_read_ns"] * _NS,
        "block_waits": raw["block_waits"],
        "block_hits": max(raw["blocks_read"] - raw["block_waits"], 0),
        "device_bytes": raw["device_bytes"],
    }
    assert list(out) == list(FIELDS)
    return out


def summary(stats: dict, consumer: str = "the consumer") -> str:
    """One line: input-bound or not, with the figures that say so. `stats` is a stats dict (`as_dict`); `consumer`
    names who reads the batches (the Keras callbacks say "the model").

    How to read an input-bound line: ``gather_seconds`` is CPU time, so ``gather_seconds / elapsed_seconds`` is
    how many CPUs the gathers kept busy on average. Near ``threads`` (or above: ``mode="direct"``'s blocking
    readers, 4 per thread, may together use more CPUs than ``threads``), the gathers compute all the time: more
    threads, or fewer bytes per sample. Well below it, the gathers wait for the disk (a cold cache, data larger
    than memory), where more threads help only by keeping more reads in flight, or for cores held by other
    threads (`cpu_share`).
    """
    if not stats["batches"]:
        return "no batches yet"
    share = stats["wait_fraction"]
    verdict = "input-bound" if share >= INPUT_BOUND else "not input-bound"
    line = (f"{verdict}: {consumer} waited {share:.0%} of its time for batches "
            f"({stats['samples_per_second']:,.0f} samples/s; the gathers used {stats['gather_seconds']:.2f} s of CPU, "
            f"{stats['read_ahead']:.1f} batches ready ahead on average")
    if stats["blocks_read"]:
        line += f"; {stats['blocks_read']} blocks read, waited for {stats['block_waits']}"
    return line + ")"


def thread_times() -> dict | None:
    """CPU time and run-queue time so far of each live thread of this process, in nanoseconds:
    ``{thread_id: (group, cpu_ns, runqueue_ns)}`` with group ``"main"`` (the main thread), ``"npyfeed"``
    (npyfeed's workers, of every pool: threads named ``npyfeed``) or ``"other"`` (TensorFlow's, the caller's
    own). The run-queue time is how long the thread was ready to run and waited for a CPU. Read from Linux's
    ``/proc/self/task/*/schedstat``; None where the kernel does not report it."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    main = os.getpid()
    out = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                cpu_ns, runqueue_ns = (int(v) for v in f.read().split()[:2])
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except (OSError, ValueError):  # the thread ended meanwhile, or no scheduler statistics
            continue
        group = "main" if int(tid) == main else "npyfeed" if name.startswith("npyfeed") else "other"
        out[int(tid)] = (group, cpu_ns, runqueue_ns)
    return out or None


def cpu_share(before: dict, after: dict, seconds: float) -> dict:
    """How the threads shared the CPUs between two `thread_times` readings `seconds` apart: for each group, the
    cores its threads used on average (``main_cores``, ``npyfeed_cores``, ``other_cores``), and
    ``main_cpu_wait``, the share of the time the main thread was ready to run but waited for a core. Threads
    started in between count from their start; threads that ended in between are not counted."""
    cpu = {"main": 0, "npyfeed": 0, "other": 0}
    main_wait = 0
    for tid, (group, cpu_ns, runqueue_ns) in after.items():
        _, cpu0, runqueue0 = before.get(tid, (group, 0, 0))
        cpu[group] += cpu_ns - cpu0
        if group == "main":
            main_wait += runqueue_ns - runqueue0
    seconds = max(seconds, 1e-9)
    out = {f"{group}_cores": ns * _NS / seconds for group, ns in cpu.items()}
    out["main_cpu_wait"] = min(main_wait * _NS / seconds, 1.0)
    return out


def cpu_summary(share: dict, wait_fraction: float | None = None) -> str:
    """One line of a `cpu_share` dict. Where the main thread waited at least `CPU_WAIT` of the time for a core
    while npyfeed's workers ran, and longer than the consumer waited for batches (`wait_fraction` of the same
    epoch, if given: a consumer that mostly waits for batches loses nothing by waiting for a core too), it says
    the cores are shared and what to do: give the workers a higher niceness (``nice=`` on the source), so that
    the model's step goes first and the workers take what is left."""
    line = (f"the main thread used {share['main_cores']:.2f} of a core and waited {share['main_cpu_wait']:.0%} of "
            f"the time for one; npyfeed's workers used {share['npyfeed_cores']:.2f} cores, other threads "
            f"{share['other_cores']:.2f}")
    waited = share["main_cpu_wait"]
    if waited >= CPU_WAIT and share["npyfeed_cores"] > 0 and (wait_fraction is None or waited > wait_fraction):
        line += (" (the cores are shared: a higher niceness for npyfeed's workers, e.g. nice=5 on the source, lets "
                 "the step go first)")
    return line


class StatsLogger:
    """Per-epoch statistics of a pipeline for a training loop of one's own: call `epoch_begin` and `epoch_end`
    around each epoch; `epoch_end` returns the epoch's stats dict (counted between the two calls).

    Parameters
    ----------
    source
        What to watch: a `WindowSource` (all its pipelines), a `Plan`, a `BatchIterator`, a dataset returned by
        `npyfeed.tf.dataset`, or an adapter (`npyfeed.keras.PyDataset`, `npyfeed.torch.WindowDataset`).

    Examples
    --------
    >>> logger = npyfeed.stats.StatsLogger(src)                       # doctest: +SKIP
    >>> for epoch in range(3):                                        # doctest: +SKIP
    ...     logger.epoch_begin()
    ...     for x, y in src.batches(256, shuffle=True, epoch=epoch):
    ...         train_step(x, y)
    ...     print(npyfeed.stats.summary(logger.epoch_end()))
    """

    def __init__(self, source):
        self._counts = raw_counts_of(source)
        self._before = None
        self._threads_before = None
        #: How the process's threads shared the CPUs over the last epoch (`cpu_share`); None before the first
        #: epoch ends, or where the kernel does not report it.
        self.cpu = None

    def epoch_begin(self) -> None:
        self._before = self._counts()
        self._threads_before = (time.monotonic(), thread_times())

    def epoch_end(self) -> dict:
        now = self._counts()
        before = self._before if self._before is not None else {k: 0 for k in now}
        self._before = now
        began, threads_then = self._threads_before or (0.0, None)
        ended, threads_now = time.monotonic(), thread_times()
        self.cpu = cpu_share(threads_then, threads_now, ended - began) if threads_then and threads_now else None
        self._threads_before = (ended, threads_now)
        return as_dict(difference(now, before))


#: Every object that has npyfeed statistics (a `WindowSource`, `Plan`, `BatchIterator`, an adapter, a dataset of
#: `npyfeed.tf.dataset`) and the core ``PipelineStats`` it reports, for as long as the object lives: the one way
#: statistics are found (npyfeed sets no attribute on another library's objects).
_registered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register(obj, core_stats) -> None:
    """Makes `core_stats` (a core ``PipelineStats``, or the object of npyfeed's whose statistics `obj` reports) the
    statistics of `obj` while `obj` lives (`raw_counts_of`). Each object with a ``stats()`` registers itself."""
    if not hasattr(core_stats, "counts"):
        core_stats = _registered[core_stats]
    _registered[obj] = core_stats


def _registered_stats(obj):
    try:
        return _registered.get(obj)
    except TypeError:  # not weakly referenceable, or not hashable: not registered
        return None


def raw_counts_of(obj):
    """The function returning the raw counters of `obj`: a `WindowSource`, `Plan`, `BatchIterator`, a dataset of
    `npyfeed.tf.dataset` (`register`), an adapter with a ``stats()`` method backed by a plan, or a core
    ``PipelineStats``."""
    core = _registered_stats(obj)
    if core is None and hasattr(obj, "counts"):
        core = obj
    if core is None:
        raise ArgumentTypeError(f"cannot find npyfeed statistics in {type(obj).__name__}: pass a WindowSource, a "
                                "Plan, a dataset returned by npyfeed.tf.dataset or an npyfeed adapter")
    return core.counts


class EpochStatsCallback:
    """The body of the Keras callbacks `npyfeed.tf.StatsCallback` and `npyfeed.keras.StatsCallback` (each mixes it
    into its Keras' ``Callback``): per epoch, the pipeline's stats dict appended to `epochs`, its wait share and
    rate added to Keras' logs (``npyfeed_wait_fraction``, ``npyfeed_samples_per_second``: in the ``History``;
    where the kernel reports it, also ``npyfeed_main_cpu_wait``, the share of the epoch the main thread waited
    for a core: `cpu_share`), the epoch's `cpu_share` dict appended to `cpu` (None where not reported), and with
    `verbose` one line printed: the `summary`, then the `cpu_summary`.

    Parameters
    ----------
    source
        What to watch: a `WindowSource` (all its pipelines), a `Plan`, a dataset returned by
        `npyfeed.tf.dataset`, or an adapter (`npyfeed.keras.PyDataset`, `npyfeed.torch.WindowDataset`).
    verbose : int
        1: print one line per epoch; 0: silent.
    """

    def __init__(self, source, *, verbose: int = 1):
        super().__init__()
        self._logger = StatsLogger(source)
        self.verbose = int(verbose)
        self.epochs: list = []
        self.cpu: list = []

    def on_epoch_begin(self, epoch, logs=None):
        self._logger.epoch_begin()

    def on_epoch_end(self, epoch, logs=None):
        stats = self._logger.epoch_end()
        self.epochs.append(stats)
        share = self._logger.cpu
        self.cpu.append(share)
        if logs is not None:
            logs["npyfeed_wait_fraction"] = stats["wait_fraction"]
            logs["npyfeed_samples_per_second"] = stats["samples_per_second"]
            if share is not None:
                logs["npyfeed_main_cpu_wait"] = share["main_cpu_wait"]
        if self.verbose:
            line = f"npyfeed, epoch {epoch + 1}: {summary(stats, 'the model')}"
            cpu = "" if share is None else f"; CPU: {cpu_summary(share, stats['wait_fraction'])}"
            print(line + cpu, flush=True)
        self._write(int(epoch), stats)

    def _write(self, epoch: int, stats: dict) -> None:
        """Where a framework writes the epoch's figures elsewhere (TensorBoard): nothing here."""
