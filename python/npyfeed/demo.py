"""`npyfeed demo`: the users' problem end to end on a generated data set.

Generates per-key factor and label files in the users' layout in a temporary folder, loads them the users'
way (an `np.load` loop into a dict) and with npyfeed, measures samples/s of the users' per-sample
`tf.numpy_function` pipeline against npyfeed's numpy iterator and `npyfeed.tf.dataset`, trains a small
Keras model fed by npyfeed, and prints a comparison table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from ._layout import index_text, layout_dirs, write_index, write_key
from .loading import load_factor_files
from .windows import WindowSource


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("demo", help="generate a data set, compare loaders, train a small Keras model",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=60, help="factor files (keys) to generate (default 60)")
    p.add_argument("--rows", type=int, default=4800, help="rows T per file (default 4800)")
    p.add_argument("--features", type=int, default=256, help="factor columns F (default 256)")
    p.add_argument("--labels", type=int, default=4, help="label columns L (default 4)")
    p.add_argument("--window", type=int, default=100, help="window W (default 100)")
    p.add_argument("--batch-size", type=int, default=256, help="batch size B (default 256)")
    p.add_argument("--stride", type=int, default=5, help="one sample every STRIDE rows (default 5)")
    p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    p.add_argument("--measure-batches", type=int, default=40, help="batches per throughput measurement (default 40)")
    p.add_argument("--threads", type=int, default=None, help="npyfeed threads (default: all CPUs this process may use)")
    p.add_argument("--dir", default=None,
                   help="where to generate the data (default: a temporary folder, removed after)")
    p.add_argument("--no-train", action="store_true", help="skip TensorFlow (loading and numpy throughput only)")
    p.set_defaults(func=run)
    return p


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rss_growth(before: int) -> int:
    # Resident memory this step added (0 when the allocator handed memory back meanwhile).
    return max(0, _rss_bytes() - before)


def generate(root: str, keys: int, rows: int, features: int, labels: int, window: int, stride: int,
             stock: str = "demo_stock", mode: str = "train") -> tuple:
    """Write a data set in the users' layout; returns (factor_dir, label_dir, index_path)."""
    base = os.path.join(root, stock, mode)
    rng = np.random.default_rng(2026)
    entries = []
    for k in range(keys):
        key = f"{k:06d}.SZ"
        factor = rng.standard_normal((rows, features), dtype=np.float32)
        # The label depends on the last window row, so the model has something to learn.
        label = np.tanh(factor[:, :labels] * 2.0) + 0.1 * rng.standard_normal((rows, labels), dtype=np.float32)
        write_key(base, key, factor, label.astype(np.float32))
        entries.extend((i, i, key) for i in range(window - 1, rows, stride))
    index_path = write_index(os.path.join(base, "index.txt"), index_text(entries))
    return (*layout_dirs(base), index_path)


def src_files(args, which: str) -> list:
    folder = args.factor_dir if which == "factor" else args.label_dir
    return [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".npy")]


