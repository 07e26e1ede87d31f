"""An A/B of npyfeed in fresh processes, side by side in one run: two installs, or two settings of one install.

A version is an npyfeed install and the environment variables of its processes:

* two installs, for a change (before/after), a build option or another compiler (the prebuilt wheel against a
  source build): each version is its own install (``pip install --no-deps --target DIR <wheel or checkout>``),
  imported in a fresh subprocess with ``PYTHONPATH=DIR`` (the child checks that ``npyfeed.__file__`` is in DIR).
  ``--a`` defaults to the folder of the installed npyfeed (the one ``python -c "import npyfeed"`` imports), ``--b``
  to ``--a``'s;
* two settings, for a switch the core reads from the environment (``NPYFEED_STREAMING``, ``NPYFEED_POPULATE``,
  ``NPYFEED_PREFETCH``, ...): ``--env-a NAME=VALUE`` and ``--env-b NAME=VALUE`` (repeatable) set variables in A's and
  in B's processes only, over one install (no ``--a`` needed) or two. Each child records the ``NPYFEED_*`` variables
  it ran with.

Data sets in the users' shape (default 60 keys of (4800, 256), float32 and, for the paths that read it, float64,
W=100, B=256), warm in the page cache. For each of R rounds, alternating the order (A, B in even rounds, B, A in odd
ones), for each path, one child per version opens a mapped ``WindowSource`` and times N batches (after a warm-up):

* ``float32``:    ``src.batches(B, shuffle=True, seed=round)`` over the float32 files (the users' case);
* ``float64``:    the same over the float64 files (converted to float32 in the gather);
* ``options``:    the float64 files with ``nan=0.0`` and ``normalize=(mean, std)`` per column (the transform kernels);
* ``blocks``:     ``shuffle="blocks"`` with a memory budget under the data's size (blocks read while timed);
* ``take``:       ``Plan.take(0, b)`` for consecutive b (the path of ``npyfeed.tf``'s native op);
* ``tf``:         ``npyfeed.tf.dataset(src, B, shuffle=True)`` read by ``next(iterator)`` in a ``tf.function`` (the
                  hand-off into TensorFlow: its native op); left out where TensorFlow cannot be imported;
* ``consumed``:   ``float32`` with a consumer that reads every batch (``x.sum()``): what the batch costs to read
                  back from where the gather's stores left it (streaming stores write past the caches);
* ``first_pass``: no warm-up and no N: the first whole pass of ``src.batches(B, shuffle=True, seed=round)`` over the
                  freshly opened source and its second (``seed=round + 1``), each with its minor page faults
                  (``ru_minflt``) and CPU; the rate is the first pass', the record holds first/second (target >= 0.9:
                  the page tables of a fresh mapping start empty, which populating ahead of the gather hides).

The default ``--paths`` are the first six. Per path: median samples/s of A and B, the per-round ratio B/A (median,
min, max, and a distribution-free ~95% confidence interval of its median from the order statistics) and CPU time
per sample. A path "differs" where the interval lies wholly outside 1 +- ``--threshold`` (default 3%). Beside them:
the copy limit (``memcpy`` by ``--threads`` threads, measured in this process once per round between the children,
best kept, as samples/s of W*F*4 bytes) and each median against it; for ``first_pass``, first/second of each
version, minor faults and CPU per sample of each pass. ``--json`` writes the summary and every child's record.

The committed results (``bench/results/``) came from:

```
pip install --no-deps --target /tmp/ab-wheel dist/npyfeed-*-cp311-*.whl
pip install --no-build-isolation --no-deps --target /tmp/ab-source .
python3 bench/bench_ab.py --a /tmp/ab-source --name-a source --b /tmp/ab-wheel --name-b wheel --rounds 7 \
    --json bench/results/wheel_ab.json
python3 bench/bench_ab.py --name-a "streaming off" --env-a NPYFEED_STREAMING=0 --name-b "streaming on" \
    --env-b NPYFEED_STREAMING=1 --paths float32,consumed,tf --batches 384 --rounds 4 --json bench/results/streaming.json
python3 bench/bench_ab.py --name-a "populate off" --env-a NPYFEED_POPULATE=0 --name-b "populate on" \
    --env-b NPYFEED_POPULATE=1 --paths first_pass --rounds 11 --json bench/results/first_pass.json
python3 bench/bench_ab.py --env-b NPYFEED_PREFETCH=0 --quick    # seconds: a smoke run, numbers meaningless
```
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import common

PATHS = ("float32", "float64", "options", "blocks", "take", "tf", "consumed", "first_pass")
DEFAULT_PATHS = PATHS[:6]


def source_dtype(path: str) -> str:
    """The dtype of the files `path` reads."""
    return "float64" if path in ("float64", "options") else "float32"


def two_passes(src, batch: int, seed: int) -> dict:
    """The first and the second whole pass over `src` (opened just before): samples/s, minor faults, CPU each."""
    passes = []
    for p in range(2):
        f0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time(), time.perf_counter()
        n = sum(len(x) for x, _ in src.batches(batch, shuffle=True, seed=seed + p))
        t1, c1, f1 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        passes.append({"samples": n, "seconds": t1 - t0, "samples_per_s": n / (t1 - t0), "minor_faults": f1 - f0,
                       "cpu_us_per_sample": (c1 - c0) / n * 1e6})
    first, second = passes
    return {"samples_per_s": first["samples_per_s"], "seconds": first["seconds"],
            "cpu_us_per_sample": first["cpu_us_per_sample"], "passes": passes,
            "first_over_second": first["samples_per_s"] / second["samples_per_s"]}


def child(cfg: dict) -> dict:
    """One timed run in this process (its npyfeed comes from PYTHONPATH)."""
    import npyfeed

    here = os.path.realpath(npyfeed.__file__)
    if not here.startswith(os.path.realpath(cfg["install"]) + os.sep):
        raise SystemExit(f"npyfeed imported from {here}, not from {cfg['install']}")
    path, data = cfg["path"], cfg["data"][source_dtype(cfg["path"])]
    options = {"nan": 0.0, "normalize": (0.5, 0.25)} if path == "options" else {}
    src = npyfeed.WindowSource(data["index_paths"], data["factor_dir"], data["label_dir"], cfg["window"],
                               mode="mmap", threads=cfg["threads"], **options)
    record = {"path": path, "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NPYFEED_")},
              "build": {k: v for k, v in npyfeed.build_info().items()
                        if k in ("compiler", "toolchain", "cxx_library", "avx2_used", "avx512_used")}}
    batch, warmup, n, seed = cfg["batch"], cfg["warmup"], cfg["batches"], cfg["seed"]
    if path == "first_pass":
        return {**record, **two_passes(src, batch, seed), "load_1min": os.getloadavg()[0]}
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
        next_batch = (lambda: float(next(it)[0].sum())) if path == "consumed" else it.__next__
    for _ in range(warmup):
        next_batch()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        next_batch()
    t1, c1 = time.perf_counter(), time.process_time()
    return {**record, "samples_per_s": n * batch / (t1 - t0), "seconds": t1 - t0,
            "cpu_us_per_sample": (c1 - c0) / (n * batch) * 1e6, "load_1min": os.getloadavg()[0]}


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


def pass_summary(records: list) -> dict:
    """first_pass: first/second of each run and their median; samples/s, minor faults, CPU per sample of each pass
    (medians)."""
    ratios = [r["first_over_second"] for r in records]
    out = {"first_over_second": statistics.median(ratios), "first_over_second_runs": ratios}
    for key in ("samples_per_s", "minor_faults", "cpu_us_per_sample"):
        out[key] = [statistics.median(r["passes"][i][key] for r in records) for i in (0, 1)]
    return out


def installed_npyfeed() -> str:
    """The folder the installed npyfeed is imported from (this process runs from bench/, not a checkout)."""
    return str(Path(importlib.util.find_spec("npyfeed").origin).resolve().parents[1])


def main(argv=None) -> int:
    if common.serve_child(argv, child):
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", help="install folder of version A (pip install --target; default: the installed npyfeed's)")
    p.add_argument("--b", help="install folder of version B (default: A's)")
    p.add_argument("--name-a", default="A")
    p.add_argument("--name-b", default="B")
    p.add_argument("--env-a", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable of A's processes (repeatable)")
    p.add_argument("--env-b", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable of B's processes (repeatable)")
    common.add_data_args(p, files=60, rows=4800, cols=256, dtype="float32")
    p.set_defaults(repeats=7, threads=2)
    p.add_argument("--rounds", dest="repeats", type=int, help="rounds, A and B each once per path (default 7)")
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=200, help="timed batches per run (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed batches first (default 20)")
    p.add_argument("--block-budget", type=int, default=128 << 20,
                   help='memory_budget of the shuffle="blocks" runs (default 128 MiB: read while timed)')
    p.add_argument("--paths", default=",".join(DEFAULT_PATHS),
                   help=f"comma-separated subset of {','.join(PATHS)} (default {','.join(DEFAULT_PATHS)})")
    p.add_argument("--threshold", type=float, default=0.03, help="the difference called noise (default 0.03)")
    p.add_argument("--target", type=float, default=0.9, help="first_pass: first / second pass at least (default 0.9)")
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.rows, args.cols, args.repeats, args.batches, args.warmup, args.batch = 6, 600, 16, 2, 20, 2, 32
    paths = [s for s in args.paths.split(",") if s]
    if any(s not in PATHS for s in paths):
        p.error(f"--paths: a subset of {','.join(PATHS)}")
    if any("=" not in s[1:] for s in args.env_a + args.env_b):
        p.error("--env-a, --env-b: NAME=VALUE")
    if "tf" in paths and importlib.util.find_spec("tensorflow") is None:
        print("note: TensorFlow cannot be imported: the tf path is left out")
        paths.remove("tf")
    install_a = os.path.abspath(args.a or installed_npyfeed())
    installs = {"A": install_a, "B": os.path.abspath(args.b) if args.b else install_a}
    names = {"A": args.name_a, "B": args.name_b}
    envs = {"A": dict(s.split("=", 1) for s in args.env_a), "B": dict(s.split("=", 1) for s in args.env_b)}

    data, data_paths = {}, []
    dtypes = sorted({source_dtype(path) for path in paths}, reverse=True)
    for dtype in dtypes:
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
    sample_bytes = args.window * args.cols * 4

    print(f"npyfeed A/B: {args.files} x ({args.rows}, {args.cols}) {' and '.join(dtypes)}, W={args.window}, "
          f"B={args.batch}, threads={args.threads}, {args.batches} timed batches after {args.warmup}, "
          f"{args.repeats} rounds, paths {','.join(paths)}")
    for v in "AB":
        print(f"  {v}: {names[v]}  {installs[v]}" + "".join(f"  {k}={x}" for k, x in envs[v].items()))
    t_start = time.perf_counter()
    runs = {(path, v): [] for path in paths for v in "AB"}
    limits = []
    for rnd in range(args.repeats):
        order = "AB" if rnd % 2 == 0 else "BA"
        common.warm(data_paths)
        limits.append(common.memcpy_bandwidth(args.threads) * common.GB / sample_bytes)
        for path in paths:
            for v in order:
                cfg = dict(base, install=installs[v], seed=rnd, path=path)
                child_env = common.importing_from(dict(env, **envs[v]), installs[v])
                runs[(path, v)].append(common.run_child(__file__, cfg, child_env, f"{names[v]}, {path}"))
            a, b = runs[(path, "A")][-1], runs[(path, "B")][-1]
            passes = (f"  first/second A {a['first_over_second']:.3f} B {b['first_over_second']:.3f}"
                      if path == "first_pass" else "")
            print(f"  round {rnd} ({order[0]} first) {path:10s} A {a['samples_per_s']:9,.0f}  "
                  f"B {b['samples_per_s']:9,.0f}  B/A {b['samples_per_s'] / a['samples_per_s']:.3f}{passes}",
                  flush=True)
    wall = time.perf_counter() - t_start
    limit = max(limits)

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
                         "cpu_us_per_sample": {"A": ca, "B": cb}, "verdict": verdict, "ratios": ratios,
                         "x_copy_limit": {"A": statistics.median(a) / limit, "B": statistics.median(b) / limit}}
        if path == "first_pass":
            summary[path]["passes"] = {v: pass_summary(runs[(path, v)]) for v in "AB"}
        rows.append([path, f"{statistics.median(a):,.0f}", f"{statistics.median(b):,.0f}",
                     f"{statistics.median(ratios):.3f}", f"{min(ratios):.3f}", f"{max(ratios):.3f}",
                     f"{lo:.3f}-{hi:.3f} ({conf:.0%})", f"{ca:.2f}", f"{cb:.2f}", verdict])
    print()
    print(common.format_table(header, rows, align="lrrrrrrrrl"))
    builds = {v: runs[(paths[0], v)][0]["build"] for v in "AB"}
    for v in "AB":
        print(f"  {v}: {builds[v]}")
    print(f"copy limit: memcpy by {args.threads} threads, best of the rounds: {limit:,.0f} samples/s of "
          f"{sample_bytes:,} bytes ({limit * sample_bytes / common.GB:.2f} GB/s); x copy limit, A / B: "
          + ", ".join(f"{path} {s['x_copy_limit']['A']:.2f} / {s['x_copy_limit']['B']:.2f}"
                      for path, s in summary.items()))
    for v, s in summary.get("first_pass", {}).get("passes", {}).items():
        fs, rate, faults, cpu = s["first_over_second_runs"], s["samples_per_s"], s["minor_faults"], s["cpu_us_per_sample"]
        verdict = "met" if s["first_over_second"] >= args.target else "MISSED"
        print(f"first_pass {v} ({names[v]}): first/second {s['first_over_second']:.3f} ({min(fs):.3f}-{max(fs):.3f}; "
              f"target >= {args.target}: {verdict}); passes 1 / 2: {rate[0]:,.0f} / {rate[1]:,.0f} samples/s, "
              f"{faults[0]:,.0f} / {faults[1]:,.0f} minor faults, {cpu[0]:.2f} / {cpu[1]:.2f} CPU us/sample")
    print(f"B/A per round: B's run over A's run of the same round (adjacent in time, order alternating); CI: order "
          f"statistics of the per-round ratios (sign test); {wall:.0f} s on {common.machine_info()['cpus']} CPUs")
    if args.quick:
        print("\n(--quick: tiny sizes; these numbers mean nothing)")
    if args.json:
        common.write_json(args.json, {
            "bench": "bench_ab", "config": vars(args), "installs": installs, "names": names, "envs": envs,
            "builds": builds, "machine": common.machine_info(), "wall_seconds": wall,
            "copy_limit": {"threads": args.threads, "sample_bytes": sample_bytes, "samples_per_s": limit,
                           "rounds": limits},
            "summary": summary, "runs": {f"{path}/{v}": rs for (path, v), rs in runs.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
