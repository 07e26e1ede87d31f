"""The ``npyfeed`` command.

``npyfeed scan PATH...`` checks every ``.npy`` file and ``.npz`` archive of a data set (header, dtype, size; for
archives the zip directory and every member's header; with ``--data`` every byte, and every member's CRC-32) in
parallel, before a multi-day job finds a bad one. Exit status: 0 when every file is good, 1 when any is bad (or
none was found), 2 for a usage error, 130 when interrupted.

``npyfeed scan FACTOR_DIR LABEL_DIR --index INDEX... --window W`` checks index files against those folders
(``npyfeed.check_index``) and lists every problem with its file and line. Exit status: 0 when there is no error
(warnings: duplicate lines, mixed dtypes), 1 on an error, 2 for a usage error.

``npyfeed warm PATH...`` brings a data set into the page cache once per node (``npyfeed.warm``) and prints its
residency per directory; ``--check`` only reports.

``npyfeed bench INDEX... FACTOR_DIR LABEL_DIR --window W --batch-size B`` measures the ways of reading those files
on this machine, side by side with its physical limits, and recommends one (``npyfeed.bench.run``). Exit status:
0 done, 1 a file that cannot be read (named), 2 usage error.

Subcommands live in functions ``_add_<name>_parser(sub)`` that register a subparser whose ``func(args)``
returns the exit status. ``npyfeed demo`` comes from the optional module ``npyfeed.demo``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from ._resources import MAX_HEADER_SIZE, resolve_threads

__all__ = ["main"]

#: Most bytes of array data one ``scan --data`` batch holds in memory at once (one larger file is read alone).
DATA_BATCH_BYTES = 512 << 20
#: Most files in one ``scan --data`` batch.
DATA_BATCH_FILES = 256


def main(argv=None) -> int:
    """Run the ``npyfeed`` command with `argv` (default ``sys.argv[1:]``) and return its exit status."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # usage errors (2) and --help (0): return the status instead of exiting
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("npyfeed: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `npyfeed scan ... | head`: the reader left; leave quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="npyfeed", description="Fast, safe feeding of NumPy .npy files.")
    from . import __version__  # the package's own metadata

    parser.add_argument("--version", action="version", version=f"npyfeed {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_scan_parser(sub)
    _add_warm_parser(sub)
    _add_bench_parser(sub)
    _add_demo_parser(sub)
    _add_info_parser(sub)
    return parser


def _add_info_parser(sub) -> None:
    p = sub.add_parser(
        "info", help="what this build holds and uses here: compiler, glibc, io_uring, AVX-512/AVX2, op library",
        description="Print npyfeed.build_info(): the compiler and C++ library the build used, the glibc it targets, "
                    "whether io_uring is compiled in and usable here, whether AVX2 and AVX-512 are available and "
                    "used, whether zlib is compiled in, and npyfeed.tf's op library. TensorFlow is not imported "
                    "unless --tf is given.")
    p.add_argument("--tf", action="store_true",
                   help="also import TensorFlow and load the op library, to say whether it loads")
    p.add_argument("--json", action="store_true", help="print the dict as JSON")
    p.add_argument("--settings", action="store_true",
                   help="also list every environment variable npyfeed reads, with its value now (npyfeed.settings())")
    p.set_defaults(func=_cmd_info)


def _cmd_info(args) -> int:
    from ._build_info import build_info, format_build_info

    info = build_info(tf=args.tf)
    table = None
    if args.settings:
        from ._resources import settings

        table = settings()
    if args.json:
        import json

        print(json.dumps(info if table is None else {**info, "settings": table}, indent=2))
        return 0
    print(format_build_info(info))
    if table is not None:
        print("\nenvironment variables (value now, read by, what it does):")
        width = max(len(name) for name in table)
        for name, row in table.items():
            value = "-" if row["value"] is None else repr(row["value"])
            print(f"  {name:<{width}}  {value:<8} {row['read_by']:<6}  {row['meaning']}")
    return 0


def _add_demo_parser(sub) -> None:
    """Register ``npyfeed demo`` if the module ``npyfeed.demo`` exists.

    That module defines ``add_parser(sub)``, which adds its subparser with ``set_defaults(func=...)``; the
    function takes the parsed arguments and returns the exit status. Keep heavy imports inside it.
    """
    try:
        from .demo import add_parser
    except ModuleNotFoundError as e:
        if e.name != f"{__package__}.demo":  # the module exists but something it imports does not
            raise
        return
    add_parser(sub)


# --------------------------------------------------------------------------------------------------------
# scan

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_scan_parser(sub) -> None:
    p = sub.add_parser(
        "scan", help="check every .npy file and .npz archive under the given paths",
        description="Check every .npy file and .npz archive under the given files and directories (recursively; "
                    "symbolic links to directories are not followed): magic, version, header, dtype (object arrays "
                    "are bad), and that the file holds all the data its header promises. Files given by name are "
                    "checked whatever their extension.",
        epilog="With --index: check index files against FACTOR_DIR and LABEL_DIR instead (the two PATHs), as "
               "WindowSource would open them, and list every problem with its index file and line: malformed "
               "lines (a header line), keys without files, unreadable files, rows of other shapes, factor and "
               "label files of different lengths, windows and label rows outside their files; warnings for "
               "duplicate lines and for files of a dtype other than most. "
               "Exit status: 0 all files good (with --index: no error), 1 some file bad or no .npy file found "
               "(with --index: an error), 2 usage error.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a .npy file or a directory to search; with --index, FACTOR_DIR LABEL_DIR")
    p.add_argument("--index", nargs="+", metavar="INDEX", default=None,
                   help="index file(s) of feature_index,label_index,key lines to check against FACTOR_DIR LABEL_DIR")
    p.add_argument("--window", type=_positive_int, default=None, help="with --index: rows per sample, W (required)")
    p.add_argument("--bounds", choices=("error", "skip", "pad"), default="error",
                   help="with --index: lines outside their files are errors, or warnings (skip, pad) as the "
                        "source's bounds= (default error)")
    p.add_argument("--missing", choices=("error", "skip"), default="error",
                   help="with --index: keys without files are errors, or warnings (skip) as the source's missing= "
                        "(default error)")
    p.add_argument("--limit", type=_positive_int, default=20,
                   help="with --index: most problems listed per kind (all are counted; default 20)")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="threads (default: 4 per CPU, at most 64, for the headers; NPYFEED_THREADS or the CPUs "
                        "for the --data reads)")
    p.add_argument("--max-header-size", type=_positive_int, default=MAX_HEADER_SIZE,
                   help=f"largest header accepted, in characters (default {MAX_HEADER_SIZE}, as np.load)")
    p.add_argument("--data", action="store_true",
                   help="also read every byte of every good file (catches IO errors; takes as long as a full load)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no dtype/shape summary")
    p.set_defaults(func=_scan)


def _add_warm_parser(sub) -> None:
    p = sub.add_parser(
        "warm", help="bring a data set into the page cache once per machine",
        description="Read the given files, and the files matching --pattern under the given directories, into the "
                    "OS page cache with large parallel reads (what is cached already is not read again), then "
                    "print per directory how much of it is resident. Run it once per node before starting the "
                    "training processes: with mode='mmap' they all share that one cached copy. Processes warming "
                    "the same files at once take turns (a lock in npyfeed's cache folder) and read each byte once.",
        epilog="Exit status: 0 done, 1 a file could not be read, 2 usage error.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="a file or a directory to search")
    p.add_argument("--check", action="store_true", help="only report what is resident (mincore); read nothing")
    p.add_argument("--pattern", default="*.npy", help="file names to take in directories (default *.npy)")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="parallel reads (default: NPYFEED_THREADS or the CPUs, at least 8)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_warm)


def _warm(args) -> int:
    from .warm import warm

    progress = not args.quiet and not args.check and sys.stderr.isatty()
    if progress:
        try:
            import tqdm  # noqa: F401
        except ImportError:
            progress = False
    try:
        report = warm(args.paths, threads=args.threads, check=args.check, progress=progress, pattern=args.pattern)
    except (OSError, ValueError) as e:
        print(f"npyfeed warm: {e}", file=sys.stderr)
        return 1
    print(report.table())
    return 0


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _add_bench_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="measure how fast these files can be read here, and recommend a mode, threads and order",
        description="Measure, side by side on these files and read-only: the users' np.load dict and per-sample "
                    "np.load, npyfeed's numpy iterator in each mode (warm, and cold where the page cache of the "
                    "files can be dropped), shuffle='blocks', npyfeed.tf.dataset (with TensorFlow), and the "
                    "machine's limits (memory copy; the disk's sequential and random reads). Then print a table "
                    "and a recommendation. Large data sets are sampled (keys, and seconds per row); --full takes "
                    "every key and a whole epoch per npyfeed row.",
        epilog="Exit status: 0 done, 1 a file that cannot be read or is not valid (named), 2 usage error.")
    p.add_argument("index", nargs="+", metavar="INDEX", help="index file(s) of feature_index,label_index,key lines")
    p.add_argument("factor_dir", metavar="FACTOR_DIR", help="folder of <key>.npy factor files")
    p.add_argument("label_dir", metavar="LABEL_DIR", help="folder of <key>.npy label files")
    p.add_argument("--window", type=_positive_int, required=True, help="rows per sample, W")
    p.add_argument("--batch-size", type=_positive_int, required=True, help="samples per batch, B")
    p.add_argument("--processes", type=_positive_int, default=1,
                   help="training processes per node, for the recommendation (default 1)")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="gather threads (default: NPYFEED_THREADS or the CPUs this process may use)")
    p.add_argument("--full", action="store_true", help="every key, and a whole epoch per npyfeed row")
    p.add_argument("--seconds", type=_positive_float, default=2.0, help="seconds per row (default 2)")
    p.add_argument("--no-cold", action="store_true",
                   help="leave the page cache alone: no cold rows, no disk limits")
    p.add_argument("--no-tf", action="store_true", help="no npyfeed.tf.dataset row (TensorFlow is not imported)")
    p.add_argument("--bounds", choices=("error", "skip", "pad"), default="error",
                   help="windows outside their files: as WindowSource's bounds (default error)")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the report as JSON to PATH")
    p.add_argument("--plot", metavar="PATH", default=None,
                   help="also draw it to PATH, .svg or .png (needs matplotlib: pip install 'npyfeed[bench]')")
    p.add_argument("--wide", action="store_true",
                   help="the limits' names and the notes as columns of the tables, no line wrapped (by default the "
                        "report fits 120 columns, the notes numbered under each table)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_bench)


def _bench(args) -> int:
    import json

    from . import bench

    if args.plot is not None:  # say so now, not after a minute of measurements
        if os.path.splitext(args.plot)[1].lower() not in (".svg", ".png"):
            print(f"npyfeed bench: --plot {args.plot}: the plot is written as .svg or .png", file=sys.stderr)
            return 2
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("npyfeed bench: --plot needs matplotlib: pip install 'npyfeed[bench]'", file=sys.stderr)
            return 1
    try:
        report = bench.run(args.index, args.factor_dir, args.label_dir, window=args.window,
                           batch_size=args.batch_size, processes=args.processes, threads=args.threads,
                           full=args.full, seconds=args.seconds, cold=not args.no_cold, tf=not args.no_tf,
                           progress=not args.quiet and sys.stderr.isatty(), bounds=args.bounds)
    except (OSError, ValueError, IndexError, KeyError) as e:
        print(f"npyfeed bench: {_error_text(e)}", file=sys.stderr)
        return 1
    print(report.format_table(wide=args.wide))
    try:
        if args.json is not None:
            with open(args.json, "w") as f:
                json.dump(report.to_dict(), f, indent=1)
                f.write("\n")
        if args.plot is not None:
            report.plot(args.plot)
    except OSError as e:
        print(f"npyfeed bench: {_error_text(e)}", file=sys.stderr)
        return 1
    return 0


def _error_text(error: BaseException) -> str:
    """One message naming the file: an OSError's path after its reason, any other error's own text."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{display_path(error.filename)}: {error.strerror}"
    return str(error)


@dataclass
class _Report:
    files: list = field(default_factory=list)  # every path checked, in order
    headers: dict = field(default_factory=dict)  # path -> Header of the files that passed
    bad: dict = field(default_factory=dict)  # path -> reason


def display_path(path) -> str:
    """`path` printable on any terminal: bytes of a name that is not utf-8 appear as escapes (\\xe9)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _describe(error: BaseException) -> str:
    """One printable line saying what is wrong."""
    from ._core import NpyFormatError

    if isinstance(error, NpyFormatError):
        # Drop a Python traceback ("At: ...") that a dtype error from numpy may carry.
        text = f"NpyFormatError: {str(error.reason).split(chr(10) * 2 + 'At:', 1)[0]} (at byte {error.offset})"
    elif isinstance(error, OSError) and error.strerror:
        text = f"{type(error).__name__}: {error.strerror}"
    else:
        text = f"{type(error).__name__}: {error}"
    return " ".join(text.encode("utf-8", "backslashreplace").decode("utf-8").split())


def find_npy_files(paths, report: _Report) -> list:
    """Every ``*.npy`` and ``*.npz`` file under `paths` (files given by name count whatever their name), sorted per
    directory, without duplicates. Paths that do not exist and unreadable directories go to `report.bad`."""
    found, seen = [], set()

    def add(path):
        key = os.path.abspath(path)
        if key not in seen:
            seen.add(key)
            found.append(path)

    for path in paths:
        path = os.fspath(path)
        if os.path.isdir(path):
            def on_error(error, _path=path):
                report.bad[error.filename or _path] = _describe(error)

            for root, dirs, names in os.walk(path, onerror=on_error):
                dirs.sort()
                for name in sorted(names):
                    if name.endswith((".npy", ".npz")):
                        add(os.path.join(root, name))
        elif os.path.lexists(path):
            add(path)  # a file, a FIFO, a dangling link...: read_header says what is wrong with it
        else:
            report.bad[path] = "FileNotFoundError: No such file or directory"
    return found


def _progress(total: int, unit: str, desc: str, quiet: bool):
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit=unit, unit_scale=unit == "B", unit_divisor=1024, desc=desc, file=sys.stderr,
                leave=False)


