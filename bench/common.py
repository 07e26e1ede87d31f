"""Shared helpers for the npyfeed benchmarks: everything a benchmark needs besides its contenders.

* a data set in the users' layout (``<root>/<stock>/<split>/factor/<key>.npy`` of shape ``(T, F)``,
  ``.../label/<key>.npy`` of shape ``(T, L)`` and ``.../index.txt`` with lines ``feature_index,label_index,key``),
  generated once from a seeded RNG and reused while its parameters match;
* page-cache control: eviction with ``posix_fadvise(DONTNEED)`` per file, warming and a residency check (through
  ``npyfeed.warm``), and the bytes a process read from storage;
* the physical limits, measured in the same run (``npyfeed.bench.measure``, which ``npyfeed bench`` shares:
  memory copy, into fresh buffers too, the disk's O_DIRECT sequential and random reads, the same reads through
  the page cache; re-exported here with its table printer and machine facts);
* repeat timing (best and median), fresh child processes for A/B runs, and JSON output.

Units: GB = 1e9 bytes; bandwidths are bytes of array data per second.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import npyfeed
import numpy as np

try:
    from npyfeed.bench import measure
except ImportError:  # bench_ab.py's child of an install from before npyfeed.bench.measure was public
    try:
        from npyfeed.bench import _measure as measure
    except ImportError:
        from npyfeed import _measure as measure

# The physical-limit probes, page-cache eviction, the table printer and the machine facts, for the benchmarks.
# Only names every install a child may import has (bench_ab.py, --baseline DIR): a script that runs on the
# current install only imports newer ones (random_read_limit, time_batches) from npyfeed.bench.measure.
GB, PAGE, RandomReadResult = measure.GB, measure.PAGE, measure.RandomReadResult
evict, format_table, machine_info = measure.evict, measure.format_table, measure.machine_info
memcpy_bandwidth = measure.memcpy_bandwidth
odirect_random_bandwidth, odirect_seq_bandwidth = measure.odirect_random_bandwidth, measure.odirect_seq_bandwidth

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_DATA_DIR = BENCH_DIR / "data"  # gitignored


# --------------------------------------------------------------------------------------------- data set


@dataclass(frozen=True)
class DataSpec:
    """Parameters of a generated data set; equal specs give byte-identical files."""

    files: int = 400
    rows: int = 4800
    cols: int = 256
    dtype: str = "float32"
    label_cols: int = 2
    stocks: int = 4
    split: str = "train"
    window: int = 100  # index lines start at row window-1, so every window fits
    index_stride: int = 1  # one index line every `index_stride` rows
    seed: int = 0

    @property
    def name(self) -> str:
        """Folder name under the data directory, so data sets of different sizes coexist."""
        return f"{self.files}x{self.rows}x{self.cols}-{np.dtype(self.dtype).name}"

    @property
    def factor_nbytes(self) -> int:
        return self.files * self.rows * self.cols * np.dtype(self.dtype).itemsize


@dataclass
class DataSet:
    """A generated data set: paths in key order (key ``k00000`` .. ``k<files-1>``)."""

    root: Path
    spec: DataSpec
    keys: list
    factor_paths: list
    label_paths: list
    index_paths: list  # one per (stock, split)

    @property
    def nbytes(self) -> int:
        """Bytes of factor array data (what a load of `factor_paths` moves)."""
        return self.spec.factor_nbytes

    def factor_dir(self, stock: str) -> Path:
        return self.root / stock / self.spec.split / "factor"

    def label_dir(self, stock: str) -> Path:
        return self.root / stock / self.spec.split / "label"


_MANIFEST = "manifest.json"


def _layout(root: Path, spec: DataSpec) -> DataSet:
    stocks = [f"S{s:03d}" for s in range(max(1, min(spec.stocks, spec.files)))]
    keys, factors, labels = [], [], []
    for i in range(spec.files):
        stock = stocks[i % len(stocks)]
        key = f"k{i:05d}"
        keys.append(key)
        factors.append(root / stock / spec.split / "factor" / f"{key}.npy")
        labels.append(root / stock / spec.split / "label" / f"{key}.npy")
    index = [root / s / spec.split / "index.txt" for s in stocks]
    return DataSet(root, spec, keys, [str(p) for p in factors], [str(p) for p in labels], [str(p) for p in index])


def _random_array(rng: np.random.Generator, shape: tuple, dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "f":
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape, dtype=dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise ValueError(f"unsupported benchmark dtype {dtype}")


def _save_durably(path: str, array: np.ndarray) -> None:
    """np.save, then fsync (dirty pages cannot be evicted) and drop the file from the page cache."""
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def make_dataset(parent: str | os.PathLike, spec: DataSpec, *, log: Callable[[str], None] = print) -> DataSet:
    """Generate (or reuse) the data set `spec` in ``parent/spec.name``.

    Reused when ``manifest.json`` there matches `spec` and every file exists. A folder is only ever deleted
    when it holds a manifest of ours, so pointing ``--dir`` at the wrong place cannot destroy anything.
    """
    root = Path(parent).resolve() / spec.name  # absolute: children run from /
    ds = _layout(root, spec)
    manifest = root / _MANIFEST
    all_files = ds.factor_paths + ds.label_paths + ds.index_paths
    if manifest.is_file():
        try:
            same = json.loads(manifest.read_text()) == asdict(spec)
        except ValueError:
            same = False
        if same and all(os.path.isfile(p) for p in all_files):
            return ds
        shutil.rmtree(root)
    elif root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} exists, is not empty and holds no {_MANIFEST}; refusing to overwrite it")

    dtype = np.dtype(spec.dtype)
    log(f"generating {spec.files} files of ({spec.rows}, {spec.cols}) {dtype.name} "
        f"({spec.factor_nbytes / GB:.2f} GB) in {root} ...")
    t0 = time.perf_counter()
    rng = np.random.default_rng(spec.seed)
    window = max(1, min(spec.window, spec.rows))
    feature_rows = np.arange(window - 1, spec.rows, max(1, spec.index_stride))
    index_lines: dict = {}
    for key, factor, label in zip(ds.keys, ds.factor_paths, ds.label_paths):
        for path, cols in ((factor, spec.cols), (label, spec.label_cols)):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _save_durably(path, _random_array(rng, (spec.rows, cols), dtype))
        index = str(Path(factor).parent.parent / "index.txt")  # <root>/<stock>/<split>/index.txt
        index_lines.setdefault(index, []).append("".join(f"{r},{r},{key}\n" for r in feature_rows.tolist()))
    for path in ds.index_paths:
        with open(path, "w") as f:
            f.write("".join(index_lines.get(path, [])))
            f.flush()
            os.fsync(f.fileno())
    manifest.write_text(json.dumps(asdict(spec), indent=1))
    log(f"  done in {time.perf_counter() - t0:.1f} s")
    return ds


# ----------------------------------------------------------------------------------------- page cache


def warm(paths: Sequence[str]) -> None:
    """Read `paths` into the page cache (``npyfeed.warm``: parallel reads, no lock file)."""
    npyfeed.warm(list(paths), lock=False)


def cached_fraction(paths: Sequence[str]) -> float:
    """The fraction of the bytes of `paths` in the page cache (``mincore``, through ``npyfeed.warm``)."""
    report = npyfeed.warm(list(paths), check=True, lock=False)
    return report.resident_before / report.bytes if report.bytes else 0.0


def read_bytes() -> int:
    """Bytes this process has had read from storage (``read_bytes`` of /proc/self/io: read-ahead included); in
    children of any install (`time_batches` counts the same for the current one)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes:")).split()[1])


