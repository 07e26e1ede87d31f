#!/usr/bin/env python3
"""Window batches: the users' tf.numpy_function pipelines and the best numpy against npyfeed, warm and cold.

In ONE run, on a data set in the users' layout (default 400 files of (4800, 256), float32 and float64 sources,
W=100, B=256), every contender gathers the SAME samples in the SAME seeded shuffled order into float32 batches
(its first batch checked against per-sample ``np.load`` slicing): (a) the users' advised ``tf.numpy_function``
that ``np.load``s both whole files per sample; (b) their preloaded dict with a ``numpy_function`` per sample and
(c) per batch; (d) the best vectorised numpy (one fancy index into a window view of every key stacked in RAM);
(m) ``np.load(mmap_mode="r")`` sliced per sample; (e) npyfeed's numpy iterator per mode (and over
``from_arrays``); (f) ``npyfeed.tf.dataset`` read by a Python loop (the hand-off's other consumers, its floors and
the ``numpy_function`` fallback: ``bench_handoff.py``); (t) TensorFlow's ``tf.gather`` over the whole data set
as one in-RAM tensor; (o) (e) ``"mmap"`` with one gather option; ``keras``, ``torch``: the framework adapters.

Warm = every file in the page cache; cold = every file evicted (``posix_fadvise``, residency checked with
``mincore``) before EACH cold measurement, sources opened fresh each time. The limits are measured in the same
rounds: the memory copy (warm) and the disk's random reads of one window, with O_DIRECT and through the page
cache (cold). Contenders run interleaved, rotated each round; the table shows the best round and the median,
ratios against (a), (b), (e) and the limit, then the targets. bench/README.md describes every column.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import npyfeed  # noqa: E402
from npyfeed.bench import baselines  # noqa: E402
from npyfeed.bench.measure import random_read_limit, time_batches  # noqa: E402

TABLE_HEADER = ("contender", "src", "cache", "batches", "samples/s", "median", "1st ms", "cpu us/smp", "read B/smp", "x (a)",
                "x (b)", "x (e)", "limit", "x limit", "x page-cache limit", "setup")
OPTION_HEADER = ("option", "src", "plain samples/s", "samples/s", "median", "x plain", "plain cpu us", "cpu us",
                 "cpu x plain", "needed", "status", "status (cpu)")
USERS_PARALLEL_CALLS = 8  # the users' map(parser, num_parallel_calls=8) (README migration section)
MAX_COLD_RESIDENCY = 0.02  # a cold measurement that finds more of the data cached than this is not cold
DEFAULT_WINDOW = common.DataSpec.window  # data sets generated for this window are shared with bench_load.py
PRELOAD_TEXT = {"dict": "np.load {:.1f} s cold", "stack": "stack {:.1f} s", "tf_tensor": "tensor {:.1f} s"}


# ------------------------------------------------------------------------------------------- the data


def _check_count(src, samples: int) -> None:
    if len(src) != samples:
        raise SystemExit(f"npyfeed sees {len(src)} samples, the index parsed here {samples}")


class Data:
    """One source dtype's data set, its index as parsed here (independently of npyfeed) and shared state."""

    def __init__(self, args, dtype: str, log: Callable[[str], None]):
        self.window, self.batch, self.threads, self.seed = args.window, args.batch, args.threads, args.seed
        self.cols, self.label_cols, self.log = args.cols, args.labels, log
        spec_window = max(args.window, DEFAULT_WINDOW)
        parent = Path(args.dir) if spec_window == DEFAULT_WINDOW else Path(args.dir) / f"window{spec_window}"
        spec = common.DataSpec(files=args.files, rows=args.rows, cols=args.cols, dtype=dtype,
                               label_cols=args.labels, window=spec_window)
        self.ds = ds = common.make_dataset(parent, spec, log=log)
        # One factor and one label folder holding every key (symlinks into the per-stock folders); key -> real path.
        self.factor_dir, self.label_dir = common.link_dir(parent / "windows-links" / spec.name, ds)
        self.factor_path, self.label_path = ({os.path.basename(path)[:-4]: path for path in paths}
                                             for paths in (ds.factor_paths, ds.label_paths))
        log(f"  parsing the index ({len(ds.index_paths)} files) ...")  # in file then line order: npyfeed's order
        lines = [line.strip() for path in ds.index_paths for line in Path(path).read_bytes().split(b"\n")
                 if line.strip()]
        fields = [line.split(b",") for line in lines]  # feature_index,label_index,key
        self.feature_index, self.label_index = (np.array([int(f[i]) for f in fields], dtype=np.int64) for i in (0, 1))
        keys = [f[2].strip().decode() for f in fields]
        self.key_names = list(dict.fromkeys(keys))  # per key id
        ids = {k: i for i, k in enumerate(self.key_names)}
        # Per sample, in index order (= npyfeed sample id with bounds="error").
        self.key_id = np.array([ids[k] for k in keys], dtype=np.int64)
        self.lines = np.array(lines)  # per sample, the index line as bytes (what the users' numpy_function receives)
        src = npyfeed.WindowSource(ds.index_paths, self.factor_dir, self.label_dir, args.window, mode="read",
                                   threads=args.threads)
        _check_count(src, len(lines))
        # The shuffled epoch, sample ids: what src.batches(shuffle=True, seed) yields.
        self.order = np.asarray(src.epoch_order(0, shuffle=True, seed=args.seed), dtype=np.int64)
        self.setup: dict = {}  # one-off preload (PRELOAD_TEXT's names) -> seconds
        self._dicts = self._stacked = None

    @property
    def paths(self) -> list:
        return self.ds.factor_paths + self.ds.label_paths

    def ids(self, batches: int) -> np.ndarray:
        return self.order[: batches * self.batch]

    def dicts(self) -> tuple:
        """The users' load_factor_files: {key: np.load(path)} for factors and labels, loaded once, cold (timed)."""
        if self._dicts is None:
            self.log("  setup: np.load loop into dicts (cold cache) ...")
            common.evict(self.paths)
            t0 = time.perf_counter()
            self._dicts = tuple(baselines.load_factor_files({k: paths[k] for k in self.key_names})
                                for paths in (self.factor_path, self.label_path))
            self.setup["dict"] = time.perf_counter() - t0
        return self._dicts

    def stacked(self) -> tuple:
        """(d)'s setup: one (K, T, F) float32 array, its window view, and per-sample start rows (timed).
        Returns (windows, row0, labels (K*T, L), label row per sample, the (K, T, F) array)."""
        if self._stacked is None:
            factors, labels = self.dicts()
            self.log("  setup: stacking into one float32 array ...")
            t0 = time.perf_counter()
            keys, w = self.key_names, self.window
            rows, cols = factors[keys[0]].shape
            label_shape = labels[keys[0]].shape
            big = np.empty((len(keys), rows, cols), dtype=np.float32)
            lab = np.empty((len(keys),) + label_shape, dtype=np.float32)
            for i, k in enumerate(keys):
                big[i] = factors[k]  # converts float64 once, here
                lab[i] = labels[k]
            flat = big.reshape(-1, cols)
            windows = np.lib.stride_tricks.as_strided(flat, shape=(flat.shape[0] - w + 1, w, cols),
                                                      strides=(flat.strides[0],) + flat.strides, writeable=False)
            row0 = self.key_id * rows + self.feature_index - w + 1
            lab_row = self.key_id * label_shape[0] + self.label_index
            self.setup["stack"] = time.perf_counter() - t0
            self._stacked = (windows, row0, lab.reshape(len(keys) * label_shape[0], -1), lab_row, big)
        return self._stacked

    def release(self) -> None:
        self._dicts = None
        self._stacked = None