def _time(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def run(args) -> int:
    if args.keys < 1 or args.rows < args.window or args.window < 1 or args.batch_size < 1:
        print("npyfeed demo: need --keys >= 1 and --rows >= --window >= 1", file=sys.stderr)
        return 2
    root = args.dir or tempfile.mkdtemp(prefix="npyfeed-demo-")
    cleanup = args.dir is None
    try:
        return _run(args, root)
    finally:
        if cleanup:
            shutil.rmtree(root, ignore_errors=True)


def _run(args, root: str) -> int:
    gb = args.keys * args.rows * args.features * 4 / 1e9
    print(f"npyfeed demo: {args.keys} keys x ({args.rows}, {args.features}) float32 = {gb:.2f} GB in {root}")
    factor_dir, label_dir, index_path = generate(root, args.keys, args.rows, args.features, args.labels,
                                                 args.window, args.stride)
    args.factor_dir, args.label_dir, args.index_path = factor_dir, label_dir, index_path
    files = sorted(os.path.join(factor_dir, f) for f in os.listdir(factor_dir))
    rows = []  # (what, seconds, samples/s, memory)

    # 1. Start-up: the users' np.load loop vs npyfeed.
    def users_load():
        store = {}
        for path in files:
            store[os.path.basename(path)[:-4]] = np.load(path)
        return store

    rss = _rss_bytes()
    t_users, users_dict = _time(users_load)
    users_mem = _rss_growth(rss)
    rows.append(("load: np.load loop (users' code)", t_users, None, users_mem))
    del users_dict
    rss = _rss_bytes()
    t_read, store = _time(lambda: load_factor_files(files, {}, mode="read", threads=args.threads))
    rows.append(("load: npyfeed.load_factor_files mode=read", t_read, None, _rss_growth(rss)))
    del store
    rss = _rss_bytes()
    t_src, src = _time(lambda: WindowSource(index_path, factor_dir, label_dir, args.window, mode="mmap",
                                            threads=args.threads))
    rows.append(("open: npyfeed.WindowSource mode=mmap (shared page cache)", t_src, None, _rss_growth(rss)))

    # 2. Samples/s: the users' per-sample slicing in Python vs npyfeed's C++ gather.
    B, nb = args.batch_size, args.measure_batches
    store = load_factor_files(files, {}, mode="mmap")
    labels = load_factor_files([os.path.join(label_dir, os.path.basename(p)) for p in files], {}, mode="mmap")
    with open(index_path) as f:
        index_lines = [ln.strip() for ln in f if ln.strip()]
    order = src.epoch_order(0, shuffle=True, seed=0)

    def users_batches():
        for b in range(nb):
            xs, ys = [], []
            for i in order[b * B:(b + 1) * B]:
                fi, li, key = index_lines[i].split(",")
                fi, li = int(fi), int(li)
                xs.append(store[key][fi - args.window + 1: fi + 1].astype(np.float32))
                ys.append(labels[key][li].astype(np.float32))
            np.stack(xs), np.stack(ys)

    t, _ = _time(users_batches)
    rows.append(("batches: preloaded dict + per-sample numpy slicing", t, nb * B / t, None))

    def npyfeed_batches():
        with src.batches(B, shuffle=True, seed=0) as it:
            for _ in zip(range(nb), it):
                pass

    t, _ = _time(npyfeed_batches)
    rows.append(("batches: npyfeed WindowSource.batches", t, nb * B / t, None))

    trained = None
    if not args.no_train:
        trained = _train(args, src, rows)

    _print_table(rows)
    if trained is not None:
        first, last = trained
        print(f"Keras model trained {args.steps} steps on npyfeed batches: loss {first:.4f} -> {last:.4f}")
    return 0


def _train(args, src, rows):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError:
        print("TensorFlow is not installed: pip install 'npyfeed[tf]' (skipping the training part)")
        return None
    from . import tf as npyfeed_tf

    B, nb = args.batch_size, args.measure_batches
    ds = npyfeed_tf.dataset(src, B, shuffle=True, seed=0, drop_remainder=True)

    def tf_batches():
        for _ in ds.take(nb):
            pass

    tf_batches()  # warm up the graph
    t, _ = _time(tf_batches)
    rows.append(("batches: npyfeed.tf.dataset (tf.data)", t, nb * B / t, None))

    # The users' current pipeline: a preloaded dict and one tf.numpy_function call per sample.
    store = load_factor_files(sorted(src_files(args, "factor")), {}, mode="mmap")
    labels = load_factor_files(sorted(src_files(args, "label")), {}, mode="mmap")
    W = args.window

    def get_data_from_cache(line):
        feature_index, label_index, key = line.decode().split(",")
        fi, li = int(feature_index), int(label_index)
        return store[key][fi - W + 1: fi + 1].astype(np.float32), labels[key][li].astype(np.float32)

    def parser(line):
        x, y = tf.numpy_function(get_data_from_cache, [line], (tf.float32, tf.float32))
        return tf.reshape(x, src.x_shape), tf.reshape(y, src.y_shape)

    users = (tf.data.TextLineDataset(args.index_path).shuffle(10000, seed=0)
             .map(parser, num_parallel_calls=tf.data.AUTOTUNE).batch(B).prefetch(tf.data.AUTOTUNE))
    for _ in users.take(2):
        pass
    t, _ = _time(lambda: [None for _ in users.take(nb)])
    rows.insert(len(rows) - 1, ("batches: users' tf.numpy_function per sample (tf.data)", t, nb * B / t, None))

    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=src.x_shape),
        tf.keras.layers.Lambda(lambda x: x[:, -1, :]),  # the last row of the window
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(src.y_shape[0] if src.y_shape else 1),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-2), loss="mse")
    train = npyfeed_tf.dataset(src, B, shuffle=True, seed=1, drop_remainder=True).repeat()
    t0 = time.perf_counter()
    history = model.fit(train, steps_per_epoch=max(args.steps // 2, 1), epochs=2, verbose=1, shuffle=False)
    t = time.perf_counter() - t0
    rows.append(("train: Keras model.fit fed by npyfeed.tf.dataset", t, 2 * max(args.steps // 2, 1) * B / t, None))
    losses = history.history["loss"]
    return losses[0], losses[-1]


def _print_table(rows) -> None:
    print()
    head = f"{'what':<58} {'seconds':>9} {'samples/s':>11} {'memory':>10}"
    print(head)
    print("-" * len(head))
    for what, secs, rate, mem in rows:
        rate_s = f"{rate:,.0f}" if rate else ""
        mem_s = f"{mem / 2**20:,.0f} MiB" if mem is not None else ""
        print(f"{what:<58} {secs:>9.3f} {rate_s:>11} {mem_s:>10}")
    print()
    by_name = {what: (secs, rate) for what, secs, rate, _ in rows}

    def compare(fast: str, slow: str, faster_is_rate: bool) -> None:
        if fast in by_name and slow in by_name:
            (fs, fr), (ss, sr) = by_name[fast], by_name[slow]
            ratio = fr / sr if faster_is_rate else ss / fs
            what = "samples/s" if faster_is_rate else "start-up speed"
            print(f"  {fast.split(': ', 1)[1]}: {ratio:,.1f}x the {what} of {slow.split(': ', 1)[1]}")

    users_load = "load: np.load loop (users' code)"
    compare("load: npyfeed.load_factor_files mode=read", users_load, False)
    compare("open: npyfeed.WindowSource mode=mmap (shared page cache)", users_load, False)
    compare("batches: npyfeed WindowSource.batches", "batches: preloaded dict + per-sample numpy slicing", True)
    compare("batches: npyfeed.tf.dataset (tf.data)", "batches: users' tf.numpy_function per sample (tf.data)", True)