def fresh_pages_per_allocation() -> None:
    """Make every large allocation of this process come fresh from the kernel (as in a new training process).

    glibc raises its mmap threshold after the first large free, so later multi-MB arrays come from an already
    faulted heap and page faults vanish from every repeat after the first. Fixing M_MMAP_THRESHOLD at 128 KiB
    keeps each repeat honest: numpy's and npyfeed's buffers both pay their page faults every time.
    """
    try:
        ctypes.CDLL(None).mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------------------------- limits


def aligned_float32(shape: tuple) -> np.ndarray:
    """Zeros of `shape`, float32, at a 64-byte-aligned address: what TensorFlow adopts without a copy when a
    ``numpy_function`` returns it (numpy's own large allocations sit at 16 mod 64)."""
    nbytes = int(np.prod(shape)) * 4
    raw = np.zeros(nbytes + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + nbytes].view(np.float32).reshape(shape)


# --------------------------------------------------------------------------------------------- timing


@dataclass
class Timing:
    """Wall (and process CPU) times of the repeats of one contender in one cache state."""

    name: str
    cache: str  # "warm" or "cold"
    times: list = field(default_factory=list)
    nbytes: int = 0
    note: str = ""
    threads: int = 1
    cpu_times: list = field(default_factory=list)  # user+sys seconds of this process (all its threads)

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def gbps(self) -> float:
        return self.nbytes / self.best / GB

    @property
    def cpu_best(self) -> float | None:
        """CPU seconds of the repeat with the best wall time."""
        return self.cpu_times[self.times.index(self.best)] if self.cpu_times else None


def time_once(fn: Callable[[], object], before: Callable[[], None] | None = None) -> tuple:
    """(wall seconds, process CPU seconds) of one call of `fn`; `before` runs untimed first.

    The result of `fn` is held until the clocks stop and released afterwards, so freeing it is never timed.
    CPU time counts every thread of this process (user + system): under contention from other processes it
    still shows the work done, where wall time shows the wait too.
    """
    gc.collect()
    if before is not None:
        before()
    c0 = time.process_time()
    t0 = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    del result
    gc.collect()
    return wall, cpu


def time_repeats(fn: Callable[[], object], repeats: int, before: Callable[[], None] | None = None) -> list:
    """Wall seconds of `repeats` calls of `fn`; `before` (e.g. eviction) runs untimed before each one.

    The result of `fn` is held until the clock stops and released before the next repeat, so freeing it is
    never timed and two results never coexist.
    """
    return [time_once(fn, before)[0] for _ in range(repeats)]


