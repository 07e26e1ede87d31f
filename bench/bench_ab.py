"""An A/B of two npyfeed installs, side by side in one run: the gather paths, each version in fresh processes.

For a change (before/after), a build option or another compiler (the prebuilt wheel against a source build): each
version is its own install (``pip install --no-deps --target DIR <wheel or checkout>``), imported in a fresh
subprocess with ``PYTHONPATH=DIR`` (the child checks that ``npyfeed.__file__`` is in DIR). Two data sets in the
users' shape (default 60 keys of (4800, 256), one float32 and one float64, W=100, B=256), warm in the page cache.
For each of R rounds, alternating the order (A, B in even rounds, B, A in odd ones), for each path, one child per
version opens a mapped ``WindowSource`` and times N batches (after a warm-up):

* ``float32``:    ``src.batches(B, shuffle=True, seed=round)`` over the float32 files (the users' case);
* ``float64``:    the same over the float64 files (converted to float32 in the gather);
* ``options``:    the float64 files with ``nan=0.0`` and ``normalize=(mean, std)`` per column (the transform kernels);
* ``blocks``:     ``shuffle="blocks"`` with a memory budget under the data's size (blocks read while timed);
* ``take``:       ``Plan.take(0, b)`` for consecutive b (the path of ``npyfeed.tf``'s native op);
* ``tf``:         ``npyfeed.tf.dataset(src, B, shuffle=True)`` read by ``next(iterator)`` in a ``tf.function`` (the
                  hand-off into TensorFlow: its native op); left out where TensorFlow cannot be imported.

Per path: median samples/s of A and B, the per-round ratio B/A (median, min, max, and a distribution-free ~95%
confidence interval of its median from the order statistics) and CPU time per sample. A path "differs" where the
interval lies wholly outside 1 +- ``--threshold`` (default 3%).

```
pip install --no-deps --target /tmp/ab-wheel dist/npyfeed-*-cp311-*.whl
pip install --no-build-isolation --no-deps --target /tmp/ab-source .
python bench/bench_ab.py --a /tmp/ab-source --name-a source --b /tmp/ab-wheel --name-b wheel [--json out.json]
python bench/bench_ab.py --a DIR --b DIR --quick      # seconds: a smoke run, numbers meaningless
```
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import sys
import time
from pathlib import Path

import common

PATHS = ("float32", "float64", "options", "blocks", "take", "tf")


def child(cfg: dict) -> dict:
    """One timed run in this process (its npyfeed comes from PYTHONPATH)."""
    import npyfeed

    here = os.path.realpath(npyfeed.__file__)
    if not here.startswith(os.path.realpath(cfg["install"]) + os.sep):
        raise SystemExit(f"npyfeed imported from {here}, not from {cfg['install']}")
    path, data = cfg["path"], cfg["data"]["float64" if cfg["path"] in ("float64", "options") else "float32"]
    options = {"nan": 0.0, "normalize": (0.5, 0.25)} if path == "options" else {}
    src = npyfeed.WindowSource(data["index_paths"], data["factor_dir"], data["label_dir"], cfg["window"],
                               mode="mmap", threads=cfg["threads"], **options)
    batch, warmup, n, seed = cfg["batch"], cfg["warmup"], cfg["batches"], cfg["seed"]
    if (warmup + n) * batch > len(src):
        raise SystemExit(f"{warmup + n} batches of {batch} need more than the {len(src)} samples of an epoch")
    if path == "take":
        plan = src.plan(batch, shuffle=True, seed=seed)
        step = iter(range(warmup + n)).__next__
        next_batch = lambda: plan.take(0, step())
    elif path == "tf":
        import npyfeed.tf
        import tensorflow as tf

        iterator = iter(npyfeed.tf.dataset(src, batch, shuffle=True, seed=seed))
        next_batch = tf.function(lambda: next(iterator))
    else:
        extra = {"shuffle": "blocks", "memory_budget": cfg["block_budget"]} if path == "blocks" else {}
        it = src.batches(batch, **{"shuffle": True, "seed": seed, **extra})
        next_batch = it.__next__
    for _ in range(warmup):
        next_batch()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        next_batch()
    t1, c1 = time.perf_counter(), time.process_time()
    return {"path": path, "samples_per_s": n * batch / (t1 - t0), "seconds": t1 - t0,
            "cpu_us_per_sample": (c1 - c0) / (n * batch) * 1e6, "load_1min": os.getloadavg()[0],
            "build": {k: v for k, v in npyfeed.build_info().items()
                      if k in ("compiler", "toolchain", "cxx_library", "avx2_used", "avx512_used")}}


def median_ci(values: list, level: float = 0.95) -> tuple:
    """Distribution-free confidence interval of the median: order statistics from the binomial(n, 1/2) (the sign
    test). With fewer than 6 values no interval reaches 95%: (min, max) then."""
    v, n = sorted(values), len(values)
    k, tail = 0, 0.0  # the largest k with P(Bin(n, 1/2) < k) <= (1 - level) / 2
    while k < n // 2:
        nxt = tail + math.comb(n, k) / 2 ** n
        if nxt > (1 - level) / 2:
            break
        tail, k = nxt, k + 1
    if k == 0:
        return v[0], v[-1], 1.0
    return v[k - 1], v[n - k], 1 - 2 * tail


def main(argv=None) -> int:
    if common.serve_child(argv, child):
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="install folder of version A (pip install --target)")
    p.add_argument("--b", required=True, help="install folder of version B")
    p.add_argument("--name-a", default="A")
    p.add_argument("--name-b", default="B")
    common.add_data_args(p, files=60, rows=4800, cols=256, dtype="float32")
    p.set_defaults(repeats=7, threads=2)
    p.add_argument("--rounds", dest="repeats", type=int, help="rounds, A and B each once per path (default 7)")
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=200, help="timed batches per run (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed batches first (default 20)")
    p.add_argument("--block-budget", type=int, default=128 << 20,
                   help='memory_budget of the shuffle="blocks" runs (default 128 MiB: read while timed)')
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    p.add_argument("--threshold", type=float, default=0.03, help="the difference called noise (default 0.03)")
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.rows, args.cols, args.repeats, args.batches, args.warmup, args.batch = 6, 600, 16, 2, 20, 2, 32
    paths = [s for s in args.paths.split(",") if s]
    if any(s not in PATHS for s in paths):
        p.error(f"--paths: a subset of {','.join(PATHS)}")
    if "tf" in paths and importlib.util.find_spec("tensorflow") is None:
        print("note: TensorFlow cannot be imported: the tf path is left out")
        paths.remove("tf")
    installs = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    names = {"A": args.name_a, "B": args.name_b}

    data, data_paths = {}, []
    for dtype in ("float32", "float64"):
        spec = common.DataSpec(files=args.files, rows=args.rows, cols=args.cols, dtype=dtype, label_cols=2,
                               window=max(args.window, 100))
        ds = common.make_dataset(args.dir, spec)
        factor_dir, label_dir = common.link_dir(Path(args.dir) / "ab-links" / spec.name, ds)
        data[dtype] = {"index_paths": ds.index_paths, "factor_dir": factor_dir, "label_dir": label_dir}
        data_paths += ds.factor_paths + ds.label_paths
    base = {"data": data, "window": args.window, "threads": args.threads, "batch": args.batch,
            "warmup": args.warmup, "batches": args.batches, "block_budget": args.block_budget}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    # The compiled index cache goes beside the data sets, not into the user's ~/.cache/npyfeed.
    env["NPYFEED_CACHE_DIR"] = str(Path(args.dir).resolve() / "ab-cache")

    print(f"npyfeed A/B: {args.files} x ({args.rows}, {args.cols}) float32 and float64, W={args.window}, "
          f"B={args.batch}, threads={args.threads}, {args.batches} timed batches after {args.warmup}, "
          f"{args.repeats} rounds, paths {','.join(paths)}")
    for v in "AB":
        print(f"  {v}: {names[v]}  {installs[v]}")
    t_start = time.perf_counter()
    runs = {(path, v): [] for path in paths for v in "AB"}
    for rnd in range(args.repeats):
        order = "AB" if rnd % 2 == 0 else "BA"
        common.warm(data_paths)
        for path in paths:
            for v in order:
                cfg = dict(base, install=installs[v], seed=rnd, path=path)
                runs[(path, v)].append(common.run_child(__file__, cfg, common.importing_from(env, installs[v]),
                                                        f"{names[v]}, {path}"))
            a, b = runs[(path, "A")][-1], runs[(path, "B")][-1]
            print(f"  round {rnd} ({order[0]} first) {path:8s} A {a['samples_per_s']:9,.0f}  "
                  f"B {b['samples_per_s']:9,.0f}  B/A {b['samples_per_s'] / a['samples_per_s']:.3f}", flush=True)
    wall = time.perf_counter() - t_start

    header = ("path", f"A: {names['A']} samples/s", f"B: {names['B']} samples/s", "B/A per round: median", "min",
              "max", "~95% CI of median", "cpu us/smp A", "cpu us/smp B", "verdict")
    rows, summary = [], {}
    for path in paths:
        a = [r["samples_per_s"] for r in runs[(path, "A")]]
        b = [r["samples_per_s"] for r in runs[(path, "B")]]
        ratios = [y / x for x, y in zip(a, b)]
        ca = statistics.median(r["cpu_us_per_sample"] for r in runs[(path, "A")])
        cb = statistics.median(r["cpu_us_per_sample"] for r in runs[(path, "B")])
        lo, hi, conf = median_ci(ratios)
        verdict = ("B slower" if hi < 1 - args.threshold else "B faster" if lo > 1 + args.threshold
                   else "within noise" if lo >= 1 - args.threshold and hi <= 1 + args.threshold else "not resolved")
        summary[path] = {"a_median": statistics.median(a), "b_median": statistics.median(b),
                         "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                         "ratio_max": max(ratios), "ratio_ci": [lo, hi], "ratio_ci_level": conf,
                         "cpu_us_per_sample": {"A": ca, "B": cb}, "verdict": verdict, "ratios": ratios}
        rows.append([path, f"{statistics.median(a):,.0f}", f"{statistics.median(b):,.0f}",
                     f"{statistics.median(ratios):.3f}", f"{min(ratios):.3f}", f"{max(ratios):.3f}",
                     f"{lo:.3f}-{hi:.3f} ({conf:.0%})", f"{ca:.2f}", f"{cb:.2f}", verdict])
    print()
    print(common.format_table(header, rows, align="lrrrrrrrrl"))
    builds = {v: runs[(paths[0], v)][0]["build"] for v in "AB"}
    for v in "AB":
        print(f"  {v}: {builds[v]}")
    print(f"B/A per round: B's run over A's run of the same round (adjacent in time, order alternating); CI: order "
          f"statistics of the per-round ratios (sign test); {wall:.0f} s on {common.machine_info()['cpus']} CPUs")
    if args.quick:
        print("\n(--quick: tiny sizes; these numbers mean nothing)")
    if args.json:
        common.write_json(args.json, {
            "bench": "bench_ab", "config": vars(args), "installs": installs, "names": names, "builds": builds,
            "machine": common.machine_info(), "wall_seconds": wall, "summary": summary,
            "runs": {f"{path}/{v}": rs for (path, v), rs in runs.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
