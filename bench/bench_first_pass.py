"""First pass against later passes over mapped files: what populating the mappings ahead of the gather buys.

A ``WindowSource(mode="mmap")`` over files already in the page cache still pays, on its first pass, one minor
page fault per few pages of data it touches: the process's page tables start empty (4 kB pages). npyfeed
populates each file's mapping, where its pages are cached, before the gather first reads it (docs/modes.md,
"First touches"); ``NPYFEED_POPULATE=0`` in the environment turns that off, which is the "before" here.

One data set in the users' shape (default 60 keys of (4800, 256) float32, ~295 MB, W=100, B=256), warm in the
page cache (read once, residency checked with mincore). Each trial is a fresh process per variant (populate off,
populate on), their order alternating between trials; a process opens the source and runs P full passes of
``src.batches(B, shuffle=True, seed=pass)``, timing each pass (samples/s), and taking minor page faults
(``ru_minflt``) and CPU time (``ru_utime + ru_stime``, all threads) per pass from ``getrusage``. Per variant:
median samples/s of each pass, the per-trial ratio first/second pass (median, min, max), minor faults per pass
and CPU microseconds per sample. Target: first pass >= 0.9x the second.

```
python bench/bench_first_pass.py --dir /tmp/fp-data [--trials 5] [--passes 3] [--json out.json]
python bench/bench_first_pass.py --quick          # seconds: a smoke run, numbers meaningless
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

VARIANTS = {"off": "0", "on": "1"}  # NPYFEED_POPULATE


def child(cfg: dict) -> dict:
    """One process: open the source, run the passes, measure each. A dict, printed as JSON."""
    import npyfeed

    def usage() -> tuple:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_minflt, r.ru_majflt, r.ru_utime + r.ru_stime

    load_before = os.getloadavg()[0]
    f0, _, c0 = usage()
    t0 = time.perf_counter()
    src = npyfeed.WindowSource(cfg["index_paths"], cfg["factor_dir"], cfg["label_dir"], cfg["window"],
                               mode="mmap", threads=cfg["threads"])
    opened = {"seconds": time.perf_counter() - t0, "minor_faults": usage()[0] - f0, "cpu_s": usage()[2] - c0}
    passes = []
    for p in range(cfg["passes"]):
        f0, m0, c0 = usage()
        t0 = time.perf_counter()
        it = src.batches(cfg["batch"], shuffle=True, seed=p)
        n, first_batch = 0, None
        for x, _ in it:
            n += len(x)
            if first_batch is None:
                first_batch = time.perf_counter() - t0
        seconds = time.perf_counter() - t0
        f1, m1, c1 = usage()
        passes.append({"samples": n, "seconds": seconds, "samples_per_s": n / seconds, "first_batch_s": first_batch,
                       "minor_faults": f1 - f0, "major_faults": m1 - m0, "cpu_us_per_sample": (c1 - c0) / n * 1e6})
    return {"open": opened, "passes": passes, "load_1min": [load_before, os.getloadavg()[0]],
            "npyfeed_file": npyfeed.__file__}


def mapping_cost(paths: list) -> dict:
    """CPU seconds to map every cached page of `paths` into a fresh mapping: by page faults (a read of one byte
    per page, as a first pass takes them) and by MADV_POPULATE_READ (what the populate does), best of 3 each;
    the process's minor faults of each. What populating can save at most is the first of these."""
    import ctypes
    import mmap

    import numpy as np

    libc = ctypes.CDLL(None, use_errno=True)
    out = {"bytes": sum(os.path.getsize(p) for p in paths)}
    for how in ("faults", "populate"):
        best = None
        for _ in range(3):
            maps = []
            for path in paths:
                with open(path, "rb") as f:
                    maps.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
            f0, c0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
            ok = True
            for m in maps:
                a = np.frombuffer(m, np.uint8)
                if how == "faults":
                    a[::4096].sum()
                elif libc.madvise(ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(len(m)), 22) != 0:
                    ok = False  # no MADV_POPULATE_READ (Linux < 5.14)
            c1, f1 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            del a
            for m in maps:
                m.close()
            if ok and (best is None or c1 - c0 < best[0]):
                best = (c1 - c0, f1 - f0)
        out[how] = None if best is None else {"cpu_s": best[0], "minor_faults": best[1]}
    return out


def run_child(cfg: dict, populate: str) -> dict:
    env = dict(os.environ, NPYFEED_POPULATE=populate, NPYFEED_CACHE_DIR=cfg["cache_dir"])
    env.setdefault("OMP_NUM_THREADS", "1")
    import common

    return common.run_child(__file__, cfg, env, f"NPYFEED_POPULATE={populate}")


