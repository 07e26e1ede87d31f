"""One node, N training processes started together over one data set: what each costs and how fast it starts.

The users' node runs 10 training processes (one per GPU) over ~14,000 keys with an index line per row (~66M
samples). This benchmark starts `--procs` processes at once (a barrier releases them together), each opening a
`WindowSource` over the same files and drawing shuffled batches, and reports per process and summed:

* **private**: memory no other process shares (Private_Clean + Private_Dirty of /proc/self/smaps_rollup), and
  RssAnon (the heap: what swap would have to take);
* **PSS**: proportional set size: shared pages (the page cache of mapped files) split between their users;
* **open**: the `WindowSource(...)` call (index parse, headers, mappings);
* **first batch**: from the end of the open to the first shuffled batch in hand;
* **samples/s**: over `--batches` batches after the first (all processes compete for the same cores).

With `--users`, the same number of processes run the users' own way instead, where it fits in memory: every
factor and label file `np.load`ed into a dict (their `load_factor_files`), then batches sliced from it.

The data set is the users' shape by default (14,000 keys of (4800, F) float32, an index line per row from row
W-1 on: 65.8M samples) with F shrunk to 8 so that it fits a 24 GiB box; it is generated once into `--dir`.

Targets (issue 8, a 2-core box; "private memory" there is RssAnon, the heap that swap would have to take): one
process with the index compiled: RssAnon <= 200 MB, first batch <= 1 s; 10 processes together: total RssAnon
<= 2 GB, every process's open + first batch <= 5 s, none killed. (Private also counts file pages that only this
process maps, such as the index cache while no other process maps it: page cache, not heap.)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MB = 1e6


def _npyfeed_worker(args, barrier, queue, rank):
    """Open a WindowSource, draw shuffled batches; put this process's figures on `queue`."""
    try:
        import npyfeed

        barrier.wait()
        t0 = time.perf_counter()
        src = npyfeed.WindowSource(args["index"], args["factor_dir"], args["label_dir"], args["window"],
                                   mode=args["mode"], threads=args["threads"])
        t_open = time.perf_counter()
        batches = src.batches(args["batch"], shuffle=True, seed=rank, drop_remainder=True)
        x, _ = next(batches)
        t_first = time.perf_counter()
        checksum = float(x[0, 0, 0])
        n = 0
        for _ in range(args["batches"]):
            x, _ = next(batches)
            n += len(x)
        t_end = time.perf_counter()
        queue.put({"rank": rank, "samples": len(src), "open_s": t_open - t0, "first_batch_s": t_first - t_open,
                   "samples_per_s": n / (t_end - t_first) if n else None, "checksum": checksum, **common.process_memory()})
        batches.close()
    except BaseException as e:  # noqa: B036 - reported to the parent, which prints it
        queue.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})


def _users_worker(args, barrier, queue, rank):
    """The users' way: np.load every factor and label file into dicts, stream the index, slice batches."""
    try:
        barrier.wait()
        t0 = time.perf_counter()
        factors = {Path(p).stem: np.load(p) for p in args["factor_paths"]}
        labels = {Path(p).stem: np.load(p) for p in args["label_paths"]}
        t_open = time.perf_counter()
        rng = np.random.default_rng(rank)
        window, lines = args["window"], _index_head(args["index"], args["batch"] * (args["batches"] + 1))

        def batch(k):
            chosen = [lines[i] for i in rng.integers(0, len(lines), args["batch"])]
            x = np.stack([factors[key][f - window + 1:f + 1] for f, _, key in chosen]).astype(np.float32)
            y = np.stack([labels[key][l] for _, l, key in chosen]).astype(np.float32)
            return x, y

        x, _ = batch(0)
        t_first = time.perf_counter()
        n = 0
        for k in range(args["batches"]):
            n += len(batch(k + 1)[0])
        t_end = time.perf_counter()
        queue.put({"rank": rank, "samples": None, "open_s": t_open - t0, "first_batch_s": t_first - t_open,
                   "samples_per_s": n / (t_end - t_first) if n else None, "checksum": float(x[0, 0, 0]),
                   **common.process_memory()})
    except BaseException as e:  # noqa: B036
        queue.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})


