#!/usr/bin/env python3
"""Whole-file loads: the users' np.load loop and the usual alternatives against npyfeed, warm and cold.

In ONE run, on a data set like the users' (default 400 files of (4800, 256) float32, about 2 GB), it measures
with the page cache warm and cold (every file evicted before each cold repeat):

  np.load loop            the users' load_factor_files: np.load each file into a dict, one thread
  np.load thread pool     ThreadPoolExecutor(threads).map(np.load, ...): the usual advice
  np.load mmap open       np.load(mmap_mode="r") for every file: the open cost only
  np.load mmap + sum      the same, then touching all the data (a.sum() per file), one thread
  npyfeed <mode>          npyfeed.load_factor_files with mode "read", "direct", "mmap" (open only) and "mmap"
                          with populate=True

and the limits, in the same run: memory copy with 1 and N threads (pre-faulted buffers), copy into fresh buffers
(what an owned-array loader pays at least: copy + page faults; the limit of every warm row that returns owned
arrays), touching every page of cached files through a mapping (the limit of "mmap populate" and "mmap + sum",
which copy nothing), and the disk's O_DIRECT sequential read with 1, N and 4N threads (the limit of every cold
row and of "direct": the best of those queue depths, since the contenders run with up to 4N threads). Then it prints the table and the issue's targets, met or missed. See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import npyfeed  # noqa: E402

TABLE_HEADER = ("contender", "cache", "thr", "best s", "median s", "cpu s", "GB/s", "x np.load loop", "limit", "x limit")


def _key(path: str) -> str:
    return os.path.basename(path)[:-4]


# ------------------------------------------------------------------------------------------ contenders


def np_load_loop(paths, threads):
    store_dict = {}
    for path in paths:
        store_dict[_key(path)] = np.load(path)
    return store_dict


def np_load_thread_pool(paths, threads):
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return dict(zip(map(_key, paths), pool.map(np.load, paths)))


def np_load_mmap_open(paths, threads):
    return {_key(p): np.load(p, mmap_mode="r") for p in paths}


def np_load_mmap_sum(paths, threads):
    store_dict = np_load_mmap_open(paths, threads)
    for a in store_dict.values():
        a.sum()
    return store_dict


def npyfeed_load(mode, populate=False):
    def load(paths, threads):
        return npyfeed.load_factor_files(paths, {}, mode=mode, threads=threads, populate=populate)
    return load


# (name, function, threads it runs with as a multiple of --threads (0: one thread), what it moves: "copy" into
#  owned memory, "direct" O_DIRECT into owned memory, "touch" pages mapped and read, "open" nothing but headers)
CONTENDERS = [
    ("np.load loop", np_load_loop, 0, "copy"),
    ("np.load thread pool", np_load_thread_pool, 1, "copy"),
    ("np.load mmap open", np_load_mmap_open, 0, "open"),
    ("np.load mmap + sum", np_load_mmap_sum, 0, "touch"),
    ("npyfeed read", npyfeed_load("read"), 1, "copy"),
    ("npyfeed direct", npyfeed_load("direct"), 1, "direct"),
    ("npyfeed mmap open", npyfeed_load("mmap"), 1, "open"),
    ("npyfeed mmap populate", npyfeed_load("mmap", populate=True), 1, "touch"),
    # More reads in flight than CPUs: IO threads mostly sleep, and a disk often needs a deeper queue.
    ("npyfeed read, 4x threads", npyfeed_load("read"), 4, "copy"),
    ("npyfeed direct, 4x threads", npyfeed_load("direct"), 4, "direct"),
]


def check_equal(paths, threads):
    """Untimed sanity check: every npyfeed mode returns what np.load returns (first and last file)."""
    sample = [paths[0], paths[-1]]
    for mode in ("read", "direct", "mmap"):
        got = npyfeed.load_many(sample, mode=mode, threads=threads)
        for path, array in zip(sample, got):
            want = np.load(path)
            if array.dtype != want.dtype or array.shape != want.shape or not np.array_equal(array, want):
                raise SystemExit(f"npyfeed mode={mode} differs from np.load on {path}")


# ------------------------------------------------------------------------------------------------ run


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    common.add_data_args(p, files=400, rows=4800, cols=256, dtype="float32")
    p.add_argument("--reuse-heap", action="store_true",
                   help="let glibc recycle freed multi-MB arrays between repeats (default: every repeat gets fresh "
                        "pages, as a new training process does)")
    p.add_argument("--only", default=None,
                   help="comma-separated substrings: run only contenders whose name contains one (limits always run)")
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.rows, args.cols = min(args.files, 6), min(args.rows, 200), min(args.cols, 32)
        args.repeats = 1
    return args


def measure_limits(ds, threads, quick, log):
    """Memory and disk limits, measured first; the N-thread ones are probed again in every round (best kept)."""
    limits = {}
    log("measuring limits: memory copy ...")
    limits["memcpy_1"] = common.memcpy_bandwidth(1, _copy_bytes(quick), repeats=2 if quick else 5)
    limits[f"memcpy_{threads}"] = common.memcpy_bandwidth(threads, _copy_bytes(quick), repeats=2 if quick else 5)
    limits[f"fresh_copy_{threads}"] = common.measure.fresh_copy_bandwidth(threads, ds.nbytes // ds.spec.files, ds.spec.files,
                                                                  repeats=1)
    log("measuring limits: O_DIRECT sequential read ...")
    for t in sorted({1, threads, 4 * threads}):
        limits[f"odirect_seq_{t}"] = common.odirect_seq_bandwidth(ds.factor_paths, t)
    limits[f"odirect_seq_fresh_{threads}"] = common.odirect_seq_bandwidth(ds.factor_paths, threads, fresh=True)
    log("measuring limits: page touch ...")
    common.warm(ds.factor_paths)
    limits[f"page_touch_{threads}"] = common.measure.page_touch_bandwidth(ds.factor_paths, threads)
    return limits


def _copy_bytes(quick):
    return (8 << 20) if quick else (256 << 20)


def _best(*values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def main(argv=None) -> int:
    args = parse_args(argv)
    threads = common.resolve_threads(args.threads)
    log = (lambda s: print(s, file=sys.stderr, flush=True))
    if not args.reuse_heap:
        common.fresh_pages_per_allocation()
    load_before = common.load_average()

    spec = common.DataSpec(files=args.files, rows=args.rows, cols=args.cols, dtype=args.dtype)
    ds = common.make_dataset(args.dir, spec, log=log)
    paths = ds.factor_paths
    check_equal(paths, threads)

    limits = measure_limits(ds, threads, args.quick, log)
    mem_limit_name, disk_limit_name = f"memcpy_{threads}", "odirect_seq"
    owned_limit_name, touch_limit_name = f"fresh_copy_{threads}", f"page_touch_{threads}"
    disk_probe_name = f"odirect_seq_{threads}"

    contenders = CONTENDERS
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        contenders = [c for c in CONTENDERS if c[0] == "np.load loop" or any(w in c[0] for w in wanted)]

    timings = {}
    max_residency = 0.0

    def evict_and_check():
        nonlocal max_residency
        common.evict(paths)
        frac = common.cached_fraction(paths)
        if frac is not None:
            max_residency = max(max_residency, frac)

    # Rounds: every contender once per round, in an order rotated each round, with one probe of the limit per
    # round, so that noise from other processes hits every contender alike. Best and median over the rounds.
    for cache in ("warm", "cold"):
        before = evict_and_check if cache == "cold" else (lambda: common.warm(paths))
        for r in range(args.repeats):
            order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
            log(f"{cache} round {r + 1}/{args.repeats} ...")
            for name, fn, mult, kind in order:
                n = max(1, mult * threads)
                wall, cpu = common.time_once(lambda fn=fn, n=n: fn(paths, n), before=before)
                t = timings.setdefault((name, cache), common.Timing(name, cache, [], ds.nbytes, note=kind, threads=n))
                t.times.append(wall)
                t.cpu_times.append(cpu)
            if cache == "warm":
                limits[mem_limit_name] = _best(limits[mem_limit_name], common.memcpy_bandwidth(
                    threads, _copy_bytes(args.quick), repeats=2 if args.quick else 3))
                fresh = f"fresh_copy_{threads}"
                limits[fresh] = _best(limits[fresh], common.measure.fresh_copy_bandwidth(
                    threads, ds.nbytes // spec.files, spec.files, repeats=1))
                touch = f"page_touch_{threads}"
                limits[touch] = _best(limits[touch], common.measure.page_touch_bandwidth(paths, threads))
            else:
                limits[disk_probe_name] = _best(limits[disk_probe_name],
                                                common.odirect_seq_bandwidth(paths, threads))
                fresh = f"odirect_seq_fresh_{threads}"
                limits[fresh] = _best(limits[fresh], common.odirect_seq_bandwidth(paths, threads, fresh=True))
    # The disk limit: the best queue depth probed (1, --threads and 4x --threads reads in flight: the contenders
    # run with up to 4x --threads).
    limits[disk_limit_name] = _best(*(v for k, v in limits.items()
                                      if k.startswith("odirect_seq_") and not k.startswith("odirect_seq_fresh")))
    load_after = common.load_average()

    ordered = [timings[(c[0], cache)] for cache in ("warm", "cold") for c in contenders]
    loop = {cache: timings[("np.load loop", cache)] for cache in ("warm", "cold")}
    rows, results = [], []
    for t in ordered:
        if t.note == "open":
            limit_name = None
        elif t.note == "direct" or t.cache == "cold":
            limit_name = disk_limit_name  # O_DIRECT never reads the page cache: the disk is its limit, warm or not
        elif t.note == "touch":
            limit_name = touch_limit_name  # maps and touches pages, copies nothing
        else:
            limit_name = owned_limit_name  # new owned arrays: a copy into fresh pages at least
        limit = limits.get(limit_name) if limit_name else None
        gbps = None if t.note == "open" else t.gbps
        vs_loop = loop[t.cache].best / t.best
        vs_limit = gbps / limit if (gbps is not None and limit) else None
        rows.append([t.name, t.cache, t.threads, common.fmt(t.best), common.fmt(t.median), common.fmt(t.cpu_best, ".2f"),
                     common.fmt(gbps, ".2f"), common.fmt(vs_loop, ".2f", "x"), limit_name or "-",
                     common.fmt(vs_limit, ".2f", "x")])
        results.append({"name": t.name, "cache": t.cache, "threads": t.threads, "times_s": t.times, "best_s": t.best,
                        "median_s": t.median, "cpu_s": t.cpu_times, "gbps": gbps, "vs_np_load_loop": vs_loop,
                        "limit": limit_name, "vs_limit": vs_limit})

    print()
    print(f"npyfeed {npyfeed.__version__} bench_load: {spec.files} files x ({spec.rows}, {spec.cols}) "
          f"{np.dtype(spec.dtype).name} = {ds.nbytes / common.GB:.2f} GB, threads={threads}, "
          f"repeats={args.repeats}, {'heap reuse' if args.reuse_heap else 'fresh pages'}, data in {ds.root}")
    print(f"load average: {load_before} before, {load_after} after (other processes share the CPUs and the disk)")
    print()
    print("limits (same run; best of all probes)")
    limit_rows = [[k, common.fmt(v, ".2f")] for k, v in limits.items()]
    print(common.format_table(("limit", "GB/s"), limit_rows))
    print()
    print(common.format_table(TABLE_HEADER, rows))
    print()
    print("best/median s = wall time over the rounds; cpu s = user+sys CPU of this process in its best round; "
          "GB/s = bytes of array data / best time (GB = 1e9 B); x np.load loop = speedup over the users' loop in "
          "the same cache state; x limit = GB/s / the limit named. Cold = every file evicted before each run "
          f"(max page-cache residency after eviction: {max_residency:.1%}).")

    targets = evaluate_targets(ordered, limits, loop, mem_limit_name, disk_limit_name, spec.files)
    print()
    print("targets (issue 2, 2-core machine; best times)")
    print(common.format_table(("target", "measured", "needed", "status"),
                              [[t["target"], t["measured"], t["needed"], t["status"]] for t in targets],
                              align="lrrl"))
    if args.quick:
        print("\n(--quick: tiny sizes, one repeat; these numbers mean nothing)")

    if args.json:
        common.write_json(args.json, {
            "bench": "bench_load", "config": vars(args) | {"threads": threads}, "dataset": {
                "root": str(ds.root), **spec.__dict__, "nbytes": ds.nbytes},
            "machine": common.machine_info(), "load_average": [load_before, load_after], "limits_gbps": limits,
            "results": results, "targets": targets, "max_residency_after_evict": max_residency})
    return 0


def evaluate_targets(timings, limits, loop, mem_limit_name, disk_limit_name, files):
    by = {(t.name, t.cache): t for t in timings}
    out = []

    def add(target, measured, needed, ok, shown):
        status = ("info" if target.startswith("(info)") else "n/a") if ok is None else ("met" if ok else "MISSED")
        out.append({"target": target, "measured": shown, "needed": needed, "status": status,
                    "value": measured, "met": ok})

    read_warm = by.get(("npyfeed read", "warm"))
    if read_warm:
        r = loop["warm"].best / read_warm.best
        add('"read" warm vs np.load loop warm', r, ">= 3.00x", r >= 3.0, f"{r:.2f}x")
        lim = limits.get(mem_limit_name)
        r = read_warm.gbps / lim if lim else None
        add(f'"read" warm vs {mem_limit_name}', r, ">= 0.60x", None if r is None else r >= 0.6, common.fmt(r, ".2f", "x"))
    budget = 0.05 * files / 400
    for cache in ("warm", "cold"):
        t = by.get(("npyfeed mmap open", cache))
        if t:
            ok = t.best <= budget if cache == "warm" else None  # the target is the open cost itself: warm
            add(f'"mmap" open of {files} files, {cache}', t.best, f"<= {budget:.3f} s", ok, f"{t.best:.3f} s")
    lim = limits.get(disk_limit_name)
    for name in ("npyfeed direct", "npyfeed read"):
        t = by.get((name, "cold"))
        if t:
            r = t.gbps / lim if lim else None
            add(f'"{name.split()[1]}" cold vs {disk_limit_name}', r, ">= 0.90x", None if r is None else r >= 0.9,
                common.fmt(r, ".2f", "x"))
    # For information: the same owned-array rows against the ceilings that include first-touch page faults of
    # fresh destination buffers, which every loader returning new arrays pays (see bench/README.md).
    threads = mem_limit_name.split("_")[-1]
    for name, cache, limit_name in (("npyfeed read", "warm", f"fresh_copy_{threads}"),
                                    ("npyfeed direct", "cold", f"odirect_seq_fresh_{threads}"),
                                    ("npyfeed read", "cold", f"odirect_seq_fresh_{threads}")):
        t, lim = by.get((name, cache)), limits.get(limit_name)
        if t and lim:
            r = t.gbps / lim
            add(f'(info) "{name.split()[1]}" {cache} vs {limit_name}', r, "-", None, f"{r:.2f}x")
    return out


if __name__ == "__main__":
    sys.exit(main())