def main(argv=None) -> int:
    import common

    if common.serve_child(argv, child):
        return 0

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_data_args(p, files=60, rows=4800, cols=256, dtype="float32")
    p.set_defaults(repeats=5)
    p.add_argument("--trials", dest="repeats", type=int, help="trials, each variant once per trial (default 5)")
    p.add_argument("--passes", type=int, default=3, help="full passes per process (default 3)")
    p.add_argument("--labels", type=int, default=2, help="label columns (default 2)")
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--target", type=float, default=0.9, help="first pass / second pass at least (default 0.9)")
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.rows, args.cols, args.repeats, args.batch = 4, 600, 16, 1, 64
    args.passes = max(args.passes, 2)
    threads = common.resolve_threads(args.threads)

    spec = common.DataSpec(files=args.files, rows=args.rows, cols=args.cols, dtype=args.dtype,
                           label_cols=args.labels, window=max(args.window, 100))
    ds = common.make_dataset(args.dir, spec)
    factor_dir, label_dir = common.link_dir(Path(args.dir) / "first-pass-links" / spec.name, ds)
    data_paths = ds.factor_paths + ds.label_paths
    cfg = {"index_paths": ds.index_paths, "factor_dir": factor_dir, "label_dir": label_dir, "window": args.window,
           "threads": threads, "batch": args.batch, "passes": args.passes,
           "cache_dir": str(Path(args.dir).resolve() / "first-pass-cache")}
    print(f"npyfeed first pass vs later passes (mode mmap, warm): {spec.files} x ({spec.rows}, {spec.cols}) "
          f"{spec.dtype} ({spec.factor_nbytes / common.GB:.2f} GB), W={args.window}, B={args.batch}, "
          f"threads={threads}, {args.passes} passes per process, {args.repeats} trials")
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    runs = {v: [] for v in VARIANTS}
    loads, residency = [], []
    for trial in range(args.repeats):
        order = list(VARIANTS) if trial % 2 == 0 else list(reversed(VARIANTS))
        common.warm(data_paths)
        residency.append(common.cached_fraction(data_paths))
        for v in order:
            r = run_child(cfg, VARIANTS[v])
            runs[v].append(r)
            loads.extend(r["load_1min"])
        line = "  ".join(
            f"{v}: " + " ".join(f"{q['samples_per_s']:,.0f}" for q in runs[v][-1]["passes"]) +
            f" ({runs[v][-1]['passes'][0]['samples_per_s'] / runs[v][-1]['passes'][1]['samples_per_s']:.3f})"
            for v in VARIANTS)
        print(f"  trial {trial} ({order[0]} first)  {line}  load {os.getloadavg()[0]:.2f}", flush=True)
    common.warm(ds.factor_paths)
    cost = mapping_cost(ds.factor_paths)
    wall = time.perf_counter() - t_start
    load_after = os.getloadavg()

    header = ["populate", *(f"pass {i + 1} samples/s" for i in range(args.passes)), "first/second: median", "min",
              "max", *(f"minor faults pass {i + 1}" for i in range(args.passes)),
              *(f"cpu us/smp pass {i + 1}" for i in range(args.passes)), "open s", "first batch s"]
    rows, summary = [], {}
    for v in VARIANTS:
        rs = runs[v]
        rate = [statistics.median(r["passes"][i]["samples_per_s"] for r in rs) for i in range(args.passes)]
        faults = [statistics.median(r["passes"][i]["minor_faults"] for r in rs) for i in range(args.passes)]
        cpu = [statistics.median(r["passes"][i]["cpu_us_per_sample"] for r in rs) for i in range(args.passes)]
        ratios = [r["passes"][0]["samples_per_s"] / r["passes"][1]["samples_per_s"] for r in rs]
        open_s = statistics.median(r["open"]["seconds"] for r in rs)
        first_batch = statistics.median(r["passes"][0]["first_batch_s"] for r in rs)
        summary[v] = {"samples_per_s": rate, "minor_faults": faults, "cpu_us_per_sample": cpu, "ratios": ratios,
                      "ratio_median": statistics.median(ratios), "open_s": open_s, "first_batch_s": first_batch}
        rows.append([v, *(f"{x:,.0f}" for x in rate), f"{statistics.median(ratios):.3f}", f"{min(ratios):.3f}",
                     f"{max(ratios):.3f}", *(f"{x:,.0f}" for x in faults), *(f"{x:.2f}" for x in cpu),
                     f"{open_s:.3f}", f"{first_batch:.3f}"])
    print()
    print(common.format_table(header, rows, align="l" + "r" * (len(header) - 1)))
    print()
    print(f"load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after; seen by the children "
          f"min {min(loads):.2f} median {statistics.median(loads):.2f} max {max(loads):.2f}, on "
          f"{common.machine_info()['cpus']} CPUs; page-cache residency at each trial's start "
          f"{min(x for x in residency if x is not None):.1%} or more; {wall:.0f} s")
    print("samples/s, faults, cpu: median over trials of each pass; first/second: per trial, the first pass's "
          "samples/s over the second's in the same process; populate: NPYFEED_POPULATE=1 (default) or 0.")
    samples = runs["off"][0]["passes"][0]["samples"]
    for how in ("faults", "populate"):
        c = cost[how]
        if c is None:
            print(f"mapping the factor files' {cost['bytes'] / common.GB:.2f} GB by {how}: not available here")
            continue
        print(f"mapping the factor files' {cost['bytes'] / common.GB:.2f} GB by {how}: {c['cpu_s'] * 1e3:.1f} ms of "
              f"CPU, {c['minor_faults']:,} minor faults ({c['cpu_s'] / samples * 1e6:.3f} us per sample of a pass)")
    verdict = "met" if summary["on"]["ratio_median"] >= args.target else "MISSED"
    print(f"target: first pass >= {args.target}x the second (populate on): median "
          f"{summary['on']['ratio_median']:.3f}: {verdict}")
    if args.quick:
        print("\n(--quick: tiny sizes; these numbers mean nothing)")
    if args.json:
        common.write_json(args.json, {"bench": "bench_first_pass", "config": vars(args), "data": spec.name,
                                      "machine": common.machine_info(), "wall_seconds": wall,
                                      "load_average": {"before": load_before, "after": load_after,
                                                       "children": loads},
                                      "residency": residency, "summary": summary, "mapping_cost": cost,
                                      "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
