"""What `npyfeed.bench.run` measures and reports: the row names, the thresholds, `Row`, `Limit`, `Recommendation`,
`BenchReport` and `recommend`. No IO and no timing: `_run` measures, this module holds and judges the figures."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from ..loading import _fspath
from ..plan import DEFAULT_MEMORY_BUDGET
from . import measure
from ._text import _bytes, _fmt, _wrap

#: Bytes of files (factor and label) measured by default when a data set is larger: its keys are sampled.
SAMPLE_BYTES = 1 << 30
#: Fewest keys sampled (when the data set has them).
MIN_SAMPLED_KEYS = 8
#: Bytes of files the users' dict baseline loads (its rate per sample does not depend on the number of keys).
DICT_BYTES = 256 << 20
#: A cold measurement that finds more of its files in the page cache than this is not cold: it is skipped.
MAX_COLD_RESIDENCY = 0.02
#: Data that fits in this share of the memory available is read from the page cache (``mode="mmap"``).
FIT_FRACTION = 0.8
#: Seconds per row by default.
DEFAULT_SECONDS = 2.0
#: Columns the printed report fits by default (`BenchReport.format_table`; ``wide=True`` has no bound).
WIDTH = 120

ITERATOR = 'npyfeed mode="mmap"'  # the row every other is compared with, in the same cache state
DICT_ROW = "users' dict + per-sample slicing"
NP_LOAD_ROW = "users' np.load per sample"
BLOCKS_ROW = 'npyfeed shuffle="blocks"'
TF_ROW = 'npyfeed.tf.dataset mode="mmap"'
MODES = ("mmap", "read", "direct")
#: The rows as printed: the users' ways, then npyfeed warm, then cold.
ROW_ORDER = [(DICT_ROW, "warm"), (NP_LOAD_ROW, "warm"), (ITERATOR, "warm"), ('npyfeed mode="read"', "warm"),
             (TF_ROW, "warm")] + [(f'npyfeed mode="{m}"', "cold") for m in MODES] + [(BLOCKS_ROW, "cold")]


@dataclass
class Row:
    """One measurement: a way of reading batches in one cache state.

    Attributes
    ----------
    name : str
        The users' way or npyfeed's (``'npyfeed mode="mmap"'`` is the numpy iterator, ``src.batches``).
    cache : {"warm", "cold"}
        The sampled files in the page cache, or dropped from it just before.
    samples_per_s : float or None
        Samples per second after the first batch (None when skipped).
    gbps : float or None
        GB/s of batch data handed out (float32 windows and labels).
    batches, seconds : int, float
        What was timed (after the first batch).
    first_batch_s : float or None
        Seconds to the first batch (the source already open).
    limit : str or None
        The physical limit it is held against (a key of `BenchReport.limits`).
    vs_iterator, vs_limit : float or None
        ``samples_per_s`` over the numpy iterator's (``mode="mmap"``, same cache state) and over the limit's.
    note : str
        What was sampled or bounded.
    skipped : str or None
        Why the row was not measured.
    """

    name: str
    cache: str
    samples_per_s: float | None = None
    gbps: float | None = None
    batches: int = 0
    seconds: float = 0.0
    first_batch_s: float | None = None
    limit: str | None = None
    vs_iterator: float | None = None
    vs_limit: float | None = None
    note: str = ""
    skipped: str | None = None


@dataclass
class Limit:
    """A physical limit of this machine: GB/s, and the samples/s it allows for this data set's samples."""

    name: str
    gbps: float | None
    samples_per_s: float | None
    note: str = ""


