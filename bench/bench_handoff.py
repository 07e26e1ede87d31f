"""The hand-off into TensorFlow: ``npyfeed.tf.dataset`` against the numpy iterator over the same warm source.

Each round runs, in one fresh process per build and in a rotated order, over the same warm data set (W=100,
B=256, (4800, 256) float32 files, ``shuffle=True``, mode ``"mmap"``):

* **numpy**: ``src.batches(...)``, the gather alone (every other row is paired with a run of it);
* **eager**: ``for x, y in ds`` (a Python loop over eager tensors: custom loops, debugging);
* **tf.function**: ``next(iterator)`` in a traced loop (Keras ``fit``'s train function, a custom step);
* **fit**: ``model.fit(ds, steps_per_epoch=...)`` on a tiny model (the last window row through a Dense layer),
  so that the step is input-bound;
* **numpy nice** / **tf.function nice** / **fit nice** / **fit steps_per_execution=32 nice**: the same over a
  source made with ``nice=N`` (``--nice``, default 5): npyfeed's workers below the consumer's threads, so
  that where the gather saturates the cores, the consumer's step (Keras' Python, TensorFlow's executor) runs as
  soon as it can and the gather takes what is left (their ratios are to plain numpy runs);
* **fallback eager** / **fallback tf.function**: the same two over the ``tf.numpy_function`` feed
  (``NPYFEED_TF_OPS=0`` when the dataset is made: the path taken where the op library does not load);
* **floor eager** / **floor tf.function**: a dataset that hands out one pre-made batch
  (``from_tensors(...).repeat()``, autotuning off as in npyfeed's pipelines): TensorFlow's own cost per element,
  with nothing gathered.
* **device eager** / **device tf.function**: ``gather="device"`` on the CPU device (``device="/cpu:0"``): the
  arrays uploaded once, each step's host half only start rows, the batch formed by one ``tf.gather``;
  **device streamed tf.function**: the same with ``shuffle="blocks"`` and a device budget under the arrays (a
  64 MB memory budget: each block uploaded once per epoch). Not a GPU figure: the host's CPU per step of the
  device path (Python per step, or native ops), before and after with ``--baseline``.

Each row reports samples/s, its ratio to a numpy run made just before it in the same process (median and worst
over the rounds: a row's datasets, models and threads stay alive in the process and slow later gathers too),
for ``fit`` the longest time from its last step to its return (where Keras deletes its iterator: with tf.data's
autotuning on, that waited for the autotuning thread's period, up to seconds), and CPU per batch by thread:
npyfeed's gather workers, the main thread, and TensorFlow's threads (read from ``/proc/self/task``), and the
share of the row the main thread was ready to run but waited for a core ("main waits for a core",
``npyfeed.stats.cpu_share``). On a 2-core box the gather saturates both cores, so any CPU TensorFlow spends per
batch comes out of the gather's; the floor rows show what TensorFlow costs at the least.

``--baseline DIR`` runs the same rounds with another npyfeed install too (``pip install --no-build-isolation
--no-deps --target DIR <checkout>``, imported with ``PYTHONPATH=DIR``), its process alternating with this one's:
a before/after in one run.

Targets (issue 30): eager >= 0.9x numpy, tf.function >= 0.95x, fit >= 0.9x.

    python bench/bench_handoff.py --rounds 5
    python bench/bench_handoff.py --quick   # seconds: checks that it runs; its figures mean nothing
    python bench/bench_handoff.py --rounds 5 --baseline /tmp/npyfeed-before --json /tmp/handoff.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ROWS = ("numpy", "eager", "tf.function", "fit", "fit steps_per_execution=32", "floor eager", "floor tf.function",
        "floor fit", "floor fit steps_per_execution=32", "device eager", "device tf.function",
        "device streamed tf.function", "numpy nice", "tf.function nice", "fit nice",
        "fit steps_per_execution=32 nice", "fallback eager", "fallback tf.function")
TARGETS = {"eager": 0.9, "tf.function": 0.95, "fit": 0.9, "fit steps_per_execution=32": 0.9, "tf.function nice": 0.95,
           "fit nice": 0.9, "fit steps_per_execution=32 nice": 0.9}
#: The floor of each row: the same consumer over a dataset that hands out one pre-made batch.
FLOORS = {"eager": "floor eager", "tf.function": "floor tf.function", "fit": "floor fit",
          "fit steps_per_execution=32": "floor fit steps_per_execution=32", "tf.function nice": "floor tf.function",
          "fit nice": "floor fit", "fit steps_per_execution=32 nice": "floor fit steps_per_execution=32",
          "fallback eager": "floor eager", "fallback tf.function": "floor tf.function"}


def _thread_cpu() -> tuple:
    """CPU seconds so far of this process, by group: npyfeed's workers, the main thread, the rest (TensorFlow's
    threads, including those that ended: the process's total less the two others), and under "workers" each
    npyfeed worker's (CPU seconds, niceness) by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"gather": 0.0, "main": 0.0}
    workers = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        seconds = (int(fields[11]) + int(fields[12])) / tick
        if int(tid) == os.getpid():
            out["main"] += seconds
        elif comm.startswith("npyfeed"):
            out["gather"] += seconds
            workers[tid] = (seconds, int(fields[16]))  # stat field 19: nice
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["tensorflow"] = usage.ru_utime + usage.ru_stime - out["gather"] - out["main"]
    return out, workers