def _archive_header(path: str, max_header_size: int):
    """One Header summing up an archive: its directory and every member's header checked (none of its data read).
    dtype and shape are the member's for a one-array archive; else the dtype is a struct of the members' dtypes
    (one dtype when they all share it) and the shape a tuple of their shapes."""
    import numpy as np

    from . import _core
    from .loading import Header

    members = _core.read_npz_headers(os.fsencode(path), max_header_size)
    dtypes = [h["dtype"] for _, h, *_ in members]
    shapes = tuple(h["shape"] for _, h, *_ in members)
    if len(set(dtypes)) == 1:
        dtype = dtypes[0]
    else:
        dtype = np.dtype([(key, h["dtype"]) for key, h, *_ in members])
    return Header(shape=shapes[0] if len(shapes) == 1 else shapes, dtype=dtype, fortran_order=False,
                  version=(0, 0), data_offset=0, nbytes=sum(h["nbytes"] for _, h, *_ in members),
                  file_size=os.path.getsize(path))


def _check_headers(report: _Report, files: list, threads: int, max_header_size: int, quiet: bool) -> None:
    from .loading import read_header

    def check(path):
        if path.endswith(".npz"):
            return _archive_header(path, max_header_size)
        return read_header(path, max_header_size=max_header_size)

    bar = _progress(len(files), "file", "headers", quiet)
    executor = ThreadPoolExecutor(max_workers=threads)
    try:
        # read_header releases the GIL for its IO and parsing, so these run in parallel.
        futures = {executor.submit(check, path): path for path in files}
        for future in as_completed(futures):
            path = futures[future]
            try:
                report.headers[path] = future.result()
            except Exception as e:  # noqa: BLE001 - whatever goes wrong with one file, report it and go on
                report.bad[path] = _describe(e)
            if bar is not None:
                bar.update(1)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()