def process_memory() -> dict:
    """This process's memory, in bytes: private (clean + dirty) and PSS from smaps_rollup, RssAnon and VmHWM
    from status. Mapped page-cache pages that no other process maps count as private."""
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Pss", "Private_Clean", "Private_Dirty"):
                out[name] = int(rest.split()[0]) * 1024
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("RssAnon", "VmHWM"):
                out[name] = int(rest.split()[0]) * 1024
    return {"private": out["Private_Clean"] + out["Private_Dirty"], "pss": out["Pss"], "rss_anon": out["RssAnon"],
            "hwm": out["VmHWM"]}


def load_average() -> str:
    """The 1-minute load average and the CPU count: a benchmark on a busy machine says so."""
    try:
        return f"{os.getloadavg()[0]:.1f} on {machine_info()['cpus']} CPUs"
    except OSError:
        return "unknown"


# ---------------------------------------------------------------------------------------- output


def fmt(value: float | None, spec: str = ".3f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def serve_child(argv, child: Callable[[dict], dict]) -> bool:
    """The child half of a benchmark that measures in fresh processes: with ``--child JSON`` in `argv`, prints
    ``child(config)`` as one line of JSON and returns True (the script then exits); else False."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--child")
    known, _ = pre.parse_known_args(argv)
    if not known.child:
        return False
    print(json.dumps(child(json.loads(known.child))))
    return True


def importing_from(env: dict, install: str) -> dict:
    """`env` with the npyfeed installed in folder `install` (``pip install --target``) first on the import path:
    a benchmark's baseline build."""
    rest = env.get("PYTHONPATH")
    return dict(env, PYTHONPATH=install + (os.pathsep + rest if rest else ""))


def run_child(script: str, cfg: dict, env: dict | None, what: str, fail: bool = True) -> dict:
    """The parent half of `serve_child`: `script` run in a fresh Python with ``--child JSON(cfg)``, environment
    `env` (None: this one's), from ``/`` (so that the installed npyfeed is imported, not a checkout's); returns the
    JSON it printed last. A child that fails exits naming `what` with its output, or with ``fail=False`` gives
    ``{"error": the end of its stderr}``."""
    r = subprocess.run([sys.executable, str(Path(script).resolve()), "--child", json.dumps(cfg)], env=env,
                       capture_output=True, text=True, cwd="/")
    if r.returncode == 0:
        return json.loads(r.stdout.strip().splitlines()[-1])
    if fail:
        raise SystemExit(f"child ({what}) failed with {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return {"error": r.stderr[-2000:]}


def write_json(path: str | os.PathLike, payload: dict) -> None:
    """`payload` as JSON, with the command line and the date (UTC) of the run added."""
    payload = {"command": " ".join(["python3", *sys.argv]),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **payload}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=str)
        f.write("\n")


def add_data_args(parser: argparse.ArgumentParser, *, files: int, rows: int, cols: int, dtype: str | None,
                  dtype_help: str | None = None) -> None:
    """The flags every benchmark shares: data set size, location, threads, repeats, JSON, quick."""
    g = parser.add_argument_group("data set")
    g.add_argument("--files", type=int, default=files, help=f"number of factor files (default {files})")
    g.add_argument("--rows", type=int, default=rows, help=f"rows T per file (default {rows})")
    g.add_argument("--cols", type=int, default=cols, help=f"columns F per file (default {cols})")
    g.add_argument("--dtype", default=dtype, help=dtype_help or f"dtype of the files (default {dtype})")
    g.add_argument("--dir", default=str(DEFAULT_DATA_DIR),
                   help="where data sets are generated and kept (default bench/data, gitignored)")
    r = parser.add_argument_group("run")
    r.add_argument("--threads", type=int, default=None,
                   help="threads for npyfeed, the thread-pool baseline and the limits (default: CPUs available)")
    r.add_argument("--repeats", type=int, default=3, help="timed repeats per contender and cache state (default 3)")
    r.add_argument("--json", metavar="PATH", default=None, help="also write all results as JSON to PATH")
    r.add_argument("--quick", action="store_true", help="tiny sizes and one repeat: a smoke test, not a measurement")


def resolve_threads(threads: int | None) -> int:
    if threads is not None:
        if threads < 1:
            raise SystemExit("--threads must be at least 1")
        return threads
    return machine_info()["cpus"]


def link_dir(root: Path, ds: DataSet) -> tuple:
    """One factor and one label folder for all stocks (npyfeed takes one folder each): symlinks, made once."""
    factor_dir, label_dir = root / "factor", root / "label"
    for folder, paths in ((factor_dir, ds.factor_paths), (label_dir, ds.label_paths)):
        folder.mkdir(parents=True, exist_ok=True)
        for path in paths:
            link = folder / os.path.basename(path)
            target = os.path.abspath(path)
            if os.path.islink(link) and os.readlink(link) == target:
                continue
            if os.path.lexists(link):
                link.unlink()
            os.symlink(target, link)
    return str(factor_dir), str(label_dir)
