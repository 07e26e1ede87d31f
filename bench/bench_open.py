"""Opening a WindowSource at the users' key count, its files warm and cold, per mode.

One data set of ``--keys`` keys (default 14,000, the users' count), each a ``(--rows, --cols)`` float32 factor
file and a ``(--rows, 2)`` label file (F shrunk to 8: an open reads headers and maps files, so the size barely
matters). Every open runs in a fresh Python process, as a new trainer's would (its thread pools made by that open):
``WindowSource(...)`` alone, over an index of a few lines per key with ``cache=False``, warm and cold (every data
file evicted with ``posix_fadvise(DONTNEED)`` just before, residency checked), per mode. ``--baseline DIR``
(another npyfeed, ``pip install --target DIR``): each round opens with both builds, alternated. A cold open waits
for one read per file (its header; in modes "read" and "direct" a small label file is read whole), which a device
answers many at a time; the limit beside it: the files' count over the device's rate of 4 KiB O_DIRECT reads at
random offsets, ``--probe-threads`` at a time.

The compiled index at the users' sample count (65.8M lines) and N processes sharing it: ``bench_node.py``.

    python bench/bench_open.py --dir /tmp/open-data --baseline /tmp/npyfeed-before [--modes mmap,read,direct]
    python bench/bench_open.py --quick --dir /tmp/x   # tiny, for the smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import common  # noqa: E402
import npyfeed  # noqa: E402

CACHES = ("warm", "cold")


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


def data_paths(factor_dir: str, label_dir: str) -> list:
    """Every data file of the source (a folder of factor files, one of label files)."""
    return [os.path.join(d, name) for d in (factor_dir, label_dir) for name in sorted(os.listdir(d))]


def run_child(cfg: dict, baseline: str | None = None) -> dict:
    """The open `cfg` asks for in a fresh Python (with `baseline`, importing the npyfeed installed there)."""
    env = common.importing_from(dict(os.environ), baseline) if baseline else None
    return common.run_child(__file__, cfg, env, f"{cfg['mode']} {cfg['cache']} {baseline or ''}")


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
                    r = run_child(dict(base, mode=mode, cache=cache),
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


def main(argv: list) -> int:
    if common.serve_child(argv, open_files):
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--keys", type=int, default=14_000, help="keys, a factor and a label file each (default 14,000)")
    p.add_argument("--rows", type=int, default=4800, help="rows per file (default 4800)")
    p.add_argument("--cols", type=int, default=8, help="factor columns (default 8)")
    p.add_argument("--window", type=int, default=100, help="window W (default 100)")
    p.add_argument("--modes", default="mmap,read,direct", help="read modes to open with (default all three)")
    p.add_argument("--threads", type=int, default=None, help="the source's threads (default: CPUs available)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; each opens once per mode, cache and build")
    p.add_argument("--probe-threads", type=int, default=16, help="threads of the header-read limit (16)")
    p.add_argument("--baseline", metavar="DIR", help="also open with the npyfeed installed in DIR")
    p.add_argument("--dir", default=str(common.DEFAULT_DATA_DIR), help="where the data set is generated and kept")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round: a smoke test")
    args = p.parse_args(argv)
    if args.quick:
        args.keys, args.rows, args.rounds = min(args.keys, 40), min(args.rows, 400), 1
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
    payload.update(measure_files(args, base, paths))
    if args.json:
        common.write_json(args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
