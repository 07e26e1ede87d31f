"""Where the time of a cold window read goes: bytes read from the disk per sample and CPU per sample, by mode.

For each mode (default read and direct) and trial, alternated: every data file is evicted from the page cache, a
fresh process opens ``WindowSource(mode=...)``, takes one batch (labels read whole at open, start-up; the open and
this first batch are timed apart), then times N batches of ``src.batches(B, shuffle=True, prefetch=P)``. Reported
per mode: samples/s, CPU microseconds per sample (the process, all threads), bytes read from storage per sample
(``read_bytes`` of /proc/self/io: what the kernel read for the process, read-ahead included) against the bytes of
one window, voluntary context switches, and the open's and the first batch's milliseconds. A mode
that reads more bytes than its windows need shows read-ahead of neighbouring pages; one that reads fewer finds
part of its windows already cached by earlier batches of the run (overlapping windows). Profile the same run with
``perf record -g -p PID`` once a child prints READY (``--pause`` waits a second there).

```
python bench/bench_read_path.py --dir /tmp/rp-data [--modes read,direct] [--trials 3] [--batches 40] [--prefetch 2]
                                [--json out.json]
python bench/bench_read_path.py --quick      # seconds: a smoke run, numbers meaningless
```
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def read_bytes() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes")).split()[1])


def child(cfg: dict) -> dict:
    import npyfeed

    for path in cfg["paths"]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    t_open = time.perf_counter()
    src = npyfeed.WindowSource(cfg["index_paths"], cfg["factor_dir"], cfg["label_dir"], cfg["window"],
                               mode=cfg["mode"], threads=cfg["threads"])
    t_first = time.perf_counter()
    it = src.batches(cfg["batch"], shuffle=True, seed=cfg["seed"], prefetch=cfg["prefetch"])
    next(it)
    t_ready = time.perf_counter()
    print("READY", os.getpid(), flush=True)
    if cfg["pause"]:
        time.sleep(1)
    r0, b0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), read_bytes(), time.process_time(), time.perf_counter()
    n = 0
    for _ in range(cfg["batches"]):
        n += len(next(it)[0])
    t1, c1, b1, r1 = time.perf_counter(), time.process_time(), read_bytes(), resource.getrusage(resource.RUSAGE_SELF)
    it.close()
    return {"samples_per_s": n / (t1 - t0), "cpu_us_per_sample": (c1 - c0) / n * 1e6,
            "read_bytes_per_sample": (b1 - b0) / n, "voluntary_switches": r1.ru_nvcsw - r0.ru_nvcsw,
            "open_ms": (t_first - t_open) * 1e3, "first_batch_ms": (t_ready - t_first) * 1e3,
            "load_1min": os.getloadavg()[0]}


def main(argv=None) -> int:
    import common

    if common.serve_child(argv, child):
        return 0
    import numpy as np

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_data_args(p, files=200, rows=4800, cols=256, dtype="float32")
    p.set_defaults(repeats=3)
    p.add_argument("--trials", dest="repeats", type=int, help="trials, each mode once per trial (default 3)")
    p.add_argument("--modes", default="read,direct", help="comma-separated modes (default read,direct)")
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=40, help="timed batches per run (default 40)")
    p.add_argument("--prefetch", type=int, default=2, help="batches(prefetch=) (default 2, npyfeed's default)")
    p.add_argument("--pause", action="store_true", help="wait 1 s after READY (time to attach perf)")
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.rows, args.cols, args.repeats, args.batch, args.batches = 4, 600, 16, 1, 32, 4
    modes = [m for m in args.modes.split(",") if m]
    spec = common.DataSpec(files=args.files, rows=args.rows, cols=args.cols, dtype=args.dtype, label_cols=2,
                           window=max(args.window, 100))
    ds = common.make_dataset(args.dir, spec)
    factor_dir, label_dir = common.link_dir(Path(args.dir) / "read-path-links" / spec.name, ds)
    window_bytes = args.window * args.cols * np.dtype(args.dtype).itemsize
    base = {"paths": ds.factor_paths + ds.label_paths, "index_paths": ds.index_paths, "factor_dir": factor_dir,
            "label_dir": label_dir, "window": args.window, "threads": common.resolve_threads(args.threads),
            "batch": args.batch, "batches": args.batches, "prefetch": args.prefetch, "pause": args.pause}
    env = dict(os.environ, NPYFEED_CACHE_DIR=str(Path(args.dir).resolve() / "read-path-cache"))
    print(f"npyfeed cold window reads: {spec.files} x ({spec.rows}, {spec.cols}) {spec.dtype}, W={args.window}, "
          f"B={args.batch}, prefetch {args.prefetch}, {args.batches} timed batches per run, {args.repeats} trials, "
          f"modes {','.join(modes)}")
    load_before = os.getloadavg()
    runs = {m: [] for m in modes}
    for trial in range(args.repeats):
        order = modes if trial % 2 == 0 else list(reversed(modes))
        for mode in order:
            cfg = dict(base, mode=mode, seed=trial)
            r = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], env=env, capture_output=True,
                               text=True, cwd="/")
            if r.returncode != 0:
                raise SystemExit(f"child ({mode}) failed with {r.returncode}:\n{r.stdout}\n{r.stderr}")
            out = json.loads(r.stdout.strip().splitlines()[-1])
            runs[mode].append(out)
            print(f"  trial {trial} {mode:6s} {out['samples_per_s']:8,.0f} samples/s  "
                  f"{out['cpu_us_per_sample']:6.1f} us CPU/sample  {out['read_bytes_per_sample']:9,.0f} B read/sample  "
                  f"open {out['open_ms']:5.0f} ms  first batch {out['first_batch_ms']:5.0f} ms  "
                  f"load {out['load_1min']:.2f}", flush=True)
    header = ["mode", "samples/s (median)", "cpu us/sample", "bytes read/sample", "x window bytes",
              "voluntary switches/run", "open ms", "first batch ms"]
    rows, summary = [], {}
    for mode in modes:
        rs = runs[mode]
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "load_1min"}
        summary[mode] = med
        rows.append([mode, f"{med['samples_per_s']:,.0f}", f"{med['cpu_us_per_sample']:.1f}",
                     f"{med['read_bytes_per_sample']:,.0f}", f"{med['read_bytes_per_sample'] / window_bytes:.2f}",
                     f"{med['voluntary_switches']:,.0f}", f"{med['open_ms']:.0f}", f"{med['first_batch_ms']:.0f}"])
    print()
    print(common.format_table(header, rows, align="lrrrrrrr"))
    print(f"\nwindow: {window_bytes:,} bytes; load average (1 min) {load_before[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after, on {common.machine_info()['cpus']} CPUs")
    if args.quick:
        print("\n(--quick: tiny sizes; these numbers mean nothing)")
    if args.json:
        common.write_json(args.json, {"bench": "bench_read_path", "config": vars(args), "window_bytes": window_bytes,
                                      "machine": common.machine_info(), "summary": summary, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