@dataclass
class Recommendation:
    """What to run, derived from the figures by `recommend`.

    Attributes
    ----------
    mode : {"mmap", "direct"}
        The ``WindowSource`` read mode.
    shuffle : True or "blocks"
        The order to train with.
    threads : int
        Gather threads per process.
    processes : int
        Training processes on the node the figures are for.
    memory_budget : int or None
        With ``shuffle="blocks"``: the budget per process, in bytes.
    expected_samples_per_s : float or None
        Samples/s to expect per process, the least of the bounds below.
    limited_by : str
        The bound that decides it: ``"gather threads"``, ``"memory copy"`` or ``"disk sequential read"``.
    bounds : dict
        Each bound, in samples/s per process.
    reasons : list of str
        Why, in words.
    """

    mode: str
    shuffle: bool | str
    threads: int
    processes: int
    memory_budget: int | None
    expected_samples_per_s: float | None
    limited_by: str
    bounds: dict
    reasons: list

    def text(self, width: int | None = None) -> str:
        """The recommendation as printed: one line per reason, or wrapped to `width` columns."""
        shuffle = '"blocks"' if self.shuffle == "blocks" else "True"
        budget = f", memory_budget={_bytes(self.memory_budget)}" if self.memory_budget else ""
        per = "process" if self.processes == 1 else f"process, {self.processes} processes on this node"
        lines = [f"recommendation: WindowSource(..., mode=\"{self.mode}\", threads={self.threads}), "
                 f"shuffle={shuffle}{budget}"]
        if self.expected_samples_per_s is not None:
            lines.append(f"  expected: about {self.expected_samples_per_s:,.0f} samples/s per {per} "
                         f"(limited by the {self.limited_by})")
        lines += [f"  because {r}" if i == 0 else f"  {r}" for i, r in enumerate(self.reasons)]
        return "\n".join(_wrap(line, width) for line in lines)


@dataclass
class BenchReport:
    """What `run` measured: the rows, the physical limits, the data and the machine, and the recommendation.

    Attributes
    ----------
    rows : list of Row
    limits : dict of str -> Limit
        ``"copy_1"`` and ``"copy"`` (memory copy with 1 and with the run's threads), ``"copy_node"`` (every CPU
        of the node), ``"disk_seq"`` and ``"disk_random"`` (O_DIRECT reads of the sampled files; absent without
        cold measurements or where O_DIRECT is refused), ``"disk_random_cached"`` (the random reads through the
        page cache, the limit of the cold ``"mmap"`` and ``"read"`` rows; absent without cold measurements).
    data : dict
        The data set (keys, samples, bytes, shapes), what was sampled, and the run's window, batch size and threads.
    machine : dict
        CPUs, memory, memory available (cgroup-aware), kernel, versions, load.
    recommendation : Recommendation
    processes : int
    notes : list of str
        Skipped rows and other caveats, in words.
    seconds : float
        Wall time of the whole run.
    date : str
        When it ended (UTC).
    """

    rows: list
    limits: dict
    data: dict
    machine: dict
    recommendation: Recommendation
    processes: int
    notes: list = field(default_factory=list)
    seconds: float = 0.0
    date: str = ""

    def to_dict(self) -> dict:
        """Everything, as JSON-ready built-in types."""
        return {"data": dict(self.data), "machine": dict(self.machine), "processes": self.processes,
                "limits": {k: asdict(v) for k, v in self.limits.items()}, "rows": [asdict(r) for r in self.rows],
                "recommendation": asdict(self.recommendation), "notes": list(self.notes), "seconds": self.seconds,
                "date": self.date}

    def format_table(self, wide: bool = False) -> str:
        """The report as printed by ``npyfeed bench``: data, machine, rows, limits, notes, recommendation.

        By default every line fits `WIDTH` columns: a row's limit is its key in `limits`, and the notes of rows
        and limits are numbered under their table (a note shared by several rows once). With `wide`, the limits'
        names and the notes are columns of the tables, and no line is wrapped.
        """
        d, m = self.data, self.machine
        width = None if wide else WIDTH
        sampled = (f"sampled {d['sampled_keys']:,} keys ({_bytes(d['sampled_bytes'])}, {d['sampled_samples']:,} "
                   f"samples, seed {d['seed']})" if d["sampled"] else "every key")
        out = [_wrap(f"data: {d['keys']:,} keys, {d['samples']:,} samples, {_bytes(d['bytes'])} of files (factor "
                     f"{tuple(d['factor_shape'])} {d['dtype']}); W={d['window']}, B={d['batch_size']}, "
                     f"{d['threads']} threads; {sampled}; opened in {d['open_seconds']:.1f} s", width),
               _wrap(f"machine: {m['cpus']} CPUs, {_bytes(m['memory_bytes'])} memory, "
                     f"{_bytes(m['memory_available'])} available, load {m['load']}", width), ""]
        footnotes: dict = {}  # note -> its number, shared by the tables below

        def note(text: str) -> str:
            if wide or not text:
                return text
            return f"[{footnotes.setdefault(text, len(footnotes) + 1)}]"

        def notes_since(first: int) -> list:
            return [_wrap(f"[{n}] {text}", width, indent=len(f"[{n}] "))
                    for text, n in footnotes.items() if n >= first]

        rows = []
        for r in self.rows:
            if r.skipped:
                rows.append([r.name, r.cache, "-", "-", "-", "-", "-", "-", note("skipped: " + r.skipped)])
                continue
            lim = self.limits.get(r.limit) if r.limit else None
            shown = "-" if lim is None else lim.name if wide else r.limit
            rows.append([r.name, r.cache, f"{r.batches:,}", f"{r.samples_per_s:,.0f}", _fmt(r.gbps, ".2f"),
                         _fmt(r.vs_iterator, ".2f", "x"), shown, _fmt(r.vs_limit, ".2f", "x"), note(r.note)])
        out.append(measure.format_table(("row", "cache", "batches", "samples/s", "GB/s", "x iter", "limit",
                                          "x limit", "note"), rows, align="llrrrrlrl"))
        out += notes_since(1)
        out.append("")
        first = len(footnotes) + 1
        lims = [[v.name, k, _fmt(v.gbps, ".2f"), _fmt(v.samples_per_s, ",.0f"), note(v.note)]
                for k, v in self.limits.items()]
        out.append(measure.format_table(("limit", "key", "GB/s", "samples/s", "note"), lims, align="llrrl"))
        out += notes_since(first)
        if self.notes:
            out += ["", "notes:"] + [_wrap(f"  * {n}", width, indent=4) for n in self.notes]
        out += ["", self.recommendation.text(width), "", f"measured in {self.seconds:.1f} s"]
        return "\n".join(out)

    def plot(self, path) -> None:
        """Write the rows and limits as a bar chart, SVG or PNG by the suffix of `path` (needs matplotlib:
        ``pip install 'npyfeed[bench]'``)."""
        from ._plot import plot

        plot(self, _fspath(path))


