"""Windows written around the caches: the gather's copies into a batch with streaming stores, and with memcpy.

A batch of the users' shape (B=256 windows of (100, 256) float32: 26 MB) is larger than what the caches keep
between the gather and its consumer; memcpy's stores first read every destination line in (a read for
ownership) and push out the data still to be copied. From 16 MiB a batch, npyfeed writes the windows with
non-temporal (streaming) stores instead (docs/windows.md). Here ``NPYFEED_STREAMING=0`` (off) runs against
``=1`` (on, whatever the batch size); ``NPYFEED_PREFETCH`` in the environment applies to every variant. With
``--baseline DIR`` a third variant runs the same consumers with another npyfeed install (streaming on: ``pip
install --no-build-isolation --no-deps --target DIR <checkout>``, imported with ``PYTHONPATH=DIR``) in the same
rounds: a before/after of a change to the copy itself (e.g. the non-temporal prefetch of the source), reported
as this build over the baseline per round.

``--options`` gives every variant the same gather options (``nan``: ``nan=0, posinf=1e6, neginf=-1e6``;
``normalize``: a mean and std per column; ``every4th``: ``features=slice(None, None, 4)``; ``all``: the first
two and a quarter of the columns as a slice), and ``--sequential`` reads the windows in index order (overlapping
windows one after another) instead of shuffled: the converting and selecting paths, measured the same way.

One warm data set (default 60 keys of (4800, 256) float32, ~295 MB, W=100, B=256, mode="mmap"). Each round is a
fresh process per variant (off, on), their order alternating between rounds; a process runs each consumer over
the same source: the numpy iterator (``src.batches``, nothing read), the numpy iterator whose consumer reads the
whole batch (``x.sum()``), and, with TensorFlow, ``npyfeed.tf.dataset`` read inside a ``tf.function``; each
``--batches`` batches after one warm-up pass of them. Per variant and consumer: median samples/s, CPU ms per
batch (all threads, getrusage), and on/off per round; beside them the machine's copy limit (``memcpy`` by
``--threads`` threads, as samples/s of W*F*4 bytes) measured in the same run.

```
python bench/bench_streaming.py --dir /tmp/streaming-data [--rounds 6] [--json out.json]
python bench/bench_streaming.py --dir /tmp/streaming-data --baseline /tmp/npyfeed-before
python bench/bench_streaming.py --dir /tmp/streaming-data --baseline /tmp/npyfeed-before --options nan --sequential
python bench/bench_streaming.py --quick          # seconds: a smoke run, numbers meaningless
```
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

VARIANTS = {"off": "0", "on": "1"}  # NPYFEED_STREAMING, for this build and (on) the baseline
CONSUMERS = ("numpy", "numpy, batch read", "tf.function")
OPTIONS = ("none", "nan", "normalize", "every4th", "all")


def gather_options(name: str, cols: int) -> dict:
    """The WindowSource keyword arguments of --options `name` for rows of `cols` columns."""
    import numpy as np

    mean, std = np.linspace(-1.0, 1.0, cols), np.linspace(0.5, 2.0, cols)
    replace = {"nan": 0.0, "posinf": 1e6, "neginf": -1e6}
    quarter = slice(0, max(cols // 4, 1))
    return {"none": {}, "nan": replace, "normalize": {"normalize": (mean, std)},
            "every4th": {"features": slice(None, None, 4)},
            "all": {**replace, "features": quarter, "normalize": (mean[quarter], std[quarter])}}[name]


def child(cfg: dict) -> dict:
    """One process: each consumer over one source, after a warm-up of the same length. Printed as JSON."""
    import npyfeed

    src = npyfeed.WindowSource(cfg["index_paths"], cfg["factor_dir"], cfg["label_dir"], cfg["window"],
                               mode="mmap", threads=cfg["threads"], **gather_options(cfg["options"], cfg["cols"]))
    batch, batches, shuffle = cfg["batch"], cfg["batches"], not cfg["sequential"]
    epoch = [0]

    def numpy_rows(read: bool):
        def run() -> int:
            epoch[0] += 1
            n = 0
            for i, (x, _y) in enumerate(src.batches(batch, shuffle=shuffle, epoch=epoch[0])):
                n += len(x)
                if read:
                    float(x.sum())
                if i + 1 == batches:
                    break
            return n
        return run

    runs = {"numpy": numpy_rows(False), "numpy, batch read": numpy_rows(True)}
    if cfg["tf"]:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import npyfeed.tf as nftf
        import tensorflow as tf

        iterator = iter(nftf.dataset(src, batch, shuffle=shuffle).repeat())

        @tf.function
        def consume(steps):
            samples = tf.constant(0, tf.int64)
            for _ in tf.range(steps):
                x, _y = next(iterator)
                samples += tf.shape(x, out_type=tf.int64)[0]
            return samples

        runs["tf.function"] = lambda: int(consume(tf.constant(batches, tf.int64)))
    out = {"load": os.getloadavg()[0], "x_shape": list(src.x_shape), "consumers": {}}
    for name, run in runs.items():
        run()  # warm-up: mappings, buffers, tracing
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        n = run()
        seconds, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
        out["consumers"][name] = {"samples_per_s": n / seconds, "cpu_ms_per_batch": 1e3 * cpu / (n / batch)}
    return out


def run_child(cfg: dict, streaming: str | None, baseline: str | None = None) -> dict:
    env = dict(os.environ, NPYFEED_CACHE_DIR=cfg["cache_dir"])
    env.pop("NPYFEED_STREAMING", None)
    if streaming is not None:
        env["NPYFEED_STREAMING"] = streaming
    import common

    if baseline is not None:
        env = common.importing_from(env, baseline)

    return common.run_child(__file__, cfg, env, f"NPYFEED_STREAMING={streaming}" + (f" {baseline}" if baseline else ""))


def main(argv=None) -> int:
    import common

    if common.serve_child(argv, child):
        return 0

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_data_args(p, files=60, rows=4800, cols=256, dtype="float32")
    p.set_defaults(repeats=6)
    p.add_argument("--rounds", dest="repeats", type=int, help="rounds, each variant once per round (default 6)")
    p.add_argument("--batches", type=int, default=384, help="batches per consumer and process (default 384)")
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--no-tf", action="store_true", help="skip the tf.function consumer (no TensorFlow import)")
    p.add_argument("--baseline", metavar="DIR", help="also run another npyfeed install (streaming on) in the same rounds")
    p.add_argument("--options", choices=OPTIONS, default="none", help="gather options of every variant (default none)")
    p.add_argument("--sequential", action="store_true", help="windows in index order (default: shuffled)")
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.rows, args.cols, args.repeats, args.batch, args.batches = 3, 400, 16, 1, 32, 4
    threads = common.resolve_threads(args.threads)
    try:
        import tensorflow  # noqa: F401
        use_tf = not args.no_tf
    except ImportError:
        use_tf = False

    spec = common.DataSpec(files=args.files, rows=args.rows, cols=args.cols, dtype=args.dtype, label_cols=2,
                           window=max(args.window, 100))
    ds = common.make_dataset(args.dir, spec)
    factor_dir, label_dir = common.link_dir(Path(args.dir) / "streaming-links" / spec.name, ds)
    cfg = {"index_paths": ds.index_paths, "factor_dir": factor_dir, "label_dir": label_dir, "window": args.window,
           "threads": threads, "batch": args.batch, "batches": args.batches, "tf": use_tf, "cols": args.cols,
           "options": args.options, "sequential": args.sequential,
           "cache_dir": str(Path(args.dir).resolve() / "streaming-cache")}
    sample_bytes = args.window * args.cols * 4
    print(f"streaming stores off/on: {spec.files} x ({spec.rows}, {spec.cols}) {spec.dtype}, W={args.window}, "
          f"B={args.batch} ({args.batch * sample_bytes / 2**20:.1f} MiB a batch of x), threads={threads}, "
          f"{args.batches} batches per consumer, {args.repeats} rounds, options {args.options}, "
          f"{'in index order' if args.sequential else 'shuffled'}", flush=True)
    from npyfeed import _core

    machine = common.machine_info()
    print(f"this machine: {machine['cpu']}, last-level cache {(machine['last_level_cache_bytes'] or 0) / 2**20:,.0f} "
          f"MiB; the source read once fetched with a non-temporal prefetch: "
          f"{'yes' if _core.prefetch_read_once() else 'no'} (NPYFEED_PREFETCH); AVX-512 stores: "
          f"{'yes' if _core.uses_avx512() else 'no'} (NPYFEED_AVX512)", flush=True)
    common.warm(ds.factor_paths + ds.label_paths)
    variants = list(VARIANTS) + (["baseline"] if args.baseline else [])
    runs = {v: [] for v in variants}
    limits = []
    for r in range(args.repeats):
        limits.append(common.memcpy_bandwidth(threads) * common.GB / sample_bytes)
        for v in (variants if r % 2 == 0 else list(reversed(variants))):
            runs[v].append(run_child(cfg, "1", args.baseline) if v == "baseline" else run_child(cfg, VARIANTS[v]))
        print(f"  round {r + 1}: " + "  ".join(
            f"{v}: " + " / ".join(f"{c['samples_per_s']:,.0f}" for c in runs[v][-1]["consumers"].values())
            for v in variants) + f"  load {os.getloadavg()[0]:.2f}", flush=True)
    limit = max(limits)

    consumers = [c for c in CONSUMERS if c in runs["on"][0]["consumers"]]

    def per_round(c: str, a: str, b: str) -> list:
        return [x["consumers"][c]["samples_per_s"] / y["consumers"][c]["samples_per_s"]
                for x, y in zip(runs[a], runs[b])]

    header = ["consumer", "streaming", "samples/s (median)", "CPU ms/batch", "x copy limit", "on/off per round",
              "on/off median"] + (["on/baseline per round", "on/baseline median"] if args.baseline else [])
    rows, summary = [], {}
    for c in consumers:
        ratios = per_round(c, "on", "off")
        against_baseline = per_round(c, "on", "baseline") if args.baseline else []
        for v in variants:
            rate = statistics.median(x["consumers"][c]["samples_per_s"] for x in runs[v])
            cpu = statistics.median(x["consumers"][c]["cpu_ms_per_batch"] for x in runs[v])
            summary[f"{c}: {v}"] = {"samples_per_s": rate, "cpu_ms_per_batch": cpu, "x_limit": rate / limit,
                                    "rates": [x["consumers"][c]["samples_per_s"] for x in runs[v]]}
            last = v == "on"
            row = [c, v, f"{rate:,.0f}", f"{cpu:.2f}", f"{rate / limit:.2f}",
                   " / ".join(f"{q:.2f}" for q in ratios) if last else "",
                   f"{statistics.median(ratios):.3f}" if last else ""]
            if args.baseline:
                row += [" / ".join(f"{q:.2f}" for q in against_baseline) if last else "",
                        f"{statistics.median(against_baseline):.3f}" if last else ""]
            rows.append(row)
        summary[f"{c}: on/off"] = ratios
        if args.baseline:
            summary[f"{c}: on/baseline"] = against_baseline
    print()
    print(common.format_table(header, rows, align="ll" + "r" * (len(header) - 2)))
    loads = [x["load"] for v in variants for x in runs[v]]
    print(f"\ncopy limit: memcpy by {threads} threads, best of the rounds: {limit:,.0f} samples/s "
          f"({limit * sample_bytes / common.GB:.2f} GB/s); load seen by the children {min(loads):.2f}-{max(loads):.2f} "
          f"on {machine['cpus']} CPUs")
    if args.json:
        common.write_json(args.json, {"args": vars(args), "machine": machine, "limit": limit,
                                      "prefetch_read_once": _core.prefetch_read_once(),
                                      "uses_avx512": _core.uses_avx512(),
                                      "limits": limits, "summary": summary, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