def reference_batch(data: Data, ids: np.ndarray) -> tuple:
    """The oracle: per-sample slicing of np.load(mmap_mode="r") arrays, astype(float32)."""
    w = data.window
    xs, ys = [], []
    for i in ids.tolist():
        key = data.key_names[data.key_id[i]]
        f = np.load(data.factor_path[key], mmap_mode="r")
        lab = np.load(data.label_path[key], mmap_mode="r")
        fi = int(data.feature_index[i])
        xs.append(np.asarray(f[fi - w + 1: fi + 1], dtype=np.float32))
        ys.append(np.asarray(lab[int(data.label_index[i])], dtype=np.float32))
    return np.stack(xs), np.stack(ys)


# ------------------------------------------------------------------------------------------ contenders
#
# A contender's open(data, batches) does the per-measurement setup (timed in cold rows only) and returns start():
# one pass over data.order, an iterator of (x, y) batches; close() releases what open() made.


class Contender:
    tag = ""  # "a".."f" as in the issue, "m" for mmap slicing
    name = ""
    mode = None  # npyfeed's WindowSource mode
    caches = ("warm", "cold")
    batches_flag = "batches"  # which --*-batches flag sets its batch count
    preload = ()  # the one-off setups it needs (Data.setup names): its setup column instead of the open time

    def __init__(self, tf=None, **attrs):  # attrs: this instance's values of the class attributes above
        self.tf, self.open_times = tf, []
        self.__dict__.update(attrs)

    @property
    def key(self) -> str:
        return self.tag if self.mode is None else f"{self.tag}-{self.mode}"

    def open(self, data: Data, batches: int) -> Callable[[], object]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def timed_open(self, make: Callable[[], object]) -> object:
        t0 = time.perf_counter()
        opened = make()
        self.open_times.append(time.perf_counter() - t0)
        return opened

    def setup_text(self, data: Data) -> str:
        if self.preload:
            return " + ".join(PRELOAD_TEXT[k].format(data.setup.get(k, float("nan"))) for k in self.preload)
        return f"open {statistics.median(self.open_times):.2f} s" if self.open_times else "-"

    def matches(self, x, y, want_x, want_y) -> bool:
        """The first batch against the oracle's (contenders with gather options transform the oracle)."""
        return x.dtype == np.float32 and np.array_equal(x, want_x) and np.array_equal(y, want_y.reshape(y.shape))


class TFPipeline(Contender):
    dataset = None
    held = None  # what the numpy_function reads; emptied by close() (TensorFlow keeps the function)

    def close(self) -> None:
        self.dataset = None
        if self.held:
            self.held.clear()

    def serve(self, dataset) -> Callable[[], object]:
        self.dataset = dataset
        return lambda: iter(self.dataset)

    def hold_dicts(self, data: Data) -> dict:
        self.held = dict(zip(("factor_dict", "label_dict"), data.dicts()))
        return self.held

    def per_sample(self, data: Data, ids: np.ndarray, fn) -> object:
        tf, w, f, lc = self.tf, data.window, data.cols, data.label_cols

        def parser(line):
            x, y = tf.numpy_function(fn, [line], (tf.float32, tf.float32))
            return tf.reshape(x, (w, f)), tf.reshape(y, (lc,))

        return (tf.data.Dataset.from_tensor_slices(data.lines[ids])
                .map(parser, num_parallel_calls=USERS_PARALLEL_CALLS).batch(data.batch).prefetch(1))


class UsersNpLoad(TFPipeline):
    tag, name = "a", "(a) users' np.load per sample"
    batches_flag = "users_batches"

    def open(self, data, batches):
        get_data_from_cache = baselines.np_load_sample(data.factor_path, data.label_path, data.window)
        return self.serve(self.per_sample(data, data.ids(batches), get_data_from_cache))

    def setup_text(self, data):
        return "none"


class DictPerSample(TFPipeline):
    tag, name = "b", "(b) dict + per-sample numpy_function"
    caches, batches_flag, preload = ("warm",), "python_batches", ("dict",)

    def open(self, data, batches):
        get_data_from_cache = baselines.dict_sample(self.hold_dicts(data), data.window)
        return self.serve(self.per_sample(data, data.ids(batches), get_data_from_cache))


