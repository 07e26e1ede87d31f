"""What the always-on pipeline statistics cost: an A/B of two npyfeed installs, side by side in one run.

A is a build without the statistics (a5cee2b), B one with them (1247ab2: relaxed atomic adds per batch into the
plan's and the source's counters, two steady_clock reads per gather runner and per consumer wait, a look at the
read-ahead per batch). The requirement: they cost at most 1% of throughput.

Each version is its own install (``pip install --no-build-isolation --no-deps --target DIR <checkout>``), imported
in a fresh subprocess with ``PYTHONPATH=DIR`` (the child checks ``npyfeed.__file__`` and whether
``WindowSource.stats`` exists). One data set in the users' shape (default 120 keys of (4800, 256) float32, ~590 MB,
W=100, B=256), warm in the page cache. For each of R rounds, alternating the order (A, B in even rounds, B, A in
odd ones) and for each path, one child per version opens ``WindowSource(..., mode="mmap", threads=T)`` and times
N batches (after a warm-up) of:

* ``batches``: the numpy iterator, ``src.batches(B, shuffle=True, seed=round)``;
* ``blocks``:  ``src.batches(B, shuffle="blocks", seed=round, memory_budget=...)`` (a budget under the data's size,
  so that blocks are read, and counted, while the clock runs);
* ``take``:    ``Plan.take(0, b)`` for consecutive b of ``src.plan(B, shuffle=True, seed=round)`` (the path
  ``npyfeed.tf``'s native op takes).

The consumer does nothing with a batch: the per-batch cost of the statistics is as large a share of the time as
it can be. Per path: median samples/s of A and B, the per-round ratio B/A (median, min, max, and a
distribution-free ~95% confidence interval of its median from the order statistics), and CPU time per sample
(the process's, all threads) for the same. B's ``src.stats()`` after each run is kept as a sanity check
(wait_fraction, gather_seconds).

```
pip install --no-build-isolation --no-deps --target /work/ab-install-A <checkout of a5cee2b>   # and B
python bench/bench_stats_overhead.py --a /work/ab-install-A --b /work/ab-install-B --dir /tmp/ab-data \
    [--rounds 7] [--batches 300] [--json out.json]
python bench/bench_stats_overhead.py --a DIR --b DIR --quick      # seconds: a smoke run, numbers meaningless
```
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PATHS = ("batches", "blocks", "take")


# ------------------------------------------------------------------------------------------------ child


def child(cfg: dict) -> dict:
    """One timed run in this process (its npyfeed comes from PYTHONPATH): a dict, printed as JSON."""
    import npyfeed
    import numpy as np  # noqa: F401  (imported as a user's process has it)

    here = os.path.realpath(npyfeed.__file__)
    if not here.startswith(os.path.realpath(cfg["install"]) + os.sep):
        raise SystemExit(f"npyfeed imported from {here}, not from {cfg['install']}")
    has_stats = hasattr(npyfeed.WindowSource, "stats")
    if has_stats != cfg["expect_stats"]:
        raise SystemExit(f"{here}: WindowSource.stats present={has_stats}, expected {cfg['expect_stats']}")
    src = npyfeed.WindowSource(cfg["index_paths"], cfg["factor_dir"], cfg["label_dir"], cfg["window"],
                               mode="mmap", threads=cfg["threads"])
    batch, warmup, n, seed, path = cfg["batch"], cfg["warmup"], cfg["batches"], cfg["seed"], cfg["path"]
    if (warmup + n) * batch > len(src):
        raise SystemExit(f"{warmup + n} batches of {batch} need more than the {len(src)} samples of an epoch")
    load_before = os.getloadavg()[0]
    if path == "take":
        plan = src.plan(batch, shuffle=True, seed=seed)
        for b in range(warmup):
            plan.take(0, b)
        c0, t0 = time.process_time(), time.perf_counter()
        for b in range(warmup, warmup + n):
            plan.take(0, b)
        t1, c1 = time.perf_counter(), time.process_time()
        plan.close()
    else:
        shuffle = True if path == "batches" else "blocks"
        extra = {"memory_budget": cfg["block_budget"]} if path == "blocks" else {}
        it = src.batches(batch, shuffle=shuffle, seed=seed, **extra)
        for _ in range(warmup):
            next(it)
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            next(it)
        t1, c1 = time.perf_counter(), time.process_time()
        it.close()
    out = {"path": path, "samples_per_s": n * batch / (t1 - t0), "seconds": t1 - t0,
           "cpu_us_per_sample": (c1 - c0) / (n * batch) * 1e6, "load_1min": [load_before, os.getloadavg()[0]],
           "npyfeed_file": here, "has_stats": has_stats}
    if has_stats:
        s = src.stats()
        out["stats"] = {k: s[k] for k in ("batches", "samples", "wait_fraction", "wait_seconds", "elapsed_seconds",
                                          "gather_seconds", "read_ahead", "blocks_read", "block_read_seconds")}
    return out


# ----------------------------------------------------------------------------------------------- parent


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


def run_child(py: str, install: str, cfg: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["PYTHONPATH"] = install
    # The compiled index cache goes beside the data set, not into the user's ~/.cache/npyfeed.
    env["NPYFEED_CACHE_DIR"] = cfg["cache_dir"]
    env.setdefault("OMP_NUM_THREADS", "1")
    r = subprocess.run([py, "-s", __file__, "--child", json.dumps(cfg)], env=env,
                       capture_output=True, text=True, cwd="/")
    if r.returncode != 0:
        raise SystemExit(f"child ({install}, {cfg['path']}) failed with {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def estimate_text(batch: int, threads: int, rate: float) -> list:
    """The statistics' per-batch work, counted from the code (1247ab2), for the table's footer; `rate` is A's
    measured samples/s."""
    per_batch_us = batch / rate * 1e6
    return [
        "first-principles estimate of the added work per batch (1247ab2):",
        "  served(): 6 relaxed fetch_adds into the plan's counters and 6 into the source's (12 uncontended atomics);",
        "  waited(): 2 steady_clock reads by the consumer, 1 fetch_add + 1 CAS + 1 CAS loop, twice (plan, source);",
        f"  Job::run_items: 2 steady_clock reads + 1 fetch_add per gather runner ({threads} runners: "
        f"{2 * threads} reads);",
        "  ready_at_front(): one Job::wait_for(0) per complete batch at the front of the read-ahead (prefetch 2:"
        " <= 3: a mutex lock/unlock and a steady_clock read each);",
        "  about 10 clock reads (vDSO: ~20 ns each on a 2-core x86 VM with the tsc clocksource) + ~20 atomic RMWs"
        " (~5 ns uncontended, ~100 ns when the line moves between cores) + <= 3 wait_for(0) (~25 ns each):",
        f"  ~0.3-2 us per batch of {batch} samples;",
        f"  against ~{per_batch_us:,.0f} us per batch at A's {rate:,.0f} samples/s: ~{0.3 / per_batch_us:.2%}-"
        f"{2 / per_batch_us:.2%} of the time expected (a ratio B/A of ~{1 - 2 / per_batch_us:.4f}-"
        f"{1 - 0.3 / per_batch_us:.4f}).",
    ]


def main(argv=None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--child")
    known, _ = pre.parse_known_args(argv)
    if known.child:
        print(json.dumps(child(json.loads(known.child))))
        return 0

    pre.add_argument("--b")
    known, _ = pre.parse_known_args(argv)
    if known.b and known.b not in sys.path:
        sys.path.insert(0, known.b)  # the data-set generator (common -> npyfeed._layout), this process only
    import common

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="install folder of version A (no statistics), e.g. a5cee2b's")
    p.add_argument("--b", required=True, help="install folder of version B (with statistics), e.g. 1247ab2's")
    p.add_argument("--name-a", default="A (a5cee2b, no stats)")
    p.add_argument("--name-b", default="B (1247ab2, stats)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the children (default: this one)")
    common.add_data_args(p, files=120, rows=4800, cols=256, dtype="float32")
    p.set_defaults(repeats=7, threads=2)
    p.add_argument("--rounds", dest="repeats", type=int, help="rounds, A and B each once per path (default 7)")
    p.add_argument("--labels", type=int, default=2, help="label columns (default 2)")
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=300, help="timed batches per run (default 300)")
    p.add_argument("--warmup", type=int, default=20, help="untimed batches first (default 20)")
    p.add_argument("--block-budget", type=int, default=128 << 20,
                   help='memory_budget of the shuffle="blocks" runs (default 128 MiB: blocks of ~64 MB, read while '
                        "the clock runs)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    p.add_argument("--threshold", type=float, default=0.01, help="the allowed cost (default 0.01 = 1%%)")
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.rows, args.cols, args.repeats, args.batches, args.warmup, args.batch = 6, 600, 16, 2, 20, 2, 32
    paths = [s for s in args.paths.split(",") if s]
    if any(s not in PATHS for s in paths):
        p.error(f"--paths: one of {PATHS}")
    installs = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    names = {"A": args.name_a, "B": args.name_b}

    spec = common.DataSpec(files=args.files, rows=args.rows, cols=args.cols, dtype=args.dtype,
                           label_cols=args.labels, window=max(args.window, 100))
    ds = common.make_dataset(args.dir, spec)
    factor_dir, label_dir = common.link_dir(Path(args.dir) / "stats-overhead-links" / spec.name, ds)
    data_paths = ds.factor_paths + ds.label_paths
    base = {"index_paths": ds.index_paths, "factor_dir": factor_dir, "label_dir": label_dir, "window": args.window,
            "threads": args.threads, "batch": args.batch, "warmup": args.warmup, "batches": args.batches,
            "block_budget": args.block_budget, "cache_dir": str(Path(args.dir).resolve() / "stats-overhead-cache")}

    print(f"npyfeed stats overhead A/B: {spec.files} x ({spec.rows}, {spec.cols}) {spec.dtype} "
          f"({spec.factor_nbytes / common.GB:.2f} GB), W={args.window}, B={args.batch}, threads={args.threads}, "
          f"{args.batches} timed batches after {args.warmup}, {args.repeats} rounds, paths {','.join(paths)}")
    for v in "AB":
        print(f"  {v}: {names[v]}  {installs[v]}")
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    runs = {(path, v): [] for path in paths for v in "AB"}
    loads, residency = [], []
    for rnd in range(args.repeats):
        order = "AB" if rnd % 2 == 0 else "BA"
        common.warm(data_paths)
        residency.append(common.cached_fraction(data_paths))
        for path in paths:
            for v in order:
                cfg = dict(base, install=installs[v], expect_stats=(v == "B"), seed=rnd, path=path)
                r = run_child(args.python, installs[v], cfg)
                r["round"], r["position"] = rnd, order.index(v)
                runs[(path, v)].append(r)
                loads.extend(r["load_1min"])
            a, b = runs[(path, "A")][-1], runs[(path, "B")][-1]
            print(f"  round {rnd} ({order[0]} first) {path:8s} A {a['samples_per_s']:9,.0f}  "
                  f"B {b['samples_per_s']:9,.0f}  B/A {b['samples_per_s'] / a['samples_per_s']:.4f}  "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
    wall = time.perf_counter() - t_start
    load_after = os.getloadavg()

    header = ("path", "A samples/s", "B samples/s", "B/A of medians", "B/A per round: median", "min", "max",
              "~95% CI of median", "rounds B<A", "cpu us/smp A", "cpu us/smp B", "cpu B/A median")
    rows, summary = [], {}
    for path in paths:
        a = [r["samples_per_s"] for r in runs[(path, "A")]]
        b = [r["samples_per_s"] for r in runs[(path, "B")]]
        ratios = [y / x for x, y in zip(a, b)]
        ca = [r["cpu_us_per_sample"] for r in runs[(path, "A")]]
        cb = [r["cpu_us_per_sample"] for r in runs[(path, "B")]]
        cpu_ratios = [y / x for x, y in zip(ca, cb)]
        lo, hi, conf = median_ci(ratios)
        med = statistics.median(ratios)
        if lo >= 1 - args.threshold:
            verdict = "met"
        elif hi < 1 - args.threshold:
            verdict = "MISSED"
        else:
            verdict = "not resolved"
        summary[path] = {"a_median": statistics.median(a), "b_median": statistics.median(b),
                         "ratio_of_medians": statistics.median(b) / statistics.median(a), "ratio_median": med,
                         "ratio_min": min(ratios), "ratio_max": max(ratios), "ratio_ci": [lo, hi],
                         "ratio_ci_level": conf, "rounds_b_slower": sum(x < 1 for x in ratios),
                         "cpu_a_median": statistics.median(ca), "cpu_b_median": statistics.median(cb),
                         "cpu_ratio_median": statistics.median(cpu_ratios), "verdict": verdict,
                         "ratios": ratios, "cpu_ratios": cpu_ratios}
        rows.append([path, f"{statistics.median(a):,.0f}", f"{statistics.median(b):,.0f}",
                     f"{statistics.median(b) / statistics.median(a):.4f}", f"{med:.4f}", f"{min(ratios):.4f}",
                     f"{max(ratios):.4f}", f"{lo:.4f}-{hi:.4f} ({conf:.0%})",
                     f"{sum(x < 1 for x in ratios)}/{len(ratios)}", f"{statistics.median(ca):.2f}",
                     f"{statistics.median(cb):.2f}", f"{statistics.median(cpu_ratios):.4f}"])

    print()
    print(common.format_table(header, rows, align="lrrrrrrrrrrr"))
    print()
    print(f"load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after; seen by the children "
          f"min {min(loads):.2f} median {statistics.median(loads):.2f} max {max(loads):.2f}, on "
          f"{common.machine_info()['cpus']} CPUs; page-cache residency at each round's start "
          f"{min(x for x in residency if x is not None):.1%} or more; {wall:.0f} s")
    print("samples/s: median over rounds of each version's runs; B/A per round: B's run over A's run of the same "
          "round (adjacent in time, order alternating); CI: order statistics of the per-round ratios (sign test); "
          "cpu us/smp: process CPU time (all threads) per sample, median over rounds.")
    stats_rows = [r["stats"] for path in paths for r in runs[(path, "B")] if "stats" in r]
    print()
    print("B's src.stats() after each run (sanity check; counts include the warm-up batches):")
    for path in paths:
        ss = [r["stats"] for r in runs[(path, "B")]]
        print(f"  {path:8s} batches {ss[0]['batches']}, wait_fraction median "
              f"{statistics.median(s['wait_fraction'] for s in ss):.3f} "
              f"(min {min(s['wait_fraction'] for s in ss):.3f}, max {max(s['wait_fraction'] for s in ss):.3f}), "
              f"gather_seconds median {statistics.median(s['gather_seconds'] for s in ss):.3f}, "
              f"elapsed_seconds median {statistics.median(s['elapsed_seconds'] for s in ss):.3f}, "
              f"read_ahead median {statistics.median(s['read_ahead'] for s in ss):.2f}, "
              f"blocks_read median {statistics.median(s['blocks_read'] for s in ss)}")
    print()
    a_rate = statistics.median(summary[path]["a_median"] for path in paths)
    for line in estimate_text(args.batch, args.threads, a_rate):
        print(line)
    print()
    print(f"requirement: the statistics cost <= {args.threshold:.0%} of throughput (B/A >= {1 - args.threshold:.2f})")
    for path in paths:
        s = summary[path]
        print(f"  {path:8s} B/A median {s['ratio_median']:.4f}, CI {s['ratio_ci'][0]:.4f}-{s['ratio_ci'][1]:.4f}: "
              f"{s['verdict']}")
    if args.quick:
        print("\n(--quick: tiny sizes; these numbers mean nothing)")
    if args.json:
        common.write_json(args.json, {
            "bench": "bench_stats_overhead", "config": vars(args), "installs": installs, "names": names,
            "machine": common.machine_info(), "wall_seconds": wall,
            "load_average": {"before": load_before, "after": load_after, "children": loads},
            "residency": residency, "summary": summary, "b_stats": stats_rows,
            "runs": {f"{path}/{v}": rs for (path, v), rs in runs.items()},
            "estimate": estimate_text(args.batch, args.threads, a_rate)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
