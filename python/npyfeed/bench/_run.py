"""The measurements of `npyfeed.bench.run`, in order: the data opened and its keys sampled, the memory copy, the
cold rows and the disk's limits (the sampled files dropped from the page cache before each), the warm rows (the
users' ways, npyfeed's modes, ``npyfeed.tf.dataset``), and at the end the page cache of the files that were in it
restored and the temporary folder removed."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict

import numpy as np

from .. import __version__, _core
from .._layout import index_text, write_index
from ..loading import _native, read_header
from ..plan import DEFAULT_MEMORY_BUDGET
from ..windows import WindowSource
from . import baselines, measure
from ._report import (
    BLOCKS_ROW,
    DICT_BYTES,
    DICT_ROW,
    ITERATOR,
    MAX_COLD_RESIDENCY,
    MIN_SAMPLED_KEYS,
    MODES,
    NP_LOAD_ROW,
    ROW_ORDER,
    TF_ROW,
    BenchReport,
    Limit,
    Row,
    recommend,
)
from ._text import _bytes

DEPTHS = "/".join(map(str, measure.READS_IN_FLIGHT))  # "1/4/16"


class Bench:
    """One run: the sampled sources, the measurements in order, and what must be undone at the end."""

    def __init__(self, index_files, factor_dir, label_dir, window, batch_size, threads, full, seconds, cold, tf,
                 progress, seed, bounds, sample_bytes):
        self.index_files, self.factor_dir, self.label_dir = index_files, factor_dir, label_dir
        self.window, self.batch_size, self.threads, self.full, self.seconds = window, batch_size, threads, full, seconds
        self.cold, self.tf, self.seed, self.bounds, self.sample_bytes = cold, tf, seed, bounds, sample_bytes
        self.rows: list = []
        self.limits: dict = {}
        self.notes: list = []
        self.tmp = None
        self.resident_before: list = []
        self.steps = _Steps(progress, 4 + (6 if cold else 0) + 4 + (1 if tf else 0))

    # -- the data -----------------------------------------------------------------------------------
    def open(self) -> None:
        self.steps.next("opening the index and every file")
        t0 = time.perf_counter()
        src = WindowSource(self.index_files, self.factor_dir, self.label_dir, self.window, mode="read",
                           threads=self.threads, cache=False, bounds=self.bounds)
        open_seconds = time.perf_counter() - t0
        n, keys = len(src), src.keys
        if n == 0:
            raise ValueError(f"the index has no samples: {self.index_files!r}")
        files = src.files
        sizes = np.array([os.stat(p).st_size for p in files], dtype=np.int64)
        key_bytes = sizes[:len(keys)] + sizes[len(keys):]
        self.steps.next("sampling keys")
        chosen = self._choose(key_bytes)
        fields = [], [], []
        counts = np.zeros(len(keys), np.int64)
        wanted = np.zeros(len(keys), bool)
        wanted[chosen] = True
        for start in range(0, n, 1 << 22):  # in pieces: 66M samples would be 1.6 GB of fields at once
            k, f, l = src.locate(np.arange(start, min(n, start + (1 << 22)), dtype=np.int64))
            counts += np.bincount(k, minlength=len(keys))
            if len(chosen) < len(keys):
                mask = wanted[k]
                for out, a in zip(fields, (k[mask], f[mask], l[mask])):
                    out.append(a)
        header = read_header(files[0])  # key 0's factor array (a WindowSource without member=: one per archive)
        shape, dtype = header.shape, header.dtype
        self.sampled = len(chosen) < len(keys)
        if self.sampled:
            self.tmp = tempfile.mkdtemp(prefix="npyfeed-bench-")
            k, f, l = (np.concatenate(a) for a in fields)
            names = [keys[i] for i in k.tolist()]
            self.sub_index = [write_index(os.path.join(self.tmp, "sampled-index.txt"),
                                          index_text(zip(f.tolist(), l.tolist(), names)))]
        else:
            self.sub_index = self.index_files
        del src
        self.data = {
            "index_files": [str(p) for p in ([self.index_files] if isinstance(self.index_files, (str, os.PathLike))
                                             else self.index_files)],
            "factor_dir": self.factor_dir, "label_dir": self.label_dir, "keys": len(keys), "samples": n,
            "bytes": int(sizes.sum()), "factor_shape": list(shape), "dtype": str(dtype),
            "window": self.window, "batch_size": self.batch_size, "threads": self.threads, "seed": self.seed,
            "sampled": self.sampled, "sampled_keys": len(chosen), "sampled_samples": int(counts[chosen].sum()),
            "sampled_bytes": int(key_bytes[chosen].sum()), "open_seconds": open_seconds, "full": self.full,
            "seconds_per_row": self.seconds}
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize

    def _choose(self, key_bytes: np.ndarray) -> np.ndarray:
        """The sampled keys (sorted): every key with `full` or when they fit in `sample_bytes`, else a seeded
        random set of keys whose files add up to about `sample_bytes`."""
        if self.full or key_bytes.sum() <= self.sample_bytes:
            return np.arange(len(key_bytes))
        order = np.random.default_rng(self.seed).permutation(len(key_bytes))
        take = int(np.searchsorted(np.cumsum(key_bytes[order]), self.sample_bytes)) + 1
        return np.sort(order[:max(take, min(MIN_SAMPLED_KEYS, len(key_bytes)))])

    def source(self, mode: str) -> WindowSource:
        return WindowSource(self.sub_index, self.factor_dir, self.label_dir, self.window, mode=mode,
                            threads=self.threads, cache=False, bounds=self.bounds)

    # -- the measurements ----------------------------------------------------------------------------
    def measure(self) -> None:
        self.open()
        src = self.source("read")
        self.files = list(src.files)
        self.out_bytes = 4 * (int(np.prod(src.x_shape)) + int(np.prod(src.y_shape) if src.y_shape else 1))
        self.order = src.epoch_order(0, shuffle=True, seed=self.seed)
        self.keys = src.keys
        self.key_of = src.locate  # key number, feature_index, label_index of sample ids
        self.fields_src = src
        native = [_native(p) for p in self.files]
        sizes, _ = _core.warm_files(native, self.threads, False, None)
        self.resident_before = [p for p, (size, before, _) in zip(self.files, sizes) if size and 2 * before >= size]
        self.steps.next("memory copy")
        self._copy_limits()
        if self.cold:
            self._cold_rows()
        self._warm_rows()

    def _copy_limits(self) -> None:
        node = measure.machine_info()["cpus"]
        # 64 MB per thread (well past the CPU caches), at most 2 GB of buffers on a large node; best of 5.
        per = max(8 << 20, min(64 << 20, (1 << 30) // max(node, self.threads)))
        one = measure.memcpy_bandwidth(1, per, repeats=5)
        many = one if self.threads == 1 else measure.memcpy_bandwidth(self.threads, per, repeats=5)
        self._limit("copy_1", "memory copy, 1 thread", one, self.out_bytes)
        self._limit("copy", f"memory copy, {self.threads} threads", many, self.out_bytes)
        if node != self.threads:  # the node's figure, which its processes share
            every = one if node == 1 else measure.memcpy_bandwidth(node, per, repeats=5)
            self._limit("copy_node", f"memory copy, {node} threads (every CPU)", every, self.out_bytes)

    def _limit(self, key: str, name: str, gbps, bytes_per_sample: float, note: str = "") -> None:
        rate = None if gbps is None else gbps * measure.GB / bytes_per_sample
        self.limits[key] = Limit(name, gbps, rate, note)

    def _drop(self) -> float:
        """Drop the sampled files from the page cache; the fraction of their bytes still there."""
        measure.evict(self.files)
        sizes, _ = _core.warm_files([_native(p) for p in self.files], self.threads, False, None)
        total = sum(s for s, _, _ in sizes)
        return sum(b for _, b, _ in sizes) / total if total else 0.0

    def _cold_rows(self) -> None:
        factor_files = self.files[:len(self.keys)]
        self.steps.next("disk sequential read")
        seq_files, total = [], 0
        for p in factor_files:  # whole files, up to 512 MB of them
            seq_files.append(p)
            total += os.path.getsize(p)
            if total >= 512 << 20:
                break
        seq = measure.odirect_seq_bandwidth(seq_files, self.threads)
        per_sample_file = self.data["bytes"] / self.data["samples"]
        self._limit("disk_seq", "disk sequential read (O_DIRECT)", seq, per_sample_file,
                    f"whole files, {self.threads} threads; {_bytes(per_sample_file)} of files per sample"
                    if seq is not None else "O_DIRECT refused by this filesystem")
        self.steps.next("disk random read")
        block = self.window * self.row_bytes
        rand = measure.random_read_limit(factor_files, self.threads, block, reads=1000, seed=self.seed)
        self._limit("disk_random", f"disk random read, {_bytes(block)} (O_DIRECT)",
                    None if rand is None else rand.gbps, block,
                    f"one window per read, best of {DEPTHS} reads in flight per thread ({rand.threads})" if rand else
                    "O_DIRECT refused by this filesystem")
        # The same reads through the page cache: the limit of the modes that read through it ("mmap", "read").
        cached = measure.random_read_limit(factor_files, self.threads, block, reads=1000, seed=self.seed,
                                           buffered=True)
        # Where the files stay cached (tmpfs, mapped elsewhere), those reads measured memory, not a disk.
        if cached is not None and self._drop() <= MAX_COLD_RESIDENCY:
            self._limit("disk_random_cached", f"disk random read, {_bytes(block)} (page cache)", cached.gbps, block,
                        f"the same reads without O_DIRECT, best of {DEPTHS} in flight per thread ({cached.threads}): "
                        'the limit of mode="mmap" and "read", whose cold reads go through the page cache')
        if seq is None:
            self.limits.pop("disk_seq")
        if rand is None:
            self.limits.pop("disk_random")
        budget = int(min(DEFAULT_MEMORY_BUDGET, max(self.data["sampled_bytes"] // 4, 16 << 20)))
        # A cold row reads at most half the sampled windows' bytes, so that it does not find its own reads cached.
        most = max(2 * self.batch_size, int(sum(os.path.getsize(p) for p in factor_files) / (2 * block)))
        for mode in MODES + ("blocks",):
            name = BLOCKS_ROW if mode == "blocks" else f'npyfeed mode="{mode}"'
            self.steps.next(f"{name}, cold")
            resident = self._drop()
            if resident > MAX_COLD_RESIDENCY and not (mode == "direct"):
                self.rows.append(Row(name, "cold", skipped=f"{resident:.0%} of the files stayed in the page cache "
                                                           f"after posix_fadvise(DONTNEED)"))
                continue
            if mode == "blocks":
                src = self.source("direct")
                row = self._iterate(name, "cold", src, shuffle="blocks", memory_budget=budget)
                row.note = _join(row.note, f"mode=\"direct\", memory_budget={_bytes(budget)}")
            else:
                src = self.source(mode)
                row = self._iterate(name, "cold", src, most=None if self.full else most)
                if mode == "direct" and resident > MAX_COLD_RESIDENCY:
                    row.note = _join(row.note, "O_DIRECT reads around the page cache, which could not be dropped")
            if src.direct_fallback:
                row.note = _join(row.note, "O_DIRECT refused by this filesystem: buffered reads")
            del src
            self.rows.append(row)
        if any(r.skipped for r in self.rows):
            self.notes.append("cold rows were skipped where the page cache of the sampled files could not be dropped "
                              "(pages mapped by another process, or not yet written back)")

    def _warm_rows(self) -> None:
        self.steps.next("reading the sample into the page cache")
        sizes, _ = _core.warm_files([_native(p) for p in self.files], max(8, self.threads), True, None)
        total = sum(s for s, _, _ in sizes)
        resident = sum(a for _, _, a in sizes) / total if total else 1.0
        if resident < 0.98:
            self.notes.append(f"only {resident:.0%} of the sampled files stayed in the page cache: the warm rows "
                              f"read part of them from disk")
        self.steps.next(DICT_ROW)
        self.rows.append(self._dict_row())
        self.steps.next(NP_LOAD_ROW)
        self.rows.append(self._np_load_row())
        for mode in ("mmap", "read"):
            self.steps.next(f'npyfeed mode="{mode}", warm')
            self.rows.append(self._iterate(f'npyfeed mode="{mode}"', "warm", self.source(mode)))
        if self.tf:
            self.steps.next("npyfeed.tf.dataset")
            self.rows.append(self._tf_row())

    # -- one row each ---------------------------------------------------------------------------------
    def _iterate(self, name, cache, src, shuffle=True, memory_budget=None, most=None) -> Row:
        kw = {"memory_budget": memory_budget} if memory_budget else {}
        limit = None if self.full else self.seconds
        with src.batches(self.batch_size, shuffle=shuffle, seed=self.seed, **kw) as it:
            return self._time(name, cache, it, limit, most)

    def _time(self, name, cache, batches, seconds, most, exhausted="a whole epoch") -> Row:
        """Consume `batches` for `seconds` after the first batch (all of them with None), or up to `most` samples;
        `exhausted` is the row's note when `batches` ends first. The rate leaves the first batch out (with one
        batch in all, its own)."""
        run = measure.time_batches(batches, most_samples=most, seconds=seconds)
        if run.batches == 0:
            return Row(name, cache, skipped="no batch")
        note = {"end": exhausted, "samples": "stopped at half the sampled files' bytes, so as not to find its own "
                                             "reads cached"}.get(run.stopped, "")
        steady = run.batches > 1
        return Row(name, cache, samples_per_s=run.steady_samples_per_s, batches=run.batches - steady,
                   seconds=run.seconds - run.first_s if steady else run.seconds, first_batch_s=run.first_s,
                   note=note)

    def _lines(self, ids) -> list:
        k, f, l = self.key_of(ids)
        keys = self.keys
        return [f"{a},{b},{keys[c]}".encode() for a, b, c in zip(f.tolist(), l.tolist(), k.tolist())]

    def _python_batches(self, fn, lines):
        """The users' per-sample function over `lines`, batched as their ``tf.data`` pipeline batches it."""
        b = self.batch_size
        for start in range(0, len(lines) - b + 1, b):
            xs, ys = [], []
            for line in lines[start:start + b]:
                x, y = fn(line)
                xs.append(x)
                ys.append(y)
            yield np.stack(xs), np.stack(ys)

    def _dict_row(self) -> Row:
        key_ids, _, _ = self.key_of(self.order)
        nkeys = len(self.keys)
        sizes = [os.path.getsize(self.files[k]) + os.path.getsize(self.files[nkeys + k]) for k in range(nkeys)]
        take = max(1, int(np.searchsorted(np.cumsum(sizes), DICT_BYTES, side="right")))
        ids = self.order[key_ids < take][:1 << 18]
        if len(ids) < 2 * self.batch_size:
            take, ids = nkeys, self.order[:1 << 18]
        t0 = time.perf_counter()
        held = {"factor_dict": baselines.load_factor_files({self.keys[k]: self.files[k] for k in range(take)}),
                "label_dict": baselines.load_factor_files({self.keys[k]: self.files[nkeys + k] for k in range(take)})}
        load = time.perf_counter() - t0
        lines = self._lines(ids)
        row = self._time(DICT_ROW, "warm", self._python_batches(baselines.dict_sample(held, self.window), lines),
                         self.seconds, None, f"all {len(lines):,} samples it was given")
        every = load * self.data["keys"] / take
        row.note = _join(row.note, f"{take} keys np.load-ed in {load:.2f} s: {every:,.1f} s and "
                                   f"{_bytes(self.data['bytes'])} per process for every key")
        return row

    def _np_load_row(self) -> Row:
        nkeys = len(self.keys)
        factors, labels = dict(zip(self.keys, self.files[:nkeys])), dict(zip(self.keys, self.files[nkeys:]))
        fn = baselines.np_load_sample(factors, labels, self.window)
        lines = self._lines(self.order[:1 << 14])
        return self._time(NP_LOAD_ROW, "warm", self._python_batches(fn, lines), self.seconds, None,
                          f"all {len(lines):,} samples it was given")

    def _tf_row(self) -> Row:
        try:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            import tensorflow  # noqa: F401

            from .. import tf as npyfeed_tf
        except ImportError:
            self.notes.append("TensorFlow is not installed (pip install 'npyfeed[tf]'): no tf.data row")
            return Row(TF_ROW, "warm", skipped="TensorFlow is not installed")
        src = self.source("mmap")
        ds = npyfeed_tf.dataset(src, self.batch_size, shuffle=True, seed=self.seed)
        row = self._time(TF_ROW, "warm", iter(ds), None if self.full else self.seconds, None)
        row.note = _join(row.note, "a Python loop over eager tensors")
        return row

    # -- the end ----------------------------------------------------------------------------------------
    def close(self) -> None:
        self.fields_src = self.key_of = None
        if self.resident_before:  # leave the page cache as we found it for the files that were in it
            _core.warm_files([_native(p) for p in self.resident_before], max(8, self.threads), True, None)
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.steps.close()

    def report(self, processes: int) -> BenchReport:
        machine = measure.machine_info()
        machine["memory_available"] = measure.available_memory()
        machine["npyfeed"] = __version__
        try:
            machine["load"] = f"{os.getloadavg()[0]:.1f}"
        except OSError:
            machine["load"] = "unknown"
        self.rows.sort(key=lambda r: ROW_ORDER.index((r.name, r.cache)))
        ref = {r.cache: r.samples_per_s for r in self.rows if r.name == ITERATOR and r.samples_per_s}
        for r in self.rows:
            if r.samples_per_s is None:
                continue
            r.gbps = r.samples_per_s * self.out_bytes / measure.GB
            r.vs_iterator = r.samples_per_s / ref[r.cache] if r.cache in ref else None
            r.limit = self._row_limit(r)
            lim = self.limits.get(r.limit)
            r.vs_limit = r.samples_per_s / lim.samples_per_s if lim and lim.samples_per_s else None
        if self.sampled:
            self.notes.insert(0, f"{self.data['sampled_keys']:,} of {self.data['keys']:,} keys measured (seed "
                                 f"{self.seed}); --full measures every key")
        rec = recommend([asdict(r) for r in self.rows], {k: asdict(v) for k, v in self.limits.items()}, self.data,
                        machine, processes)
        return BenchReport(self.rows, self.limits, self.data, machine, rec, processes, self.notes,
                           date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))

    def _row_limit(self, row: Row) -> str | None:
        """The limit a row is held against: memory copy when warm, the disk's reads when cold (random for a
        global shuffle: with O_DIRECT for mode="direct", through the page cache for the others; sequential for
        blocks), whichever of the two allows fewer samples/s."""
        names = ["copy"]
        if row.cache == "cold":
            if row.name == BLOCKS_ROW:
                names.append("disk_seq")
            else:
                names.append("disk_random" if row.name == 'npyfeed mode="direct"' else "disk_random_cached")
        found = [n for n in names if n in self.limits and self.limits[n].samples_per_s]
        return min(found, key=lambda n: self.limits[n].samples_per_s) if found else None


class _Steps:
    """The progress bar (tqdm; steps done out of `total`), or one line per step on stderr without tqdm."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.bar, self.total, self.started = enabled, None, total, False
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, desc="npyfeed bench", file=sys.stderr, leave=False,
                            bar_format="{desc} {n_fmt}/{total_fmt} {bar} {elapsed}")

    def next(self, what: str) -> None:
        if self.bar is not None:
            if self.started and self.bar.n < self.total:
                self.bar.update(1)  # the step before is done
            self.bar.set_description_str(f"npyfeed bench: {what}")
        elif self.enabled:
            print(f"npyfeed bench: {what} ...", file=sys.stderr, flush=True)
        self.started = True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _join(a: str, b: str) -> str:
    return "; ".join(t for t in (a, b) if t)
