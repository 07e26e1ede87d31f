#!/usr/bin/env python3
"""Is `np.savez_compressed` worth it for factor files? `.npy` against `.npz` (stored and deflated), warm and cold.

One data set of per-key factor files (default 100 files of (4800, 256) float32, the users' shape) written three
ways: `np.save` (.npy), `np.savez` (.npz, stored) and `np.savez_compressed` (.npz, deflated), one array per file.
The data is realistic rather than random: each column a random walk over the rows (factors change slowly in
time), rounded to 3 decimals (the precision factors are computed to), stored as float32, so deflate finds
something to remove (fully random float32 barely compresses: see --random).

For each format it prints bytes on disk and the time to load every file into a dict with np.load (one thread, the
users' loop) and with npyfeed.load_many (mode "read", and "mmap" for .npy and stored .npz), with the page cache
warm and cold (every file evicted with POSIX_FADV_DONTNEED before each cold repeat). See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import npyfeed  # noqa: E402

FORMATS = {
    "npy": (".npy", lambda path, a: np.save(path, a)),
    "npz stored": (".npz", lambda path, a: np.savez(path, a)),
    "npz deflated": (".npz", lambda path, a: np.savez_compressed(path, a)),
}
HEADER = ("format", "MB on disk", "loader", "cache", "best s", "median s", "GB/s", "x np.load npy")


def factors(rng: np.random.Generator, rows: int, cols: int, random: bool) -> np.ndarray:
    if random:
        return rng.standard_normal((rows, cols), dtype=np.float32)
    walk = np.cumsum(rng.standard_normal((rows, cols)) * 0.01, axis=0)
    return np.round(walk, 3).astype(np.float32)


def write_dataset(root: Path, files: int, rows: int, cols: int, random: bool) -> dict:
    """{format: [paths]}; kept between runs when the same spec exists."""
    tag = f"npz_{files}x{rows}x{cols}_{'random' if random else 'walk3'}"
    base = root / tag
    done = base / "complete"
    paths = {name: [str(base / name.replace(" ", "_") / f"k{i:04d}{ext}") for i in range(files)]
             for name, (ext, _) in FORMATS.items()}
    if done.exists():
        return paths
    rng = np.random.default_rng(12)
    for name in FORMATS:
        (base / name.replace(" ", "_")).mkdir(parents=True, exist_ok=True)
    for i in range(files):
        a = factors(rng, rows, cols, random)
        for name, (_, save) in FORMATS.items():
            save(paths[name][i], a)
    done.write_text("ok\n")
    return paths


def np_load_all(paths):
    out = {}
    for p in paths:
        loaded = np.load(p)
        out[p] = loaded if isinstance(loaded, np.ndarray) else dict(loaded)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_data_args(p, files=100, rows=4800, cols=256, dtype="float32")
    p.add_argument("--random", action="store_true", help="fully random float32 instead of rounded random walks")
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.rows, args.cols, args.repeats = 4, 100, 64, 1
    threads = common.resolve_threads(args.threads)
    paths = write_dataset(Path(args.dir), args.files, args.rows, args.cols, args.random)
    nbytes = args.files * args.rows * args.cols * 4
    print(f"{args.files} files of ({args.rows}, {args.cols}) float32 "
          f"({'random' if args.random else 'random walks rounded to 3 decimals'}), {nbytes / 1e6:.0f} MB of data; "
          f"threads {threads}; load {common.load_average()}; zlib {npyfeed.build_info()['zlib']}")

    # The same arrays from every format (so the timings compare like with like).
    reference = npyfeed.load_many(paths["npy"][:2])
    for name in FORMATS:
        got = npyfeed.load_many(paths[name][:2])
        for want, have in zip(reference, got):
            np.testing.assert_array_equal(want, have if isinstance(have, np.ndarray) else have["arr_0"])

    contenders = []
    for name in FORMATS:
        contenders.append((name, "np.load loop", lambda ps=paths[name]: np_load_all(ps)))
        contenders.append((name, "npyfeed read", lambda ps=paths[name]: npyfeed.load_many(ps, mode="read",
                                                                                           threads=threads)))
        if name == "npz deflated":  # what the thread pool brings to inflating
            contenders.append((name, "npyfeed read 1 thread", lambda ps=paths[name]: npyfeed.load_many(
                ps, mode="read", threads=1)))
        else:
            contenders.append((name, "npyfeed mmap+populate",
                               lambda ps=paths[name]: npyfeed.load_many(ps, mode="mmap", populate=True,
                                                                        threads=threads)))
    rows, results, baseline = [], [], {}
    for cache in ("warm", "cold"):
        for name, loader, fn in contenders:
            files = paths[name]
            before = (lambda fs=files: common.evict(fs)) if cache == "cold" else None
            if cache == "warm":
                fn()  # fill the cache
            times = common.time_repeats(fn, args.repeats, before)
            best, median = min(times), float(np.median(times))
            if name == "npy" and loader == "np.load loop":
                baseline[cache] = best
            disk = sum(os.path.getsize(f) for f in files)
            rows.append((name, f"{disk / 1e6:.1f}", loader, cache, f"{best:.3f}", f"{median:.3f}",
                         f"{nbytes / best / 1e9:.2f}", f"{baseline[cache] / best:.2f}"))
            results.append({"format": name, "disk_bytes": disk, "loader": loader, "cache": cache, "best_s": best,
                            "median_s": median, "times_s": times})
    print(common.format_table(HEADER, rows))
    if args.json:
        common.write_json(args.json, {"machine": common.machine_info(), "files": args.files, "rows": args.rows,
                                      "cols": args.cols, "random": args.random, "threads": threads,
                                      "data_bytes": nbytes, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