def _batches(paths: list, headers: dict):
    batch, size = [], 0
    for path in paths:
        nbytes = headers[path].nbytes
        if batch and (size + nbytes > DATA_BATCH_BYTES or len(batch) >= DATA_BATCH_FILES):
            yield batch
            batch, size = [], 0
        batch.append(path)
        size += nbytes
    if batch:
        yield batch


def _failed_path(error: BaseException, batch: list):
    """The file of `batch` that `error` (raised by load_many) names, or None."""
    for name in (getattr(error, "path", None), getattr(error, "filename", None)):
        if name is not None and os.fspath(name) in batch:
            return os.fspath(name)
    return None


def _check_data(report: _Report, threads, max_header_size: int, quiet: bool) -> None:
    """Read every good file fully, a bounded batch at a time; a file that fails is moved to `report.bad`."""
    from .loading import load, load_many

    good = [path for path in report.files if path in report.headers]
    bar = _progress(sum(report.headers[p].nbytes for p in good), "B", "data", quiet)
    try:
        for batch in _batches(good, report.headers):
            pending = list(batch)
            while pending:
                try:
                    # the arrays die at once
                    load_many(pending, mode="read", threads=threads, max_header_size=max_header_size)
                    done = pending
                    pending = []
                except Exception as e:  # noqa: BLE001 - as in _check_headers
                    culprit = _failed_path(e, pending)
                    if culprit is None:  # cannot tell which file: check them one by one
                        for path in pending:
                            try:
                                load(path, mode="read", threads=threads, max_header_size=max_header_size)
                            except Exception as e1:  # noqa: BLE001
                                _mark_bad(report, path, e1)
                        done, pending = pending, []
                    else:
                        _mark_bad(report, culprit, e)
                        done = [culprit]
                        pending = [p for p in pending if p != culprit]
                if bar is not None:
                    bar.update(sum(report.headers[p].nbytes for p in done if p in report.headers))
    finally:
        if bar is not None:
            bar.close()


