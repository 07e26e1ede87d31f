"""Opening a WindowSource at the users' scale: the compiled index cache (issue 8, item 1).

Generates (once, reused while its parameters match) ``--keys`` keys of ``(--rows, --features)`` float32 factors,
``(--rows, 2)`` labels and one index file with a line per window (``rows - window + 1`` per key: 66.8M lines at
the default 14,000 keys), then measures, each in a fresh Python process:

* ``compile``: the cache dir is empty, so the open parses the index (in parallel) and writes the cache;
* ``cached``: the cache file exists and is mapped read-only;
* ``no cache``: ``cache=False``, the index parsed into this process's memory (12 bytes per sample);
* ``index only``: just the cached index, no data files (the rest of an open is the per-key headers);
* ``N at once``: ``--processes`` processes started together on an empty cache dir (one builds, the others
  wait for it), then again on the cache it left.

For each: seconds to open and to the first shuffled batch, RssAnon (private anonymous memory, what the issue
measures), Private (smaps_rollup: anonymous plus file pages mapped by this process alone) and PSS, before
and after the open. Targets (66M samples, one process, cache present): RssAnon <= 200 MB, first batch <= 1 s;
10 processes: sum of RssAnon <= 2 GB.

    python bench/bench_index.py --dir /tmp/npyfeed-bench-index [--processes 10] [--json out.json]
    python bench/bench_index.py --quick --dir /tmp/x   # tiny, for the smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from common import format_table, machine_info, process_memory, write_json  # noqa: E402

MB = 1e6


def cpu_seconds() -> float:
    """CPU time of this process so far (all threads, user + system): what an idle machine's wall time tracks."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def generate(root: Path, keys: int, rows: int, features: int, window: int) -> None:
    import numpy as np

    spec = {"keys": keys, "rows": rows, "features": features, "window": window, "version": 1}
    stamp = root / "spec.json"
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        return
    shutil.rmtree(root, ignore_errors=True)
    (root / "factor").mkdir(parents=True)
    (root / "label").mkdir()
    rng = np.random.default_rng(0)
    factor = rng.standard_normal((rows, features), dtype=np.float32)
    label = rng.standard_normal((rows, 2), dtype=np.float32)
    template = "".join(f"{t},{t},@\n" for t in range(window - 1, rows))
    t0 = time.perf_counter()
    with open(root / "index.txt", "w") as index:
        for k in range(keys):
            key = f"key{k:05d}"
            factor[0, 0] = k  # each key's files differ
            np.save(root / "factor" / f"{key}.npy", factor)
            np.save(root / "label" / f"{key}.npy", label)
            index.write(template.replace("@", key))
            if k % 2000 == 0:
                print(f"  generating: {k}/{keys} keys ({time.perf_counter() - t0:.0f} s)", flush=True)
    stamp.write_text(json.dumps(spec))


def child(args) -> None:
    """One measurement in this (fresh) process; prints a JSON line."""
    import npyfeed
    import numpy as np
    from npyfeed import _window_inputs

    before = process_memory()
    root = Path(args.dir)
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    result = {}
    if args.child == "index":
        index, cache, _ = _window_inputs.load_index(root / "index.txt", True, args.cache_dir, 2)
        result["open_s"] = time.perf_counter() - t0
        result["open_cpu_s"] = cpu_seconds() - c0
        result["samples"] = len(index)
    else:
        src = npyfeed.WindowSource(root / "index.txt", root / "factor", root / "label", args.window, mode="mmap",
                                   threads=2, cache=args.child != "nocache", cache_dir=args.cache_dir)
        result["open_s"] = time.perf_counter() - t0
        result["open_cpu_s"] = cpu_seconds() - c0
        with src.batches(256, shuffle=True, seed=1) as it:
            x, y = next(it)
        result["first_batch_s"] = time.perf_counter() - t0
        result["first_batch_cpu_s"] = cpu_seconds() - c0
        result["samples"] = len(src)
        # The batch matches numpy (first sample's key and row from describe()).
        first = src.epoch_order(0, shuffle=True, seed=1)[0]
        text = src.describe(int(first))
        key = text.split("key '")[1].split("'")[0]
        feature = int(text.split("feature_index ")[1].split(",")[0])
        expected = np.load(root / "factor" / f"{key}.npy")[feature - args.window + 1:feature + 1]
        result["checked"] = bool(np.array_equal(x[0], expected))
        cache = src.index_cache
    result["cache"] = cache
    result["before"] = before
    result["after"] = process_memory()
    print(json.dumps(result), flush=True)