class DictPerBatch(TFPipeline):
    tag, name = "c", "(c) dict + per-batch numpy_function"
    caches, batches_flag, preload = ("warm",), "python_batches", ("dict",)

    def open(self, data, batches):
        tf, held = self.tf, self.hold_dicts(data)
        w, f, lc = data.window, data.cols, data.label_cols

        def gather_batch(lines):
            factor_dict, label_dict = held["factor_dict"], held["label_dict"]
            x = np.empty((len(lines), w, f), dtype=np.float32)
            y = np.empty((len(lines), lc), dtype=np.float32)
            for i, line in enumerate(lines):
                feature_index, label_index, key = line.decode().split(",")
                feature_index = int(feature_index)
                x[i] = factor_dict[key][feature_index - w + 1: feature_index + 1]
                y[i] = label_dict[key][int(label_index)]
            return x, y

        def parser(lines):
            x, y = tf.numpy_function(gather_batch, [lines], (tf.float32, tf.float32))
            return tf.ensure_shape(x, (None, w, f)), tf.ensure_shape(y, (None, lc))

        return self.serve(tf.data.Dataset.from_tensor_slices(data.lines[data.ids(batches)]).batch(data.batch)
                          .map(parser, num_parallel_calls=USERS_PARALLEL_CALLS).prefetch(1))


class NumpyVectorised(Contender):
    tag, name = "d", "(d) numpy vectorised (window view)"
    caches, preload = ("warm",), ("dict", "stack")

    def open(self, data, batches):
        windows, row0, lab_flat, lab_row, _ = data.stacked()
        ids, b = data.ids(batches), data.batch

        def start():
            for s in range(0, len(ids), b):
                chunk = ids[s:s + b]
                yield windows[row0[chunk]], lab_flat[lab_row[chunk]]  # (B, W, F): one fancy index, W*F per sample
        return start


class MmapSlicing(Contender):
    tag, name = "m", "np mmap slicing per sample"
    batches_flag = "python_batches"
    arrays = None

    def open(self, data, batches):
        self.arrays = self.timed_open(lambda: tuple({k: np.load(p, mmap_mode="r") for k, p in paths.items()}
                                                    for paths in (data.factor_path, data.label_path)))
        factors, labels = self.arrays
        ids, b, w = data.ids(batches), data.batch, data.window
        names, key_id, fidx, lidx = data.key_names, data.key_id, data.feature_index, data.label_index
        f, lc = data.cols, data.label_cols

        def start():
            for s in range(0, len(ids), b):
                chunk = ids[s:s + b].tolist()
                x = np.empty((len(chunk), w, f), dtype=np.float32)
                y = np.empty((len(chunk), lc), dtype=np.float32)
                for i, sample in enumerate(chunk):
                    key = names[key_id[sample]]
                    fi = int(fidx[sample])
                    x[i] = factors[key][fi - w + 1: fi + 1]
                    y[i] = labels[key][lidx[sample]]
                yield x, y
        return start

    def close(self):
        self.arrays = None  # unmaps: the pages can then be evicted


class Npyfeed(Contender):
    tag, mode = "e", "mmap"
    options: dict = {}  # WindowSource gather options: the (o) rows
    src = None

    @property
    def name(self) -> str:
        return f"(e) npyfeed batches {self.mode}"

    def make_source(self, data: Data):
        src = self.timed_open(lambda: npyfeed.WindowSource(data.ds.index_paths, data.factor_dir, data.label_dir,
                                                           data.window, mode=self.mode, threads=data.threads,
                                                           **self.options))
        _check_count(src, len(data.feature_index))
        return src

    def open(self, data, batches):
        self.src = self.make_source(data)
        return lambda: self.src.batches(data.batch, shuffle=True, seed=data.seed, epoch=0)

    def close(self):
        self.src = None


class NpyfeedArrays(Npyfeed):
    """WindowSource.from_arrays over the preloaded dict: the same C++ gather, reading anonymous memory."""

    name, mode, caches, preload = "(e) npyfeed batches from_arrays(dict)", "memory", ("warm",), ("dict",)

    def make_source(self, data):
        factors, labels = data.dicts()
        return self.timed_open(lambda: npyfeed.WindowSource.from_arrays(data.ds.index_paths, factors, labels,
                                                                        data.window, threads=data.threads))


class _SourceHandle:
    """Forwards to a WindowSource until release(): then the source, its mappings and descriptors can go.

    TensorFlow keeps a dataset's Python callables (``from_generator``'s generator, a ``numpy_function``) alive after
    the dataset and its iterators are gone. npyfeed.tf holds its source only weakly from there (since issue 11),
    but the handle keeps the benchmark safe either way: a pinned source's mapped pages cannot be evicted, and later
    cold measurements would read them from memory. It changes nothing per batch: the source is looked up once.
    """

    def __init__(self, src):
        self._src = src

    def __getattr__(self, name):
        src = self.__dict__.get("_src")
        if src is None:
            raise RuntimeError("source released")
        return getattr(src, name)

    def __len__(self):
        return len(self._src)

    def release(self) -> None:
        self._src = None


class NpyfeedTF(Npyfeed):
    """(f) npyfeed.tf.dataset over a fresh source, read by a Python loop over eager tensors (its native op; the
    other consumers, the floors and the numpy_function fallback: bench_handoff.py)."""

    tag, name = "f", "(f) npyfeed.tf.dataset mmap"
    dataset = handle = None

    def open(self, data, batches):
        import npyfeed.tf as nftf

        if not npyfeed.build_info(tf=True)["tf_ops_loadable"]:
            raise SystemExit("npyfeed.tf's op library did not load: no (f) row")
        self.handle = _SourceHandle(self.make_source(data))
        # A new dataset per measurement: its first pass is epoch 0, the order every contender uses.
        self.dataset = nftf.dataset(self.handle, data.batch, shuffle=True, seed=data.seed)
        return lambda: iter(self.dataset)

    def close(self):
        self.dataset = None
        if self.handle is not None:
            self.handle.release()
            self.handle = None