def _mark_bad(report: _Report, path: str, error: BaseException) -> None:
    report.bad[path] = _describe(error)
    report.headers.pop(path, None)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _dtype_label(dtype) -> str:
    text = dtype.str if dtype.names is None else str(dtype)
    return text if len(text) <= 60 else text[:57] + "..."


def _print_counts(title: str, counts: Counter, limit: int = 10) -> None:
    print(title)
    items = counts.most_common()
    width = max(len(label) for label, _ in items[:limit])
    for label, n in items[:limit]:
        print(f"  {label:<{width}}  {_plural(n, 'file')}")
    if len(items) > limit:
        print(f"  ... and {len(items) - limit} more")


def _print_summary(report: _Report, data: bool, quiet: bool) -> None:
    ok = [p for p in report.files if p in report.headers]
    what = "headers, dtypes, sizes and data" if data else "headers, dtypes and sizes"
    word = ".npy/.npz file" if any(os.fspath(p).endswith(".npz") for p in report.files) else ".npy file"
    print(f"Checked {_plural(len(report.files), word)} ({what}): {len(ok)} ok, {len(report.bad)} bad")
    if ok:
        headers = [report.headers[p] for p in ok]
        print(f"Array data in the good files: {_human_bytes(sum(h.nbytes for h in headers))} "
              f"({_human_bytes(sum(h.file_size for h in headers))} on disk)")
        if not quiet:
            _print_counts("dtypes:", Counter(_dtype_label(h.dtype) for h in headers))
            _print_counts("shapes (most common first):", Counter(str(h.shape) for h in headers))
            longer = [p for p in ok if report.headers[p].file_size > report.headers[p].data_offset
                      + report.headers[p].nbytes and not os.fspath(p).endswith(".npz")]
            if longer:
                print(f"Note: {_plural(len(longer), 'file')} hold bytes after their array data "
                      "(np.load ignores them too), e.g. " + display_path(longer[0]))
    if report.bad:
        print("Bad files:")
        for path in sorted(report.bad):
            print(f"  {display_path(path)}: {report.bad[path]}")


