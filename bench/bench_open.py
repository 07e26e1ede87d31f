"""Opening a WindowSource at the users' key count: its files warm and cold per mode, and its compiled index.

One data set of ``--keys`` keys (default 14,000, the users' count), each a ``(--rows, --cols)`` float32 factor
file and a ``(--rows, 2)`` label file (F shrunk to 8: an open reads headers and maps files, so the size barely
matters). Every open runs in a fresh Python process, as a new trainer's would (its thread pools made by that open).

``--scenarios files`` (the default): ``WindowSource(...)`` alone, over an index of a few lines per key with
``cache=False``, warm and cold (every data file evicted with ``posix_fadvise(DONTNEED)`` just before, residency
checked), per mode. ``--baseline DIR`` (another npyfeed, ``pip install --target DIR``): each round opens with both
builds, alternated. A cold open waits for one read per file (its header; in modes "read" and "direct" a small
label file is read whole), which a device answers many at a time; the limit beside it: the files' count over the
device's rate of 4 KiB O_DIRECT reads at random offsets, ``--probe-threads`` at a time.

``--scenarios index`` (issue 8, item 1): the compiled index cache, over an index with a line per window (65.8M
lines at 14,000 keys, written once beside the data set), mode "mmap": ``compile`` (an empty cache dir: the open
parses the index in parallel and writes the cache), ``cached`` (the cache file mapped), ``no cache``
(``cache=False``: the index in this process's memory, 12 bytes per sample), and ``--processes`` processes started
together on an empty cache dir (one builds, the others wait), then on the cache it left. Each: seconds to open and
to the first shuffled batch (checked against numpy), RssAnon (what the issue measures), Private (smaps_rollup:
anonymous plus file pages only this process maps) and PSS, before and after. Targets (one process, cache present):
RssAnon <= 200 MB, first batch <= 1 s; 10 processes: sum RssAnon <= 2 GB.
The caches are removed at the end; ``both`` runs the two.

    python bench/bench_open.py --dir /tmp/open-data --baseline /tmp/npyfeed-before [--modes mmap,read,direct]
    python bench/bench_open.py --dir /tmp/open-data --scenarios index [--processes 10]
    python bench/bench_open.py --quick --scenarios both --dir /tmp/x   # tiny, for the smoke test
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import common  # noqa: E402
import npyfeed  # noqa: E402

CACHES = ("warm", "cold")
MB = 1e6


def open_files(cfg: dict) -> dict:
    """A files' open in this fresh process: seconds, and the keys it opened."""
    paths = data_paths(cfg["factor_dir"], cfg["label_dir"])
    (common.evict if cfg["cache"] == "cold" else common.warm)(paths)
    residency = common.cached_fraction(paths) if cfg["cache"] == "cold" else None
    t0 = time.perf_counter()
    src = npyfeed.WindowSource(cfg["index"], cfg["factor_dir"], cfg["label_dir"], cfg["window"], mode=cfg["mode"],
                               threads=cfg["threads"], cache=False)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "keys": len(src.keys), "samples": len(src), "residency": residency}


def open_index(cfg: dict) -> dict:
    """An index scenario in this fresh process: seconds (wall, and CPU of all its threads: what an idle machine's
    wall time tracks) to open and to the first batch, the cache file mapped, memory before and after."""
    before, c0, t0 = common.process_memory(), time.process_time(), time.perf_counter()
    src = npyfeed.WindowSource(cfg["index"], cfg["factor_dir"], cfg["label_dir"], cfg["window"], mode="mmap",
                               threads=cfg["threads"], cache=cfg["scenario"] != "no cache", cache_dir=cfg["cache_dir"])
    result = {"open_s": time.perf_counter() - t0, "open_cpu_s": time.process_time() - c0, "samples": len(src)}
    with src.batches(256, shuffle=True, seed=1) as it:
        x, _ = next(it)
    result.update(first_batch_s=time.perf_counter() - t0, first_batch_cpu_s=time.process_time() - c0)
    text = src.describe(int(src.epoch_order(0, shuffle=True, seed=1)[0]))  # the batch's first sample
    key, feature = text.split("key '")[1].split("'")[0], int(text.split("feature_index ")[1].split(",")[0])
    expected = np.load(os.path.join(cfg["factor_dir"], f"{key}.npy"))[feature - cfg["window"] + 1:feature + 1]
    result["checked"] = bool(np.array_equal(x[0], expected))
    return dict(result, cache=src.index_cache, before=before, after=common.process_memory())


def data_paths(factor_dir: str, label_dir: str) -> list:
    """Every data file of the source (a folder of factor files, one of label files)."""
    return [os.path.join(d, name) for d in (factor_dir, label_dir) for name in sorted(os.listdir(d))]