def run_children(args, scenario: str, cache_dir: Path, processes: int = 1) -> list:
    cmd = [sys.executable, __file__, "--child", scenario, "--dir", args.dir, "--window", str(args.window),
           "--cache-dir", str(cache_dir)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(processes)]
    results = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{scenario}: child failed ({p.returncode}):\n{err[-4000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", required=True, help="data folder (generated; keep it out of the repository)")
    parser.add_argument("--keys", type=int, default=14000)
    parser.add_argument("--rows", type=int, default=4800)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--processes", type=int, default=10, help="processes started together (0: skip)")
    parser.add_argument("--quick", action="store_true", help="tiny data set and 2 processes (smoke test)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.quick:
        args.keys, args.rows, args.features, args.processes = 20, 300, 4, 2
    root = Path(args.dir)
    generate(root, args.keys, args.rows, args.features, args.window)
    index_bytes = (root / "index.txt").stat().st_size
    cache_root = root / "caches"
    shutil.rmtree(cache_root, ignore_errors=True)

    rows, records = [], []
    load_before = f"{os.getloadavg()[0]:.1f}"

    def record(name: str, results: list) -> None:
        anon = [r["after"]["rss_anon"] for r in results]
        priv = [r["after"]["private"] for r in results]
        pss = [r["after"]["pss"] for r in results]
        base = [r["before"]["rss_anon"] for r in results]
        first = [r.get("first_batch_s") for r in results if r.get("first_batch_s") is not None]
        first_cpu = [r.get("first_batch_cpu_s", r["open_cpu_s"]) for r in results]
        if not all(r.get("checked", True) for r in results):
            raise SystemExit(f"{name}: a batch differs from numpy")
        samples = results[0]["samples"]
        rows.append([name, len(results), f"{samples:,}", f"{max(r['open_s'] for r in results):.2f}",
                     f"{max(first):.2f}" if first else "-", f"{max(first_cpu):.2f}", f"{sum(anon) / MB:.0f}",
                     f"{(sum(anon) - sum(base)) / MB:.0f}", f"{(sum(anon) - sum(base)) / len(results) / samples:.2f}",
                     f"{sum(priv) / MB:.0f}", f"{sum(pss) / MB:.0f}"])
        records.append({"name": name, "results": results})

    record("compile (empty cache)", run_children(args, "open", cache_root / "one"))
    cache_file = Path(records[-1]["results"][0]["cache"])
    record("cached", run_children(args, "open", cache_root / "one"))
    record("index only (cached)", run_children(args, "index", cache_root / "one"))
    record("no cache (cache=False)", run_children(args, "nocache", cache_root / "one"))
    if args.processes > 0:
        record(f"{args.processes} at once, empty cache", run_children(args, "open", cache_root / "many", args.processes))
        record(f"{args.processes} at once, cached", run_children(args, "open", cache_root / "many", args.processes))

    print(f"{args.keys} keys x ({args.rows}, {args.features}) float32, index {index_bytes / MB:.0f} MB, "
          f"cache file {cache_file.stat().st_size / MB:.0f} MB, window {args.window}; {machine_info().get('cpus')} CPUs")
    print(f"load average before: {load_before}, after: {os.getloadavg()[0]:.1f} (other work on the machine "
          "inflates wall times; CPU s is this process's own)")
    print(format_table(["scenario", "procs", "samples", "open s (max)", "first batch s (max)", "CPU s to first batch",
                        "RssAnon MB (sum)",
                        "RssAnon - baseline MB", "B/sample", "Private MB (sum)", "PSS MB (sum)"], rows))
    print("targets (issue 8): cached, one process: RssAnon <= 200 MB (<= 3 B/sample), first batch <= 1 s; "
          "10 processes: sum RssAnon <= 2 GB")
    if args.json:
        write_json(args.json, {"machine": machine_info(), "args": vars(args), "records": records})
    shutil.rmtree(cache_root, ignore_errors=True)


if __name__ == "__main__":
    main()