def _scan_index(args) -> int:
    from .index_check import check_index

    if len(args.paths) != 2 or args.window is None or args.data:
        print("npyfeed scan: --index takes two paths, FACTOR_DIR LABEL_DIR, and --window W (and no --data)",
              file=sys.stderr)
        return 2
    try:
        report = check_index(args.index, args.paths[0], args.paths[1], args.window, bounds=args.bounds,
                             missing=args.missing, max_header_size=args.max_header_size, threads=args.threads,
                             limit=args.limit)
    except (OSError, ValueError) as e:
        print(f"npyfeed scan: {_error_text(e)}", file=sys.stderr)
        return 1
    print(report.format())
    return 0 if report.ok else 1


def _scan(args) -> int:
    if args.index is not None:
        return _scan_index(args)
    report = _Report()
    report.files = find_npy_files(args.paths, report)
    if report.files:
        threads = args.threads or min(64, 4 * resolve_threads(None))
        _check_headers(report, report.files, threads, args.max_header_size, args.quiet)
        if args.data:
            _check_data(report, args.threads, args.max_header_size, args.quiet)
    # Paths that were not found count as checked (and bad).
    report.files += [p for p in report.bad if p not in report.files]
    if not report.files:
        print("No .npy files found under: " + " ".join(display_path(p) for p in args.paths))
        return 1
    _print_summary(report, args.data, args.quiet)
    return 1 if report.bad else 0