def _index_head(paths, count):
    """The first `count` index lines (the users stream the index with a shuffle buffer; this stands in for it)."""
    out = []
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.strip():
                    f_, l_, key = line.strip().split(",")
                    out.append((int(f_), int(l_), key))
                    if len(out) == count:
                        return out
    return out


def run_node(worker, args: dict, procs: int, timeout: float) -> list:
    """Start `procs` processes running `worker` together; their results by rank (a killed one: an error)."""
    ctx = mp.get_context("spawn")  # fresh interpreters, as separately launched trainers are
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    children = [ctx.Process(target=worker, args=(args, barrier, queue, rank)) for rank in range(procs)]
    for child in children:
        child.start()
    results, deadline = {}, time.monotonic() + timeout
    while len(results) < procs and time.monotonic() < deadline:
        try:
            r = queue.get(timeout=1.0)
            results[r["rank"]] = r
        except Exception:  # queue.Empty: look for children that died without a word
            for rank, child in enumerate(children):
                if rank not in results and child.exitcode not in (None, 0):
                    results[rank] = {"rank": rank, "error": f"killed (exit code {child.exitcode})"}
    for rank, child in enumerate(children):
        child.join(timeout=max(1.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join()
        results.setdefault(rank, {"rank": rank, "error": f"no result within {timeout:.0f} s"})
    return [results[r] for r in range(procs)]


def report(title: str, results: list, log=print) -> dict:
    rows, ok = [], [r for r in results if "error" not in r]
    for r in results:
        if "error" in r:
            rows.append([r["rank"], "FAILED: " + r["error"], "", "", "", "", ""])
            continue
        rows.append([r["rank"], common.fmt(r["private"] / MB, ".0f"), common.fmt(r["rss_anon"] / MB, ".0f"),
                     common.fmt(r["pss"] / MB, ".0f"), common.fmt(r["open_s"], ".2f"),
                     common.fmt(r["first_batch_s"], ".2f"), common.fmt(r["samples_per_s"], ",.0f")])
    summary = {}
    if ok:
        summary = {"private_sum": sum(r["private"] for r in ok), "rss_anon_sum": sum(r["rss_anon"] for r in ok),
                   "pss_sum": sum(r["pss"] for r in ok), "open_max_s": max(r["open_s"] for r in ok),
                   "start_max_s": max(r["open_s"] + r["first_batch_s"] for r in ok),
                   "samples_per_s_sum": sum(r["samples_per_s"] or 0 for r in ok), "failed": len(results) - len(ok)}
        rows.append(["sum/max", common.fmt(summary["private_sum"] / MB, ".0f"),
                     common.fmt(summary["rss_anon_sum"] / MB, ".0f"), common.fmt(summary["pss_sum"] / MB, ".0f"),
                     common.fmt(summary["open_max_s"], ".2f"),
                     common.fmt(max(r["first_batch_s"] for r in ok), ".2f"),
                     common.fmt(summary["samples_per_s_sum"], ",.0f")])
    log(f"\n{title}")
    log(common.format_table(["process", "private MB", "RssAnon MB", "PSS MB", "open s", "1st batch s", "samples/s"],
                            rows))
    return summary


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    common.add_data_args(p, files=14000, rows=4800, cols=8, dtype="float32")
    p.add_argument("--procs", type=int, default=10, help="training processes started together (default 10)")
    p.add_argument("--window", type=int, default=100, help="rows per sample W (default 100)")
    p.add_argument("--batch", type=int, default=256, help="samples per batch B (default 256)")
    p.add_argument("--batches", type=int, default=50, help="batches timed per process after the first (default 50)")
    p.add_argument("--mode", default="mmap", help="WindowSource read mode (default mmap)")
    p.add_argument("--cold", action="store_true", help="evict the data files from the page cache before each run")
    p.add_argument("--single", action="store_true", help="also run one process alone first (the one-process targets)")
    p.add_argument("--users", action="store_true",
                   help="also run the users' dict way with the same process count, where it fits in memory")
    p.add_argument("--timeout", type=float, default=900, help="seconds before a process counts as hung (default 900)")
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.rows, args.cols, args.procs, args.batches = 6, 400, 4, 2, 3
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = common.DataSpec(files=args.files, rows=args.rows, cols=args.cols, dtype=args.dtype, label_cols=1,
                           stocks=1, window=args.window)
    ds = common.make_dataset(args.dir, spec)
    stock_dir = Path(ds.factor_paths[0]).parent.parent
    threads = args.threads or max(1, common.resolve_threads(None) // args.procs)
    job = {"index": ds.index_paths, "factor_dir": str(stock_dir / "factor"), "label_dir": str(stock_dir / "label"),
           "window": args.window, "mode": args.mode, "threads": threads, "batch": args.batch, "batches": args.batches}
    data_bytes = sum(os.path.getsize(p) for p in ds.factor_paths + ds.label_paths)
    index_bytes = sum(os.path.getsize(p) for p in ds.index_paths)
    print(f"data set: {args.files} keys of ({args.rows}, {args.cols}) {args.dtype}, {data_bytes / 1e9:.2f} GB of "
          f"arrays, index {index_bytes / 1e9:.2f} GB; {args.procs} processes x {threads} thread(s), mode "
          f"{args.mode}, {'cold' if args.cold else 'warm'} cache; load average {common.load_average()}")
    payload = {"machine": common.machine_info(), "args": vars(args), "data_bytes": data_bytes, "runs": {}}

    def prepare():
        if args.cold:
            common.evict(ds.factor_paths + ds.label_paths + ds.index_paths)
        else:
            common.warm(ds.factor_paths + ds.label_paths + ds.index_paths)

    if args.single:
        prepare()
        results = run_node(_npyfeed_worker, job, 1, args.timeout)
        payload["runs"]["npyfeed_single"] = {"results": results, "summary": report("npyfeed, one process", results)}
    prepare()
    results = run_node(_npyfeed_worker, job, args.procs, args.timeout)
    summary = report(f"npyfeed, {args.procs} processes started together", results)
    payload["runs"]["npyfeed"] = {"results": results, "summary": summary}
    if args.users:
        needed = args.procs * data_bytes * 1.1

        available = common.measure.available_memory() or 0
        if needed > 0.7 * available:
            print(f"\nusers' dict way: skipped, {args.procs} copies need {needed / 1e9:.1f} GB of the "
                  f"{available / 1e9:.1f} GB available (what swaps or gets killed on their node)")
        else:
            prepare()
            users = dict(job, factor_paths=ds.factor_paths, label_paths=ds.label_paths)
            results = run_node(_users_worker, users, args.procs, args.timeout)
            payload["runs"]["users"] = {"results": results,
                                        "summary": report(f"users' dict way, {args.procs} processes", results)}
    _print_targets(payload, args.procs)
    if args.json:
        common.write_json(args.json, payload)
    failed = any("error" in r for run in payload["runs"].values() for r in run["results"])
    return 1 if failed else 0


def _print_targets(payload: dict, procs: int) -> None:
    lines = []
    single = payload["runs"].get("npyfeed_single", {}).get("summary")
    if single:
        lines.append(f"one process: RssAnon {single['rss_anon_sum'] / MB:.0f} MB (target <= 200 MB: "
                     f"{'MET' if single['rss_anon_sum'] <= 200 * MB else 'MISSED'}), open + first batch "
                     f"{single['start_max_s']:.2f} s (target <= 1 s: "
                     f"{'MET' if single['start_max_s'] <= 1 else 'MISSED'})")
    node = payload["runs"]["npyfeed"]["summary"]
    if node:
        lines.append(f"{procs} processes: total RssAnon {node['rss_anon_sum'] / 1e9:.2f} GB (target <= 2 GB: "
                     f"{'MET' if node['rss_anon_sum'] <= 2e9 else 'MISSED'}), total private {node['private_sum'] / 1e9:.2f} "
                     f"GB, slowest open + first batch "
                     f"{node['start_max_s']:.2f} s (target <= 5 s: {'MET' if node['start_max_s'] <= 5 else 'MISSED'}), "
                     f"failed {node['failed']}")
    print("\ntargets\n  " + "\n  ".join(lines))


if __name__ == "__main__":
    sys.exit(main())