# ------------------------------------------------------------------------------------------- recommend


def recommend(rows: Sequence, limits: Mapping, data: Mapping, machine: Mapping, processes: int) -> Recommendation:
    """The recommendation that follows from a report's figures (``BenchReport.to_dict()``'s fields).

    The data fits when its files take at most `FIT_FRACTION` of the memory available: then ``mode="mmap"`` and
    ``shuffle=True`` (one copy in the page cache, shared by every process on the node), else ``shuffle="blocks"``
    with ``mode="direct"`` (each file read once per epoch, in sequence, around the page cache). Samples/s per
    process is the least of: the threads times the gather rate per thread measured (that order's row, over its
    threads, or over the CPUs where it ran with more threads than CPUs), the node's memory copy over
    `processes`, and, for blocks, the disk's sequential read over `processes`. Threads are as many as reach the
    other bounds, at most the node's CPUs over `processes`. With more processes than CPUs, each process gets one
    thread, which has a CPU ``cpus / processes`` of the time: the processes together are never promised more
    than every CPU of the node gathers (the rate per thread times the CPUs).

    Parameters
    ----------
    rows : sequence of mapping
        Each with ``name``, ``cache`` and ``samples_per_s`` (None when skipped).
    limits : mapping of str -> mapping
        Each with ``samples_per_s``: ``"copy_node"`` (or ``"copy"``), and ``"disk_seq"`` if measured.
    data : mapping
        ``bytes`` (every file of every key), ``samples``, ``threads`` (those the rows ran with).
    machine : mapping
        ``cpus``, ``memory_available`` (bytes, or None when unknown).
    processes : int
        Training processes on the node.

    Returns
    -------
    Recommendation
    """
    rate = {(r["name"], r["cache"]): r["samples_per_s"] for r in rows if r.get("samples_per_s")}
    lim = {k: v["samples_per_s"] for k, v in limits.items() if v.get("samples_per_s")}
    avail, cpus = machine.get("memory_available"), max(1, int(machine["cpus"]))
    fits = avail is None or data["bytes"] <= FIT_FRACTION * avail
    reasons = []
    where = "memory available unknown" if avail is None else f"{_bytes(avail)} of memory available"
    if fits:
        mode, shuffle, budget, row = "mmap", True, None, (ITERATOR, "warm")
        reasons.append(f"the files ({_bytes(data['bytes'])}) fit in the page cache ({where}): one copy serves "
                       f"every process with mode=\"mmap\"; run `npyfeed warm` on them once per node first")
    else:
        mode, shuffle, row = "direct", "blocks", (BLOCKS_ROW, "cold")
        budget = int(min(DEFAULT_MEMORY_BUDGET, avail // (4 * processes)))
        reasons.append(f"the files ({_bytes(data['bytes'])}) do not fit in the page cache ({where}): "
                       f"shuffle=\"blocks\" reads each file once per epoch, in sequence, and mode=\"direct\" keeps "
                       f"them out of the cache; memory_budget: at most a quarter of the memory available per process")
        if row not in rate:
            row = (ITERATOR, "warm")
            reasons.append("no cold blocks figure: the gather rate per thread is the warm numpy iterator's")
    bounds = {}
    # A thread's rate on a CPU of its own: threads beyond the CPUs shared them while they were measured.
    ran = min(max(1, int(data["threads"])), cpus)
    per_thread = rate[row] / ran if row in rate else None
    copy = lim.get("copy_node", lim.get("copy"))
    if copy:
        bounds["memory copy"] = copy / processes
    if shuffle == "blocks" and lim.get("disk_seq"):
        bounds["disk sequential read"] = lim["disk_seq"] / processes
    elif shuffle == "blocks":
        reasons.append("the disk was not measured (no cold measurements): its limit is left out")
    most = max(1, cpus // processes)
    # The CPUs a process's gather threads have: whole CPUs of their own, or, with more processes than CPUs, a
    # share of them. The processes together never gather faster than every CPU of the node does.
    share = min(1.0, cpus / processes)
    if per_thread:
        target = min(bounds.values()) if bounds else per_thread * most
        threads = max(1, min(most, math.ceil(target / per_thread - 1e-9)))
        bounds["gather threads"] = threads * per_thread * share
        measured = (f"the {row[0]} {row[1]} row: {rate[row]:,.0f} samples/s with {data['threads']} thread"
                    f"{'s' if int(data['threads']) > 1 else ''}" + (f" on {cpus} CPU{'s' if cpus > 1 else ''}"
                                                                  if int(data["threads"]) > cpus else ""))
        if share < 1:
            reasons.append(f"{processes} processes share the node's {cpus} CPU{'s' if cpus > 1 else ''}: one gather "
                           f"thread each, running {cpus}/{processes} of the time, so the node gathers "
                           f"{per_thread * cpus:,.0f} samples/s in all ({cpus} x {per_thread:,.0f} per CPU; "
                           f"{measured}), {bounds['gather threads']:,.0f} per process")
        else:
            reasons.append(f"{threads} gather thread{'s' if threads > 1 else ''} at {per_thread:,.0f} samples/s per "
                           f"thread ({measured}); {most} CPU{'s' if most > 1 else ''} per process")
    else:
        threads = most
    if "memory copy" in bounds:
        reasons.append(f"the node copies {bounds['memory copy'] * processes:,.0f} samples/s of batches in all, "
                       f"{bounds['memory copy']:,.0f} per process")
    if "disk sequential read" in bounds:
        reasons.append(f"the disk reads {bounds['disk sequential read'] * processes:,.0f} samples/s of files in "
                       f"sequence, {bounds['disk sequential read']:,.0f} per process")
    if avail is not None and processes * data["bytes"] > FIT_FRACTION * avail:
        reasons.append(f"the users' dict (every file np.load-ed in each process) would take "
                       f"{_bytes(processes * data['bytes'])} for {processes} process"
                       f"{'es' if processes > 1 else ''}")
    limited_by = min(bounds, key=bounds.get) if bounds else "gather threads"
    expected = bounds[limited_by] if bounds else None
    return Recommendation(mode=mode, shuffle=shuffle, threads=threads, processes=processes, memory_budget=budget,
                          expected_samples_per_s=expected, limited_by=limited_by, bounds=bounds, reasons=reasons)