class TFInRamGather(TFPipeline):
    """The strongest pure-TensorFlow pipeline a user could write instead: every factor array concatenated into
    one in-RAM float32 tensor (K*T, F), the labels into (K*T, L), the index as int64 tensors; a batch is ONE
    tf.gather of its (B, W) rows (and one of its labels) in a parallel map. No Python per batch or sample."""

    tag, name = "t", "(t) TensorFlow in-RAM tf.gather, parallel map"
    caches, preload = ("warm",), ("dict", "stack", "tf_tensor")

    tensors = None  # (factors, labels, row0, label_row): built once (contenders are built per data set)

    def open(self, data, batches):
        tf = self.tf
        if self.tensors is None:
            _, row0, lab_flat, lab_row, big = data.stacked()
            t0 = time.perf_counter()
            factors, labels = tf.constant(big.reshape(-1, data.cols)), tf.constant(lab_flat)
            data.setup["tf_tensor"] = time.perf_counter() - t0
            self.tensors = (factors, labels, tf.constant(row0), tf.constant(lab_row))
        factors, labels, row0, lab_row = self.tensors
        offsets = tf.range(data.window, dtype=tf.int64)

        def gather(ids):
            rows = tf.gather(row0, ids)[:, None] + offsets  # (B, W)
            return tf.gather(factors, rows), tf.gather(labels, tf.gather(lab_row, ids))

        return self.serve(tf.data.Dataset.from_tensor_slices(data.ids(batches)).batch(data.batch)
                          .map(gather, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))


# ------------------------------------------------------------------------------ gather options (o)
#
# (e) npyfeed mmap with one gather option each (features=, label_columns=, nan=/posinf=/neginf=, normalize=),
# warm, interleaved with the plain (e) mmap rows of the same run: each option's cost is its "x (e)" ratio.