def run_children(cfg: dict, processes: int = 1, baseline: str | None = None) -> list:
    """The open `cfg` asks for in `processes` fresh Pythons started together (with `baseline`, importing the
    npyfeed installed there): their results."""
    env = common.importing_from(dict(os.environ), baseline) if baseline else None
    return common.run_children(__file__, cfg, env, f"{cfg['scenario']} {baseline or ''}", processes)


def every_window_index(ds: common.DataSet, window: int) -> str:
    """An index file with a line per window of every key, beside the data set: written once (the data set's
    folder is made anew whenever its spec, the window included, changes)."""
    path = ds.root / "index-every-window.txt"
    if not path.exists():
        print(f"writing {path} ...", flush=True)
        template = "".join(f"{t},{t},@\n" for t in range(window - 1, ds.spec.rows))
        with open(path.with_suffix(".partial"), "w") as f:
            for key in ds.keys:
                f.write(template.replace("@", key))
        os.replace(path.with_suffix(".partial"), path)
    return str(path)


def header_read_limit(paths: list, threads: int) -> float | None:
    """Seconds the device needs for one 4 KiB read per file in `paths`: their count over its rate of 4 KiB O_DIRECT
    reads at random offsets, `threads` at a time (files: a sample of at most 2,000, each held open). None where
    O_DIRECT is refused."""
    probe = common.odirect_random_bandwidth(paths[:: max(1, len(paths) // 2000)], threads, block=4096, reads=8000)
    return None if probe is None else len(paths) / probe.iops


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:,.1f}" if seconds < 0.1 else f"{1e3 * seconds:,.0f}"


def measure_files(args, base: dict, paths: list) -> dict:
    """The files' opens, per mode, cache and build, in rounds; prints their table, returns the JSON's part."""
    modes = args.modes.split(",")
    builds = ["this"] + (["baseline"] if args.baseline else [])
    seconds = {(m, c, b): [] for m in modes for c in CACHES for b in builds}
    residency, probe = 0.0, []
    for rnd in range(args.rounds):
        for mode in modes:
            for cache in CACHES:
                for build in builds if rnd % 2 == 0 else reversed(builds):
                    [r] = run_children(dict(base, scenario="files", mode=mode, cache=cache),
                                       baseline=args.baseline if build == "baseline" else None)
                    if r["keys"] != args.keys:
                        raise SystemExit(f"{build} {mode} opened {r['keys']} keys, not {args.keys}")
                    seconds[mode, cache, build].append(r["seconds"])
                    if r["residency"] is not None:
                        residency = max(residency, r["residency"])
        probe.append(header_read_limit(paths, args.probe_threads))
        print(f"  round {rnd + 1}/{args.rounds} done")

    rows = []
    limit = min((s for s in probe if s is not None), default=None)
    for mode in modes:
        for cache in CACHES:
            this = seconds[mode, cache, "this"]
            row = [mode, cache, ms(min(this)), ms(statistics.median(this)),
                   ms(limit) if cache == "cold" and limit else "-",
                   f"{limit / min(this):.2f}x" if cache == "cold" and limit else "-"]
            if args.baseline:
                other = seconds[mode, cache, "baseline"]
                per_round = [b / t for t, b in zip(this, other)]
                row += [ms(min(other)), " / ".join(f"{q:.2f}" for q in per_round),
                        f"{statistics.median(per_round):.2f}x"]
            rows.append(row)
    header = ["mode", "cache", "best ms", "median ms", "limit ms", "x limit"] + (
        ["baseline best ms", "speed-up per round", "speed-up median"] if args.baseline else [])
    print("\n" + common.format_table(header, rows))
    probes = ", ".join("-" if s is None else ms(s) for s in probe)
    print(f"\nbest ms / median ms = this build's open over the rounds; limit = one 4 KiB read per file at the "
          f"device's O_DIRECT random-read rate, {args.probe_threads} in flight (best of the rounds: {probes} ms); "
          f"x limit = that over the best cold open; speed-up = the baseline's time over this build's, per round "
          f"(builds alternated). Cold: max residency after eviction {residency:.1%}.")
    return {"files": len(paths), "seconds": {f"{m} {c} {b}": v for (m, c, b), v in seconds.items()},
            "limit_seconds": probe, "max_residency_after_evict": residency}


def index_row(name: str, results: list) -> list:
    """An index scenario's table row: the slowest process's times, memory summed over its processes."""
    anon, base = (sum(r[when]["rss_anon"] for r in results) for when in ("after", "before"))
    samples = results[0]["samples"]
    return [name, len(results), f"{samples:,}", f"{max(r['open_s'] for r in results):.2f}",
            f"{max(r['first_batch_s'] for r in results):.2f}",
            f"{max(r['first_batch_cpu_s'] for r in results):.2f}", f"{anon / MB:.0f}",
            f"{(anon - base) / MB:.0f}", f"{(anon - base) / len(results) / samples:.2f}",
            f"{sum(r['after']['private'] for r in results) / MB:.0f}",
            f"{sum(r['after']['pss'] for r in results) / MB:.0f}"]


def measure_index(args, base: dict, index: str, cache_root: Path) -> list:
    """The index scenarios in order, on cache dirs under `cache_root` (removed after); prints their table,
    returns their records."""
    shutil.rmtree(cache_root, ignore_errors=True)
    load_before = common.load_average()
    n = args.processes
    runs = [("compile (empty cache)", "cache", 1), ("cached", "cache", 1), ("no cache (cache=False)", "no cache", 1)]
    runs += [(f"{n} at once, empty cache", "cache", n), (f"{n} at once, cached", "cache", n)] if n > 0 else []
    rows, records = [], []
    for name, scenario, processes in runs:
        folder = cache_root / ("many" if "at once" in name else "one")
        results = run_children(dict(base, scenario=scenario, index=index, cache_dir=str(folder)), processes)
        if not all(r.get("checked", True) for r in results):
            raise SystemExit(f"{name}: a batch differs from numpy")
        rows.append(index_row(name, results))
        records.append({"name": name, "results": results})
    cache_mb = os.path.getsize(records[0]["results"][0]["cache"]) / MB
    print(f"\nindex {os.path.getsize(index) / MB:.0f} MB, cache file {cache_mb:.0f} MB; load average before: "
          f"{load_before}, after: {common.load_average()} (other work inflates wall times; CPU s is the process's own)")
    print(common.format_table(["scenario", "procs", "samples", "open s (max)", "first batch s (max)",
                               "CPU s to first batch", "RssAnon MB (sum)", "RssAnon - baseline MB", "B/sample",
                               "Private MB (sum)", "PSS MB (sum)"], rows))
    print("targets (issue 8): cached, one process: RssAnon <= 200 MB (<= 3 B/sample), first batch <= 1 s; "
          "10 processes: sum RssAnon <= 2 GB")
    shutil.rmtree(cache_root, ignore_errors=True)
    return records


def main(argv: list) -> int:
    if common.serve_child(argv, lambda cfg: (open_files if cfg["scenario"] == "files" else open_index)(cfg)):
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--scenarios", choices=["files", "index", "both"], default="files",
                   help="the files' opens, the index scenarios or both (default files)")
    p.add_argument("--keys", type=int, default=14_000, help="keys, a factor and a label file each (default 14,000)")
    p.add_argument("--rows", type=int, default=4800, help="rows per file (default 4800)")
    p.add_argument("--cols", type=int, default=8, help="factor columns (default 8)")
    p.add_argument("--window", type=int, default=100, help="window W (default 100)")
    p.add_argument("--modes", default="mmap,read,direct", help="files: read modes to open with (default all three)")
    p.add_argument("--threads", type=int, default=None, help="the source's threads (default: CPUs available)")
    p.add_argument("--rounds", type=int, default=3, help="files: rounds; each opens once per mode, cache and build")
    p.add_argument("--probe-threads", type=int, default=16, help="files: threads of the header-read limit (16)")
    p.add_argument("--baseline", metavar="DIR", help="files: also open with the npyfeed installed in DIR")
    p.add_argument("--processes", type=int, default=10, help="index: processes started together (0: skip)")
    p.add_argument("--dir", default=str(common.DEFAULT_DATA_DIR), help="where the data set is generated and kept")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round, 2 processes: a smoke test")
    args = p.parse_args(argv)
    if args.quick:
        args.keys, args.rows, args.rounds = min(args.keys, 40), min(args.rows, 400), 1
        args.processes = min(args.processes, 2)
    threads = common.resolve_threads(args.threads)

    spec = common.DataSpec(files=args.keys, rows=args.rows, cols=args.cols, stocks=1, window=args.window,
                           index_stride=max(1, (args.rows - args.window + 1) // 4))
    ds = common.make_dataset(args.dir, spec)
    paths = ds.factor_paths + ds.label_paths
    base = {"index": ds.index_paths, "factor_dir": str(ds.factor_dir("S000")), "label_dir": str(ds.label_dir("S000")),
            "window": args.window, "threads": threads}
    print(f"bench_open: {args.keys} keys ({len(paths)} files) of ({args.rows}, {args.cols}) float32, window "
          f"{args.window}, threads {threads}, {args.rounds} rounds; load average {common.load_average()}")
    payload = {"machine": common.machine_info(), "args": vars(args), "threads": threads}
    if args.scenarios != "index":
        payload.update(measure_files(args, base, paths))
    if args.scenarios != "files":
        index = every_window_index(ds, args.window)
        payload["index_scenarios"] = measure_index(args, base, index, ds.root / "caches")
    if args.json:
        common.write_json(args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