def _niceness_of_busy_workers(before: dict, after: dict) -> list:
    """The niceness values of the npyfeed workers that ran between two `_thread_cpu` readings."""
    return sorted({nice for tid, (seconds, nice) in after.items() if seconds > before.get(tid, (0.0, 0))[0]})


def child(cfg: dict) -> dict:
    """One round of one build: every row once, in the order given; returns {row: measurement}."""
    import npyfeed
    import npyfeed.stats
    import numpy as np

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import npyfeed.tf as nftf
    import tensorflow as tf

    thread_times = getattr(npyfeed.stats, "thread_times", lambda: None)  # builds before it: None
    window, batch, batches = cfg["window"], cfg["batch"], cfg["batches"]
    src = npyfeed.WindowSource([cfg["index"]], cfg["factor_dir"], cfg["label_dir"], window, mode="mmap")
    ds = nftf.dataset(src, batch, shuffle=True).repeat()

    @tf.function
    def consume(iterator, steps):
        samples = tf.constant(0, tf.int64)
        for _ in tf.range(steps):
            x, _y = next(iterator)
            samples += tf.shape(x, out_type=tf.int64)[0]
        return samples

    def eager_loop(dataset):
        def run():
            n = 0
            for i, (x, _y) in enumerate(dataset):
                n += int(x.shape[0])
                if i + 1 == batches:
                    return n
        return run

    def in_function(dataset):
        iterator = iter(dataset)
        consume(iterator, tf.constant(2, tf.int64))  # traced here, not in the timed part
        return lambda: int(consume(iterator, tf.constant(batches, tf.int64)))

    epoch = [0]

    def numpy_rows(source):
        def run():
            n = 0
            epoch[0] += 1
            for i, (x, _y) in enumerate(source.batches(batch, shuffle=True, epoch=epoch[0])):
                n += len(x)
                if i + 1 == batches:
                    return n
            return n
        return run

    # The same files, the workers at niceness `nice` (a pool of their own); made when a row asks for them.
    niced = []

    def niced_source():
        if not niced:
            niced.append(npyfeed.WindowSource([cfg["index"]], cfg["factor_dir"], cfg["label_dir"], window, mode="mmap",
                                              nice=cfg["nice"]))
        return niced[0]

    x_shape, y_shape = (batch, *src.x_shape), (batch, *src.y_shape)
    floor = tf.data.Dataset.from_tensors((tf.zeros(x_shape), tf.zeros(y_shape))).repeat()
    no_model = tf.data.Options()
    no_model.autotune.enabled = False  # as npyfeed's: a fit's end would wait for the autotuning thread's period
    floor = floor.with_options(no_model)
    def tiny_model(steps_per_execution):
        model = tf.keras.Sequential([tf.keras.Input(src.x_shape), tf.keras.layers.Lambda(lambda t: t[:, -1, :]),
                                     tf.keras.layers.Dense(int(np.prod(src.y_shape)))])
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
        return model

    end_lag = {}

    class EndLag(tf.keras.callbacks.Callback):
        """Times the end of ``fit``: from its last step (on_train_end) to its return, where Keras deletes the
        iterator (no per-batch hook: the steps run as without it)."""

        def on_train_end(self, logs=None):
            self.ended = time.perf_counter()

    def fit(dataset, steps_per_execution, row):
        model = tiny_model(steps_per_execution)

        def run():
            lag = EndLag()
            model.fit(dataset, steps_per_epoch=batches, epochs=1, verbose=0, callbacks=[lag])
            end_lag[row] = time.perf_counter() - lag.ended
            return batches * batch
        return run

    def device_dataset(streamed):
        # Made when its row is asked for only (it uploads the arrays: another copy of them in memory).
        def run():
            if streamed:
                dataset = nftf.dataset(src, batch, shuffle="blocks", memory_budget=64 << 20, gather="device",
                                       device="/cpu:0", device_memory_budget=256 << 20)
            else:
                dataset = nftf.dataset(src, batch, shuffle=True, gather="device", device="/cpu:0")
            return dataset.repeat()
        return run

    def lazily(make, consumer):
        made = []

        def run():
            if not made:
                made.append(consumer(make()))
            return made[0]()
        return run

    def fallback_dataset():
        # The numpy_function feed: the environment is read when a dataset is made.
        before = os.environ.get("NPYFEED_TF_OPS")
        os.environ["NPYFEED_TF_OPS"] = "0"
        try:
            return nftf.dataset(src, batch, shuffle=True).repeat()
        finally:
            if before is None:
                del os.environ["NPYFEED_TF_OPS"]
            else:
                os.environ["NPYFEED_TF_OPS"] = before

    def niced_dataset():
        return nftf.dataset(niced_source(), batch, shuffle=True).repeat()

    runs = {"numpy": numpy_rows(src), "eager": eager_loop(ds), "tf.function": in_function(ds), "fit": fit(ds, 1, "fit"),
            "fit steps_per_execution=32": fit(ds, 32, "fit steps_per_execution=32"),
            "floor eager": eager_loop(floor), "floor tf.function": in_function(floor),
            "floor fit": fit(floor, 1, "floor fit"),
            "floor fit steps_per_execution=32": fit(floor, 32, "floor fit steps_per_execution=32"),
            "device eager": lazily(device_dataset(False), eager_loop),
            "device tf.function": lazily(device_dataset(False), in_function),
            "device streamed tf.function": lazily(device_dataset(True), in_function),
            "fallback eager": lazily(fallback_dataset, eager_loop),
            "fallback tf.function": lazily(fallback_dataset, in_function),
            "numpy nice": lambda: numpy_rows(niced_source())(),
            "tf.function nice": lazily(niced_dataset, in_function),
            "fit nice": lazily(niced_dataset, lambda dataset: fit(dataset, 1, "fit nice")),
            "fit steps_per_execution=32 nice": lazily(
                niced_dataset, lambda dataset: fit(dataset, 32, "fit steps_per_execution=32 nice"))}
    for name in cfg["order"]:  # warm-up: caches, tracing, Keras' first step
        runs[name]()
    def timed(name: str) -> dict:
        time.sleep(cfg["settle"])  # the previous row's threads wind down (its pool's, TensorFlow's)
        (cpu0, workers0), threads0, t0 = _thread_cpu(), thread_times(), time.perf_counter()
        samples = runs[name]()
        seconds, (cpu1, workers1), threads1 = time.perf_counter() - t0, _thread_cpu(), thread_times()
        steps = samples / batch
        return {"samples_per_s": samples / seconds,
                "cpu_ms_per_batch": {k: 1e3 * (cpu1[k] - cpu0[k]) / steps for k in cpu0},
                "worker_nice": _niceness_of_busy_workers(workers0, workers1),
                # the share of the row the main thread waited for a core (None: a build without it)
                "main_cpu_wait": npyfeed.stats.cpu_share(threads0, threads1, seconds)["main_cpu_wait"]
                if threads0 and threads1 else None,
                "load": os.getloadavg()[0]}

    out = {}
    for name in cfg["order"]:
        # Every other row is paired with a numpy run just before it: its reference in the same state of this
        # process (the rows made so far hold their datasets, models and threads, which slow a gather too).
        pair = None if name == "numpy" else timed("numpy")["samples_per_s"]
        out[name] = dict(timed(name), numpy_pair=pair)
        if name in end_lag:
            out[name]["end_lag_s"] = end_lag[name]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--dir", default="/tmp/npyfeed-handoff", help="data set folder (made if missing)")
    p.add_argument("--keys", type=int, default=60, help="files of (4800, 256) float32")
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=384, help="batches per row and round (a multiple of 32)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--settle", type=float, default=1.0,
                   help="seconds of pause before each timed row, so that no row runs in the tail of the one before")
    p.add_argument("--nice", type=int, default=5, help="the workers' niceness in the 'nice' rows")
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    p.add_argument("--baseline", metavar="DIR", help="another npyfeed install to run beside this one")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--quick", action="store_true", help="a tiny run that only checks the script works")
    args = p.parse_args(argv)
    if args.quick:
        args.keys, args.batches, args.rounds, args.settle = 2, 32, 1, 0.0
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0

    from npyfeed.demo import generate

    rows = [r for r in args.rows.split(",") if r]
    if "numpy" not in rows or any(r not in ROWS for r in rows):
        p.error(f"--rows must name the numpy row and only rows of {ROWS}")
    base = Path(args.dir) / "demo_stock" / "train"
    if not (base / "index.txt").exists():
        print(f"generating {args.keys} keys of (4800, 256) float32 in {args.dir} ...", flush=True)
        generate(args.dir, args.keys, 4800, 256, 4, args.window, 1)
    common.warm(str(path) for path in base.rglob("*.npy"))
    builds = [("this build", None)] + ([("baseline", args.baseline)] if args.baseline else [])
    results = {name: [] for name, _ in builds}
    for r in range(args.rounds):
        order = rows[r % len(rows):] + rows[:r % len(rows)]
        for name, path in (builds if r % 2 == 0 else builds[::-1]):
            cfg = {"index": str(base / "index.txt"), "factor_dir": str(base / "factor"),
                   "label_dir": str(base / "label"), "window": args.window, "batch": args.batch,
                   "batches": args.batches, "order": order, "nice": args.nice,
                   "settle": args.settle}
            env = common.importing_from(dict(os.environ), path) if path else dict(os.environ)
            results[name].append(common.run_child(__file__, cfg, env, name))
            got = results[name][-1]
            print(f"round {r + 1} {name:10s} load {got[rows[0]]['load']:.1f}: " + "  ".join(
                f"{row} {got[row]['samples_per_s']:,.0f}" for row in rows), flush=True)

    print(f"\n{args.rounds} rounds, {args.keys} keys x (4800, 256) float32, W={args.window}, B={args.batch}, "
          f"{args.batches} batches per row; x numpy = the row over the numpy run just before it, same process")
    header = ["build", "row", "samples/s (median)", "x numpy median", "x numpy worst", "x numpy per round",
              "CPU ms/batch: gather / main / TF", "main waits for a core", "cap", "x cap", "fit end ms (max)",
              "target"]
    table = []
    summary = {}
    for name, _ in builds:
        rounds = results[name]

        def cpu_total(row, rounds=rounds):
            return statistics.median(sum(rnd[row]["cpu_ms_per_batch"].values()) for rnd in rounds)

        for row in rows:
            rates = [rnd[row]["samples_per_s"] for rnd in rounds]
            # against the numpy run just before the row (the numpy row: against itself)
            ratios = [rnd[row]["samples_per_s"] / (rnd[row]["numpy_pair"] or rnd[row]["samples_per_s"])
                      for rnd in rounds]
            cpu = {k: statistics.median(rnd[row]["cpu_ms_per_batch"][k] for rnd in rounds)
                   for k in ("gather", "main", "tensorflow")}
            # On cores the gather saturates, TensorFlow's CPU per batch comes out of the gather's: the most this
            # consumer can reach is the numpy row's CPU per batch over it plus the floor's.
            cap = None
            if FLOORS.get(row) in rows:
                cap = min(1.0, cpu_total("numpy") / (cpu_total("numpy") + cpu_total(FLOORS[row])))
            median = statistics.median(ratios)
            verdict = ""
            if row in TARGETS:
                met = median >= TARGETS[row] or (cap is not None and median >= 0.95 * cap)
                verdict = f">= {TARGETS[row]:.2f}x or 0.95x cap: " + ("met" if met else "not met")
            lags = [rnd[row]["end_lag_s"] for rnd in rounds if "end_lag_s" in rnd[row]]
            waits = [rnd[row].get("main_cpu_wait") for rnd in rounds]
            summary[f"{name}: {row}"] = {"rates": rates, "ratios": ratios, "cpu_ms_per_batch": cpu, "cap": cap,
                                         "fit_end_lag_s": lags, "main_cpu_wait": waits}
            table.append([name, row, f"{statistics.median(rates):,.0f}", f"{median:.3f}", f"{min(ratios):.3f}",
                          " / ".join(f"{q:.2f}" for q in ratios),
                          " / ".join(f"{cpu[k]:.2f}" for k in ("gather", "main", "tensorflow")),
                          "" if None in waits else f"{statistics.median(waits):.1%}",
                          "" if cap is None else f"{cap:.3f}", "" if cap is None else f"{median / cap:.3f}",
                          f"{1e3 * max(lags):.0f}" if lags else "", verdict])
    print(common.format_table(header, table))
    if args.json:
        common.write_json(args.json, {"args": vars(args), "machine": common.machine_info(), "rows": summary,
                                      "rounds": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