def option_cases(cols: int, label_cols: int) -> dict:
    """Name -> WindowSource options, at the data set's shape."""
    rng = np.random.default_rng(0)
    mean = rng.standard_normal(cols).astype(np.float32)
    std = (rng.random(cols) + 0.5).astype(np.float32)
    quarter = max(cols // 4, 1)
    return {
        f"features=slice(0, {quarter})": {"features": slice(0, quarter)},
        f"features=every 4th ({quarter})": {"features": list(range(0, cols, 4))},
        "label_columns=[0]": {"label_columns": [0]},
        "nan=0, posinf=1e6, neginf=-1e6": {"nan": 0.0, "posinf": 1e6, "neginf": -1e6},
        f"normalize=(mean, std) ({cols},)": {"normalize": (mean, std)},
        "all of them": {"features": slice(0, quarter), "label_columns": [0] if label_cols > 0 else None,
                        "nan": 0.0, "posinf": 1e6, "neginf": -1e6,
                        "normalize": (mean[:quarter], std[:quarter])},
    }


def apply_options(options: dict, x: np.ndarray, y: np.ndarray) -> tuple:
    """What the options do, in numpy (the oracle of an option row's first batch)."""
    if options.get("features") is not None:
        x = x[..., options["features"]]
    if options.get("label_columns") is not None:
        y = y.reshape(len(y), -1)[:, options["label_columns"]]
    if "nan" in options:
        x = np.nan_to_num(x, nan=options["nan"], posinf=options["posinf"], neginf=options["neginf"])
        y = np.nan_to_num(y, nan=options["nan"], posinf=options["posinf"], neginf=options["neginf"])
    if "normalize" in options:
        mean, std = options["normalize"]
        x = (x - mean) / std
    return x, y


class NpyfeedOption(Npyfeed):
    """(o) = (e) npyfeed batches mmap, warm, with gather options."""

    tag, caches = "o", ("warm",)
    label = ""

    @property
    def name(self) -> str:
        return f"(o) npyfeed mmap {self.label}"

    @property
    def key(self) -> str:
        return f"o-{self.name}"

    def matches(self, x, y, want_x, want_y) -> bool:
        want_x, want_y = apply_options(self.options, want_x, want_y)
        return (x.dtype == np.float32 and x.shape == want_x.shape and y.size == want_y.size
                and np.allclose(x, want_x, rtol=1e-6, atol=1e-6) and np.array_equal(y, want_y.reshape(y.shape)))


def option_rows(results: list, by: dict) -> list:
    """Per option row: samples/s against plain (e) mmap warm of the same rounds (`ratio`), and the target (at most
    10% slower; a quarter of the columns faster than plain). Also by CPU time per sample (the work, all threads),
    which a loaded machine inflates far less than wall time: the status by that ratio (plain's CPU over the
    option's) stands beside the one by samples/s."""
    out = []
    for r in results:
        plain = by[r.dtype].get("e-mmap warm")
        if r.contender.tag != "o" or not plain:
            continue
        speed, cpu = ratio(r, plain), ratio(r, plain, "cpu_us")  # cpu > 1: less work per sample than plain
        faster = "features=slice" in r.contender.label
        status = ["met" if (x > 1.0 if faster else x >= 0.9) else "MISSED" for x in (speed, cpu)]
        out.append([r.contender.label, r.dtype, f"{plain.best:,.0f}", f"{r.best:,.0f}", f"{r.median:,.0f}",
                    f"{speed:.2f}x", f"{plain.best_cpu_us:.1f}", f"{r.best_cpu_us:.1f}", f"{cpu:.2f}x",
                    ">1.00x" if faster else ">=0.90x", *status])
    return out


# ---------------------------------------------------------------- framework adapters (Keras 3, PyTorch)
#
# Rows "keras" and "torch" (``--only keras,torch``): the adapters of npyfeed.keras and npyfeed.torch over a
# mode="mmap" source, read as their frameworks read them, against (e) npyfeed mmap in the same run. Warm only:
# the gather is (e)'s, so a cold row would measure the same reads again.


class NpyfeedKeras(Npyfeed):
    """npyfeed.keras.PyDataset: ``ds[i]`` for i = 0, 1, ... within one epoch, as Keras' data adapter asks
    (``fit(..., shuffle=False)``); the backend does not matter here, the items are numpy batches."""

    tag, name, caches = "keras", "npyfeed.keras.PyDataset mmap", ("warm",)

    def open(self, data, batches):
        import npyfeed.keras as nfk

        self.src = self.make_source(data)
        ds = nfk.PyDataset(self.src, data.batch, shuffle=True, seed=data.seed)

        def start():
            ds.on_epoch_begin()
            return (ds[i] for i in range(len(ds)))
        return start


class NpyfeedTorch(Npyfeed):
    """npyfeed.torch.WindowDataset in ``DataLoader(ds, batch_size=None, num_workers=0)``: tensors sharing the
    batch memory."""

    tag, name, caches = "torch", "npyfeed.torch.WindowDataset mmap", ("warm",)

    def open(self, data, batches):
        import npyfeed.torch as nft
        from torch.utils.data import DataLoader

        self.src = self.make_source(data)
        loader = DataLoader(nft.WindowDataset(self.src, data.batch, shuffle=True, seed=data.seed), batch_size=None)
        return lambda: iter(loader)


def adapter_contenders() -> list:
    """The framework adapters whose framework is installed (Keras 3 for npyfeed.keras)."""
    out = []
    if importlib.util.find_spec("keras") is not None:
        from importlib.metadata import version

        if int(version("keras").split(".")[0]) >= 3:
            out.append(NpyfeedKeras())
    if importlib.util.find_spec("torch") is not None:
        out.append(NpyfeedTorch())
    return out


def build_contenders(args, tf) -> list:
    out = []
    if tf is not None:
        out += [UsersNpLoad(tf), DictPerSample(tf), DictPerBatch(tf)]
    out += [NumpyVectorised(), MmapSlicing(), Npyfeed(mode="mmap"), Npyfeed(mode="read"),
            Npyfeed(mode="direct", caches=("cold",)), NpyfeedArrays()]
    if not args.no_options:
        out += [NpyfeedOption(label=label, options=options)
                for label, options in option_cases(args.cols, args.labels).items()]
    if tf is not None:
        if importlib.util.find_spec("npyfeed.tf") is not None:
            out += [NpyfeedTF(), TFInRamGather(tf)]
        else:
            print("note: npyfeed.tf is not installed yet: (f) skipped", file=sys.stderr)
    if args.only:
        wanted = {w.strip() for w in args.only.split(",") if w.strip()}
        if {"keras", "torch"} & wanted:
            out += adapter_contenders()  # only when asked for: they import their frameworks
        out = [c for c in out if c.tag in wanted or c.name in wanted or (c.mode and f"{c.tag}-{c.mode}" in wanted)]
    return out


# ------------------------------------------------------------------------------------------------ run


@dataclass
class Result:
    contender: Contender
    dtype: str
    cache: str
    batches: int
    rates: list = field(default_factory=list)  # samples/s per round
    cpu_us: list = field(default_factory=list)  # process CPU microseconds (user + system, all threads) per sample
    first_ms: list = field(default_factory=list)  # time to the first batch, ms
    read_bytes: list = field(default_factory=list)  # bytes read from storage per sample (read-ahead included)
    residency: float = 0.0  # cold: largest page-cache residency of the data files seen just before a measurement
    setup: str = "-"  # the contender's setup_text

    @property
    def best(self) -> float:
        return max(self.rates)

    @property
    def best_cpu_us(self) -> float:
        return self.cpu_us[self.rates.index(self.best)]

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    def record(self, run) -> None:
        # Warm: from the first batch's arrival on (steady state: a pipeline's start-up, e.g. TensorFlow's
        # iterator, is paid once per epoch, not per batch; it is shown apart).
        # Cold: from the start, first batch and open included: on a cold cache the first batch is where the
        # reading happens (a page fault in a mapping reads up to read_ahead_kb around it).
        self.rates.append(run.steady_samples_per_s if self.cache == "warm" else run.samples_per_s)
        self.first_ms.append(run.first_s * 1e3)
        self.cpu_us.append(run.cpu_s / run.samples * 1e6)
        self.read_bytes.append(run.read_bytes / run.samples)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    common.add_data_args(p, files=400, rows=4800, cols=256, dtype=None,  # --dtypes lists the sources measured
                         dtype_help="measure only this source dtype (shorthand for --dtypes DTYPE)")
    g = p.add_argument_group("windows")
    g.add_argument("--dtypes", default="float32,float64",
                   help="comma-separated source dtypes, one data set each (default float32,float64)")
    g.add_argument("--labels", type=int, default=common.DataSpec.label_cols,
                   help=f"label columns L (default {common.DataSpec.label_cols})")
    g.add_argument("--window", type=int, default=DEFAULT_WINDOW, help=f"window W (default {DEFAULT_WINDOW})")
    g.add_argument("--batch", type=int, default=256, help="batch size B (default 256)")
    g.add_argument("--batches", type=int, default=200,
                   help="batches per warm measurement of the fast contenders (d, e, f) (default 200)")
    g.add_argument("--cold-batches", type=int, default=20,
                   help="batches per cold measurement (default 20: few enough that windows rarely share pages "
                        "already read, so the cache stays cold)")
    g.add_argument("--python-batches", type=int, default=40,
                   help="batches per warm measurement of the per-sample Python contenders (b, c, mmap slicing) "
                        "(default 40)")
    g.add_argument("--users-batches", type=int, default=3,
                   help="batches per measurement of (a), warm and cold (default 3; it is that slow)")
    g.add_argument("--seed", type=int, default=0, help="shuffle seed, the same for every contender (default 0)")
    g.add_argument("--random-reads", type=int, default=2000,
                   help="reads per random-read probe of the disk limit (default 2000)")
    g.add_argument("--no-tf", action="store_true",
                   help="skip the TensorFlow contenders (a, b, c, f): no TensorFlow import")
    g.add_argument("--no-options", action="store_true",
                   help="skip the gather option rows (o): features=, label_columns=, nan=/posinf=/neginf=, normalize=")
    g.add_argument("--only", default=None,
                   help="comma-separated tags to run only some contenders: a,b,c,d,m,e,f,t,o or "
                        "e-mmap,e-read,e-direct; keras, torch: the framework adapters (only when named)")
    args = p.parse_args(argv)
    args.dtypes = [args.dtype] if args.dtype else [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.quick:
        for name, most in (("files", 6), ("rows", 200), ("cols", 32), ("batch", 16), ("batches", 3),
                           ("cold_batches", 2), ("python_batches", 2), ("users_batches", 1), ("random_reads", 64)):
            setattr(args, name, min(getattr(args, name), most))
        args.repeats = 1
    for name in ("window", "batch", "batches", "cold_batches", "python_batches", "users_batches", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def batches_for(args, contender: Contender, cache: str) -> int:
    if contender.batches_flag == "users_batches":
        return args.users_batches
    return args.cold_batches if cache == "cold" else getattr(args, contender.batches_flag)


def measure(c: Contender, data: Data, batches: int, cache: str, keep_first: bool = False):
    """One measurement (`npyfeed.bench.measure.Pass`). Cold: the open is on the clock too (it reads headers, and
    label files in read/direct modes)."""
    try:
        if cache == "cold":
            return time_batches(lambda: c.open(data, batches)(), batches, keep_first=keep_first)
        return time_batches(c.open(data, batches), batches, keep_first=keep_first)
    finally:
        c.close()  # what it opened may hold mappings: released, or the next eviction cannot drop their pages


def check_outputs(data: Data, contenders: list) -> None:
    """Untimed: every contender's first batch equals the oracle (same samples, same order, same values)."""
    want_x, want_y = reference_batch(data, data.ids(1))
    for c in contenders:
        x, y = measure(c, data, 1, "warm", keep_first=True).first
        if not c.matches(np.asarray(x), np.asarray(y), want_x, want_y):
            raise SystemExit(f"{c.name} ({data.ds.spec.dtype}): first batch differs from per-sample slicing")
    for c in contenders:
        c.open_times.clear()  # the check's opens paid one-off costs (first TF trace, thread pool start)


def run_dtype(args, dtype, tf, limits, window_bytes, log) -> list:
    """Every contender's rounds on one source dtype's data set, warm then cold, with the limit probes of each round
    (added to `limits`, name -> GB/s per round)."""
    log(f"== source dtype {dtype}")
    data = Data(args, dtype, log)
    contenders = build_contenders(args, tf)
    log(f"  checking every contender against per-sample slicing ({len(contenders)} contenders) ...")
    check_outputs(data, contenders)
    results = []
    for cache in ("warm", "cold"):
        res = [Result(c, dtype, cache, batches_for(args, c, cache)) for c in contenders if cache in c.caches]
        if not res:
            continue
        if cache == "warm":
            log("  warming the page cache ...")
            common.warm(data.paths)
        else:
            data.release()  # the preloaded arrays have no cold row: give their memory back
        for rnd in range(args.repeats):
            # The limit probe runs in the round, beside the contenders.
            if cache == "warm":
                limits.setdefault(f"copy_{dtype}", []).append(
                    common.memcpy_bandwidth(args.threads, args.copy_bytes, repeats=3))
            else:  # the disk's random reads of one window, O_DIRECT and through the page cache: [GB/s, in flight]
                for kind in ("random", "buffered"):
                    rr = random_read_limit(data.ds.factor_paths, args.threads, window_bytes,
                                           reads=args.random_reads, seed=rnd, buffered=kind == "buffered")
                    limits.setdefault(f"{kind}_{dtype}", []).append(None if rr is None else [rr.gbps, rr.threads])
            shift = rnd % len(res)
            for r in res[shift:] + res[:shift]:
                gc.collect()
                if cache == "cold":
                    common.evict(data.paths)
                    r.residency = max(r.residency, common.cached_fraction(data.paths))
                r.record(measure(r.contender, data, r.batches, cache))
                log(f"  {cache} round {rnd + 1}/{args.repeats}  {r.contender.name:40s} {r.rates[-1]:12,.0f} "
                    f"samples/s (first batch {r.first_ms[-1]:,.0f} ms)")
        results += res
    for r in results:
        r.setup = r.contender.setup_text(data)
    data.release()
    gc.collect()
    return results


def reads_through_cache(r: Result) -> bool:
    """Whether a cold row's reads go through the page cache: every contender but npyfeed's "direct" mode."""
    return r.cache == "cold" and r.contender.mode != "direct"


def best(values) -> float | None:
    return max((v for v in values if v is not None), default=None)


def ratio(x: Result | None, y: Result | None, of: str = "rates") -> float | None:
    """x over y within each round (both ran in it, in the same state of the machine), the median over the rounds:
    a ratio of best rounds would take in the machine's drift between rounds. `of`: "rates" (samples/s) or "cpu_us"
    (then y's over x's: above 1, x does less work per sample)."""
    if not (x and y):
        return None
    pairs = zip(x.rates, y.rates) if of == "rates" else zip(y.cpu_us, x.cpu_us)
    return statistics.median(a / b for a, b in pairs)


def limit_rates(args, limits: dict, out_sample_bytes: int, window_bytes: dict) -> dict:
    """(dtype, cache) -> (limit name, samples/s): each dtype's rows against the probes of its own rounds (the
    machine's state drifts over a run); "cold page cache" is the buffered reads' limit."""
    out = {}
    for dtype in args.dtypes:
        copy_gbps = best(limits.get(f"copy_{dtype}", []))
        if copy_gbps:
            out[(dtype, "warm")] = (f"copy x{args.threads}", copy_gbps * common.GB / out_sample_bytes)
        for kind, cache, label in (("random", "cold", "rand read"),
                                   ("buffered", "cold page cache", "buffered rand read")):
            probe = best(limits.get(f"{kind}_{dtype}", []))  # the fastest round: [GB/s, reads in flight]
            if probe:
                out[(dtype, cache)] = (f"{label} qd{probe[1]}", probe[0] * common.GB / window_bytes[dtype])
    return out


def limit_rows(args, limits: dict, copy_1: float, out_sample_bytes: int, window_bytes: dict) -> list:
    """The limits table: every probe's best round, in GB/s and in samples/s of its per-sample bytes."""
    probes = [("memory copy x1", copy_1, out_sample_bytes, "x out")]
    probes += [(f"memory copy x{args.threads} ({name[5:]} rounds)", best(values), out_sample_bytes, "x out")
               for name, values in limits.items() if name.startswith("copy_")]
    for prefix, label in (("random_", "O_DIRECT random read"), ("buffered_", "buffered random read")):
        for name, values in limits.items():
            if name.startswith(prefix):  # the best round's [GB/s, reads in flight]; None: O_DIRECT refused
                dtype, probe = name[len(prefix):], best(values)
                probes.append((f"{label}{f' qd{probe[1]}' if probe else ''} ({dtype})", probe[0] if probe else None,
                               window_bytes[dtype], "windows"))
    return [[name, common.fmt(g, ".2f"), common.fmt(None if g is None else g * common.GB / nbytes, ",.0f"),
             f"{nbytes} B {unit}"] for name, g, nbytes, unit in probes]


def main(argv=None) -> int:
    args = parse_args(argv)
    args.threads = common.resolve_threads(args.threads)
    args.copy_bytes = (8 << 20) if args.quick else (64 << 20)
    log = (lambda s: print(s, file=sys.stderr, flush=True))
    tf = None
    if not args.no_tf:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf  # noqa: PLC0415 (lazy: --no-tf runs without it)

    load_before = os.getloadavg()
    limits: dict = {}
    log("limits: memory copy, 1 thread ...")
    copy_1 = common.memcpy_bandwidth(1, args.copy_bytes, repeats=2 if args.quick else 5)
    window_bytes = {d: args.window * args.cols * np.dtype(d).itemsize for d in args.dtypes}  # one source window
    results = [r for d in args.dtypes for r in run_dtype(args, d, tf, limits, window_bytes[d], log)]
    residency = max((r.residency for r in results), default=0.0)
    out_sample_bytes = args.window * args.cols * 4  # float32 x output per sample
    limit_rate = limit_rates(args, limits, out_sample_bytes, window_bytes)

    by: dict = {}  # dtype -> "key cache" -> result
    for r in results:
        by.setdefault(r.dtype, {})[f"{r.contender.key} {r.cache}"] = r
    rows, results_json = [], []
    for r in results:
        got = by[r.dtype].get
        vs_a, vs_e = ratio(r, got(f"a {r.cache}")), ratio(r, got(f"e-mmap {r.cache}"))
        vs_b = ratio(r, got("b warm"))  # the users' common path: their dict (preloaded, so warm only)
        lim_name, lim = limit_rate.get((r.dtype, r.cache), ("-", None))
        cached_name, cached = (limit_rate.get((r.dtype, "cold page cache"), (None, None)) if reads_through_cache(r)
                               else (None, None))
        vs_lim = r.best / lim if lim else None
        vs_cached = r.best / cached if cached else None
        rows.append([r.contender.name, r.dtype, r.cache, r.batches, f"{r.best:,.0f}", f"{r.median:,.0f}",
                     f"{statistics.median(r.first_ms):,.0f}", f"{r.best_cpu_us:,.1f}",
                     f"{statistics.median(r.read_bytes):,.0f}", common.fmt(vs_a, ".1f", "x"),
                     common.fmt(vs_b, ".1f", "x"), common.fmt(vs_e, ".2f", "x"), lim_name,
                     common.fmt(vs_lim, ".2f", "x"), common.fmt(vs_cached, ".2f", "x"), r.setup])
        results_json.append({"name": r.contender.name, "tag": r.contender.tag, "dtype": r.dtype, "cache": r.cache,
                             "batches": r.batches, "samples_per_s": r.rates, "cpu_us_per_sample": r.cpu_us,
                             "first_batch_ms": r.first_ms, "read_bytes_per_sample": r.read_bytes, "best": r.best,
                             "median": r.median, "residency_before": r.residency if r.cache == "cold" else None,
                             "vs_a": vs_a, "vs_b": vs_b, "vs_e_mmap": vs_e, "limit": lim_name,
                             "limit_samples_per_s": lim, "vs_limit": vs_lim, "page_cache_limit": cached_name,
                             "page_cache_limit_samples_per_s": cached, "vs_page_cache_limit": vs_cached,
                             "setup": r.setup})

    load_after = os.getloadavg()
    spec = f"{args.files} files x ({args.rows}, {args.cols})"
    print(f"\nnpyfeed {npyfeed.__version__} bench_windows: {spec}, W={args.window}, B={args.batch}, "
          f"L={args.labels}, sources {','.join(args.dtypes)} -> float32, threads={args.threads}, "
          f"rounds={args.repeats}, seed={args.seed}, data in {args.dir}")
    print(f"load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after, on "
          f"{common.machine_info()['cpus']} CPUs: above the CPU count, other processes took CPU time from these "
          "measurements (ratios within a round stay comparable; cpu us/smp is the work done)")
    print("\nlimits (same run, best probe)")
    print(common.format_table(("limit", "GB/s", "samples/s", "per sample"),
                              limit_rows(args, limits, copy_1, out_sample_bytes, window_bytes), align="lrrl"))
    print("\n" + common.format_table(TABLE_HEADER, rows, align="lllrrrrrrrrrlrrl") + "\n")
    print("samples/s = best round (median beside it); warm: counted from the first batch's arrival to the last "
          "batch's (steady state), cold: from the start (first batch included); 1st ms = median time to the first "
          "batch (pipeline start-up, once per epoch; cold: the open included); x (a) / x (e) = against (a) and (e) "
          "npyfeed mmap, same source dtype and cache, within each round (median over the rounds); x (b) = against (b) "
          "warm, the users' common path; cpu us/smp = "
          "CPU time of this process (all threads: npyfeed's, TensorFlow's) per sample in the best round; read B/smp = "
          "bytes read from storage per sample (/proc/self/io, read-ahead included; median round); x limit = against "
          "the limit named (warm: memory copy of the float32 x output; cold: O_DIRECT random reads of source windows, "
          "the best of the queue depths probed); x page-cache limit = against the same reads through the page cache, "
          "for the cold rows that read through it (all but direct). Cold = all data files evicted before each "
          f"measurement (max page-cache residency after eviction: {residency:.1%}). setup = per-measurement "
          "open (median; outside the time in warm rows, inside it in cold rows), or the one-off preload the "
          "contender needs.")

    not_cold = [f"{r.contender.name} {r.dtype} ({r.residency:.0%})" for r in results
                if r.cache == "cold" and r.residency > MAX_COLD_RESIDENCY]
    if not_cold:
        print(f"WARNING: data still cached after eviction (pages pinned by live mappings?) for: {'; '.join(not_cold)}: "
              "those cold rows are not cold, and their targets are marked n/a.")
    opts = option_rows(results, by)
    if opts:
        print()
        print("gather options (o): (e) npyfeed mmap, warm, with one option each, against plain (e) mmap of the same "
              "rounds (x plain and cpu x plain: within each round, median over the rounds; cpu us = CPU time per sample "
              "of all threads in the best round, cpu x plain = plain's over the option's)")
        print(common.format_table(OPTION_HEADER, opts, align="llrrrrrrrrll"))
    targets = evaluate_targets(by, limit_rate, args.dtypes)
    print()
    print("targets (issue 3, 2-core machine; against a limit: the best round; between contenders: within each "
          "round, median over the rounds)")
    print(common.format_table(("target", "src", "measured", "needed", "status"),
                              [[t["target"], t["dtype"], t["measured"], t["needed"], t["status"]] for t in targets],
                              align="llrrl"))
    if args.quick:
        print("\n(--quick: tiny sizes, one round; these numbers mean nothing)")
    if args.json:
        common.write_json(args.json, {
            "bench": "bench_windows", "config": vars(args), "machine": common.machine_info(),
            "load_average": {"before": load_before, "after": load_after},
            "limits_gbps": limits | {"copy_1": copy_1},
            "limits_samples_per_s": {f"{d}/{c}": v for (d, c), v in limit_rate.items()},
            "results": results_json, "targets": targets, "max_residency_after_evict": residency,
            "gather_options": [dict(zip(OPTION_HEADER, o)) for o in opts]})
    return 0


def evaluate_targets(by: dict, limit_rate: dict, dtypes) -> list:
    """The issue's targets per source dtype (against a limit: the best round; between contenders: `ratio`); a target
    of a cold row that was not cold is n/a."""
    out = []

    def add(target, dtype, value, needed, threshold, shown=None, cold_rows=()):
        ok = None if value is None else value >= threshold
        if any(r is not None and r.residency > MAX_COLD_RESIDENCY for r in cold_rows):
            ok = None  # not measured cold
        out.append({"target": target, "dtype": dtype, "value": value, "needed": needed,
                    "measured": shown if shown is not None else common.fmt(value, ".3f", "x"),
                    "status": "n/a" if ok is None else ("met" if ok else "MISSED"), "met": ok})

    for dtype in dtypes:
        got = by.get(dtype, {}).get
        copy, disk, cached = (limit_rate.get((dtype, cache)) for cache in ("warm", "cold", "cold page cache"))
        for mode in ("mmap", "read"):
            e = got(f"e-{mode} warm")
            if e:
                add(f"(e) {mode} warm vs {copy[0] if copy else 'copy'} limit", dtype,
                    e.best / copy[1] if copy else None, ">= 0.800x", 0.8)
        f, e, a, t = got("f-mmap warm"), got("e-mmap warm"), got("a warm"), got("t warm")
        if f:
            add("(f) warm vs (e) mmap warm", dtype, ratio(f, e), ">= 0.950x", 0.95)  # issue 11 (was 0.8)
            cpu = None if e is None else 1 / ratio(f, e, "cpu_us")  # f's CPU per sample over e's, per round
            add("(f) warm cpu/sample vs (e)", dtype, None if cpu is None else 1.1 / cpu, "<= 1.10x", 1.0,
                common.fmt(cpu, ".3f", "x"))
            add("(f) warm vs (a) warm", dtype, ratio(f, a), ">= 75x", 75, common.fmt(ratio(f, a), ".0f", "x"))
            if t:
                add("(f) warm vs (t) TF in-RAM gather", dtype, ratio(f, t), ">= 1.300x", 1.3)
        for adapter in (got("keras-mmap warm"), got("torch-mmap warm")):  # docs/frameworks.md's target
            if adapter and e:
                add(f"{adapter.contender.name} warm vs (e) mmap warm", dtype, ratio(adapter, e), ">= 0.900x", 0.9)
        m = got("m cold")
        for mode in ("mmap", "read", "direct"):
            e = got(f"e-{mode} cold")
            if e:
                add(f"(e) {mode} cold vs {disk[0] if disk else 'random read'} limit", dtype,
                    e.best / disk[1] if disk else None, ">= 0.800x", 0.8, cold_rows=(e,))
                if mode != "direct" and cached:
                    add(f"(e) {mode} cold vs {cached[0]} limit (the page cache's)", dtype, e.best / cached[1],
                        ">= 0.800x", 0.8, cold_rows=(e,))
                add(f"(e) {mode} cold vs np mmap slicing cold", dtype, ratio(e, m), ">= 5x", 5,
                    common.fmt(ratio(e, m), ".2f", "x"), cold_rows=(e, m))
    return out


if __name__ == "__main__":
    sys.exit(main())
