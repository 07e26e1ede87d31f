"""Checking index files against their data before a long job: every problem at once, each named by index file
and line (or by file, for a problem of a data file).

The index is parsed by the core's parser (malformed lines are listed instead of stopping it) and the data files'
headers are read by the core's header reader; the lines are checked with vectorised numpy over the parsed index
columns, a few passes over 12 bytes per line (and one sort, for duplicates), never Python per line.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from . import _core
from ._resources import MAX_HEADER_SIZE, resolve_threads
from ._window_inputs import BOUNDS, MISSING, index_paths, key_files
from .loading import _fspath, _native

__all__ = ["check_index", "IndexReport", "IndexProblem", "PROBLEMS"]

#: Every kind of problem, with what it means. ``duplicate`` and ``dtype`` are warnings; ``window``,
#: ``label_row`` and ``no_file`` are warnings where the source would accept them (``bounds="skip"`` or
#: ``"pad"``, ``missing="skip"``); all others are errors.
PROBLEMS = {
    "index_file": "an index file that cannot be read, or is not text",
    "malformed": "a line that is not 'feature_index,label_index,key' (a header line, a missing or extra field)",
    "empty": "no line left to check",
    "folder": "factor_dir or label_dir does not exist",
    "no_file": "a key without its factor or label file (<key>.npy, nor <key>.npz)",
    "bad_file": "a data file that cannot be read as a window source (corrupt, a dtype that is not a number, 0-d)",
    "row_shape": "a data file whose rows differ in shape from most files'",
    "row_count": "a key whose factor and label files hold different numbers of rows",
    "window": "a line whose window [feature_index - W + 1, feature_index] is outside its factor file",
    "label_row": "a line whose label_index is outside its label file",
    "duplicate": "a line that repeats an earlier line (same key, feature_index and label_index)",
    "dtype": "a data file whose dtype differs from most files' (a float64 among float32 ones)",
}

#: Lines checked per vectorised step (bounds the temporaries to a few hundred MB at any index size).
_CHUNK = 1 << 23
_INT32_MIN = np.iinfo(np.int32).min


@dataclass(frozen=True)
class IndexProblem:
    """One problem: its `severity` (``"error"`` or ``"warning"``), `kind` (a key of `PROBLEMS`), `where` (an
    index file and line, ``path:line``, or a file or folder) and a `message`."""

    severity: str
    kind: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class IndexReport:
    """What `check_index` found: the `problems` listed (at most `limit` of each kind, in the order of `PROBLEMS`,
    then by place), `counts` (kind -> how many in all, listed or not), and what was checked."""

    index_files: list
    factor_dir: str
    label_dir: str
    window: int
    lines: int = 0
    keys: int = 0
    problems: list = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    severities: dict = field(default_factory=dict)  # kind -> "error" or "warning"

    @property
    def errors(self) -> list:
        """The problems listed that are errors."""
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list:
        """The problems listed that are warnings."""
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        """True when there is no error (warnings allowed)."""
        return not any(s == "error" for k, s in self.severities.items() if self.counts.get(k))

    def count(self, severity: str) -> int:
        """How many problems of `severity` in all."""
        return sum(n for k, n in self.counts.items() if self.severities[k] == severity)

    def format(self) -> str:
        """The report as text: a summary line, then per kind its count and the problems listed."""
        out = [f"Checked {len(self.index_files)} index file{'s' if len(self.index_files) != 1 else ''} "
               f"({self.lines} lines, {self.keys} keys) against {self.factor_dir} and {self.label_dir}, "
               f"window {self.window}: {self.count('error')} errors, {self.count('warning')} warnings"]
        for kind in PROBLEMS:
            n = self.counts.get(kind, 0)
            if not n:
                continue
            listed = [p for p in self.problems if p.kind == kind]
            out.append(f"{self.severities[kind]}: {n} x {kind}: {PROBLEMS[kind]}")
            out += [f"  {p}" for p in listed]
            if n > len(listed):
                out.append(f"  ... and {n - len(listed)} more")
        return "\n".join(out)


def check_index(index_files, factor_dir, label_dir, window: int, *, bounds: str = "error",
                missing: str = "error", member: str | None = None, max_header_size: int = MAX_HEADER_SIZE,
                threads: int | None = None, limit: int = 20) -> IndexReport:
    """Check index files against their factor and label files, as a `WindowSource` would open them, and report
    every problem at once instead of the first.

    Checks: lines that are not ``feature_index,label_index,key`` (a header line); keys without a factor or label
    file; data files that cannot be read (header, dtype); rows of differing shapes; keys whose factor and label
    files hold different numbers of rows; windows and label rows outside their files; duplicate lines
    (warning); files of a dtype other than most files' (warning). It reads the headers, never the data
    (``npyfeed scan --data`` reads every byte).

    Parameters
    ----------
    index_files : str, os.PathLike or sequence of them
    factor_dir, label_dir : str or os.PathLike
    window : int
        Rows per sample, W.
    bounds : {"error", "skip", "pad"}
        As for `WindowSource`: with ``"skip"`` or ``"pad"``, lines outside their files are warnings.
    missing : {"error", "skip"}
        As for `WindowSource`: with ``"skip"``, keys without files are warnings.
    member : str, optional
        For ``<key>.npz`` files: the member to read (default: the archive must hold one array).
    max_header_size : int
        Largest `.npy` header accepted.
    threads : int, optional
        Threads for the parse and the header reads (default as `WindowSource`'s).
    limit : int
        Most problems listed per kind (all are counted, in `IndexReport.counts`).

    Returns
    -------
    IndexReport
        ``report.ok`` is False when there is an error; ``print(report.format())`` shows it all.

    Raises
    ------
    ValueError, TypeError
        Bad arguments (a `window` below 1, a `bounds` or `missing` not among the choices).

    Examples
    --------
    >>> report = npyfeed.check_index(["day1.idx", "day2.idx"], "factors", "labels", 100)  # doctest: +SKIP
    >>> report.ok, report.counts  # doctest: +SKIP
    (False, {'malformed': 2, 'no_file': 1})
    """
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    if bounds not in BOUNDS:
        raise ValueError(f"bounds must be one of {BOUNDS}, got {bounds!r}")
    if missing not in MISSING:
        raise ValueError(f"missing must be one of {MISSING}, got {missing!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    window = int(window)
    threads = resolve_threads(threads)
    paths = index_paths(index_files)
    factor_dir, label_dir = _fspath(factor_dir), _fspath(label_dir)
    report = IndexReport(paths, factor_dir, label_dir, window)
    check = _Checker(report, limit, bounds, missing)

    readable = []
    for path in paths:
        if os.path.isfile(path):
            readable.append(path)
        else:
            check.add("index_file", path, "no such file" if not os.path.exists(path) else "not a regular file")
    if not readable:
        return check.done()
    # Malformed lines are listed up to `limit`; files left out whole (line 0) always.
    index, listed, total = _core.check_index_files([_native(p) for p in readable], threads, limit)
    for path, line, why in listed:
        check.add("malformed" if line else "index_file", f"{path}:{line}" if line else path, why, count=not line)
    check.counts["malformed"] = total - sum(1 for _, line, _ in listed if not line)
    keys = index.keys
    report.lines, report.keys = len(index), len(keys)
    if len(index) == 0:
        check.add("empty", ", ".join(paths), "no sample line in the index files")
        return check.done()

    folders_ok = True
    for what, folder in (("factor_dir", factor_dir), ("label_dir", label_dir)):
        if not os.path.isdir(folder):
            check.add("folder", folder, f"{what} does not exist" if not os.path.exists(folder) else
                      f"{what} is not a folder")
            folders_ok = False
    if not folders_ok:
        return check.done()

    feature, label, key, wide_feature, wide_label = index.columns()
    factors = _headers(key_files(factor_dir, keys), member, max_header_size, threads)
    labels = _headers(key_files(label_dir, keys), member, max_header_size, threads)
    first_line = _first_lines(key, len(keys))
    lines_per_key = np.bincount(key, minlength=len(keys))
    usable = check.files(index, keys, factors, labels, first_line, lines_per_key)
    check.lines(index, keys, feature, label, key, wide_feature, wide_label, window, factors, labels, usable)
    check.duplicates(index, keys, feature, label, key, wide_feature, wide_label)
    return check.done()


# -- the data files ------------------------------------------------------------------------------------------
def _header(path: str, member, max_header_size: int):
    """(path read, shape, dtype, fortran_order) of `path`, else of ``<key>.npz`` beside it; None when neither
    exists; an exception for a file that cannot be read."""
    try:
        h = _core.read_header(_native(path), max_header_size)
        return path, tuple(h["shape"]), h["dtype"], h["fortran_order"]
    except FileNotFoundError:
        pass
    npz = path[:-4] + ".npz"
    try:
        members = _core.read_npz_headers(_native(npz), max_header_size)
    except FileNotFoundError:
        return None
    names = [m[0] for m in members]
    if member is None and len(members) != 1:
        raise ValueError(f"the archive holds {len(members)} arrays; name the one to read (member=)")
    if member is not None and member not in names:
        raise ValueError(f"the archive has no member {member!r}")
    h = members[0 if member is None else names.index(member)][1]
    return npz, tuple(h["shape"]), h["dtype"], h["fortran_order"]


def _headers(paths: list, member, max_header_size: int, threads: int) -> list:
    """Per path: `_header`'s tuple, None (no file) or the exception (read in parallel: the core releases the GIL)."""
    def some(part):
        out = []
        for path in part:
            try:
                out.append(_header(path, member, max_header_size))
            except Exception as e:  # noqa: BLE001 - reported as the file's problem
                out.append(e)
        return out

    parts = [paths[i:i + 64] for i in range(0, len(paths), 64)]  # a task per 64 files, not per file
    with ThreadPoolExecutor(max_workers=min(64, 4 * threads)) as pool:
        return [h for part in pool.map(some, parts) for h in part]


def _convertible(dtype) -> bool:
    """What the gather converts to float: bool, integers, float16/32/64 (no structured, complex or object)."""
    return dtype.names is None and (dtype.kind in "biu" or (dtype.kind == "f" and dtype.itemsize <= 8))


def _first_lines(key: np.ndarray, nkeys: int) -> np.ndarray:
    """The first sample of each key: keys are numbered in order of first appearance, so key k first appears
    where the running maximum of the key column reaches k."""
    if nkeys == 0:
        return np.zeros(0, np.int64)
    seen = np.maximum.accumulate(key)
    return np.searchsorted(seen, np.arange(nkeys, dtype=seen.dtype))


class _Checker:
    def __init__(self, report: IndexReport, limit: int, bounds: str, missing: str):
        self.report, self.limit = report, limit
        self.counts = report.counts
        self.severities = report.severities
        for kind in PROBLEMS:
            self.severities[kind] = "warning" if kind in ("duplicate", "dtype") else "error"
        if bounds != "error":
            self.severities["window"] = self.severities["label_row"] = "warning"
        if missing == "skip":
            self.severities["no_file"] = "warning"

    def add(self, kind: str, where: str, message: str, count: bool = True) -> None:
        if count:
            self.counts[kind] = self.counts.get(kind, 0) + 1
        if sum(1 for p in self.report.problems if p.kind == kind) < self.limit:
            self.report.problems.append(IndexProblem(self.severities[kind], kind, where, message))

    def done(self) -> IndexReport:
        order = {kind: i for i, kind in enumerate(PROBLEMS)}
        self.report.problems.sort(key=lambda p: order[p.kind])  # stable: each kind keeps its own order
        for kind in [k for k, n in self.counts.items() if not n]:
            del self.counts[kind]
        return self.report

    def files(self, index, keys, factors, labels, first_line, lines_per_key) -> np.ndarray:
        """Per-key and per-file problems; the keys whose two files can be read (a bool per key)."""
        usable = np.ones(len(keys), bool)
        for side, found, folder in (("factor", factors, self.report.factor_dir),
                                    ("label", labels, self.report.label_dir)):
            for k, h in enumerate(found):
                path = os.path.join(folder, keys[k] + ".npy")
                if h is None:
                    usable[k] = False
                    self.add("no_file", path, f"key {keys[k]!r} has no {side} file (nor {keys[k]}.npz); its "
                             f"{lines_per_key[k]} lines start at {index.where(int(first_line[k]))}")
                elif isinstance(h, BaseException):
                    usable[k] = False
                    self.add("bad_file", getattr(h, "filename", None) or path, _reason(h))
                else:
                    name, shape, dtype, fortran = h
                    why = None
                    if not _convertible(dtype):
                        why = f"dtype {dtype} cannot be converted to float (bool, integer and float16/32/64 can)"
                    elif not shape:
                        why = "a 0-d array has no rows"
                    elif fortran and len(shape) > 2:
                        why = "Fortran-order arrays with more than 2 dimensions are not supported for windows"
                    if why:
                        usable[k] = False
                        self.add("bad_file", name, why)
        for found in (factors, labels):
            good = [(k, h) for k, h in enumerate(found) if usable[k]]
            self._most_common(good, lambda h: h[1][1:], "row_shape", lambda h, c: (
                f"rows of shape {h[1][1:]}, unlike {c[1]} of {c[0]} files (the first: {c[2]})"))
            self._most_common(good, lambda h: h[2], "dtype", lambda h, c: (
                f"{h[2]} among {c[0]} files of {c[1]} (the first: {c[2]})"))
        for k in np.flatnonzero(usable):
            f, lab = factors[k], labels[k]
            if f[1][0] != lab[1][0]:
                self.add("row_count", lab[0], f"{lab[1][0]} rows, but {f[0]} has {f[1][0]} (key {keys[k]!r})")
        return usable

    def _most_common(self, good, value, kind, message) -> None:
        """Files whose `value` differs from the most common one (ties: the first key's)."""
        counts: dict = {}
        for _, h in good:
            counts.setdefault(value(h), []).append(h[0])
        if len(counts) < 2:
            return
        common = max(counts, key=lambda v: len(counts[v]))
        for _, h in good:
            if value(h) != common:
                self.add(kind, h[0], message(h, (len(counts[common]), common, counts[common][0])))

    def lines(self, index, keys, feature, label, key, wide_feature, wide_label, window, factors, labels,
              usable) -> None:
        """Windows and label rows outside their files, a chunk of lines at a time."""
        rows = np.array([factors[k][1][0] if usable[k] else -1 for k in range(len(keys))], np.int64)
        label_rows = np.array([labels[k][1][0] if usable[k] else -1 for k in range(len(keys))], np.int64)
        found: dict = {"window": [], "label_row": []}
        for begin in range(0, len(key), _CHUNK):
            end = min(begin + _CHUNK, len(key))
            k = key[begin:end]
            t, lt = rows[k], label_rows[k]
            ok = t >= 0  # lines of keys whose files are missing or bad are counted there
            f, lab = feature[begin:end], label[begin:end]
            bad = {"window": ok & ((f < window - 1) | (f >= t)), "label_row": ok & ((lab < 0) | (lab >= lt))}
            # Values beyond int32 (INT32_MIN in the column) are in a short side table: check them there.
            for kind, wide, limits in (("window", wide_feature, t), ("label_row", wide_label, lt)):
                inside = (wide[:, 0] >= begin) & (wide[:, 0] < end)
                at, value = wide[inside, 0] - begin, wide[inside, 1]
                low = window - 1 if kind == "window" else 0
                bad[kind][at] = ok[at] & ((value < low) | (value >= limits[at]))
            for kind, mask in bad.items():
                at = np.flatnonzero(mask)
                self.counts[kind] = self.counts.get(kind, 0) + len(at)
                found[kind].extend((at[:self.limit] + begin).tolist())
        wide_values = {"window": dict(wide_feature.tolist()), "label_row": dict(wide_label.tolist())}
        for kind in ("window", "label_row"):
            for i in found[kind][:self.limit]:
                k = int(key[i])
                f = wide_values["window"].get(i, int(feature[i]))
                lab = wide_values["label_row"].get(i, int(label[i]))
                if kind == "window":
                    what = (f"window rows [{f - window + 1}, {f + 1}) outside {factors[k][0]} "
                            f"({factors[k][1][0]} rows)")
                else:
                    what = f"label row {lab} outside {labels[k][0]} ({labels[k][1][0]} rows)"
                self.add(kind, index.where(i), f"key {keys[k]!r}: {what}", count=False)

    def duplicates(self, index, keys, feature, label, key, wide_feature, wide_label) -> None:
        """Lines repeating an earlier line. (key, feature_index, label_index) is packed into one uint64 where the
        ranges fit, sorted and compared with its neighbours; else the three columns are sorted (lexsort)."""
        narrow = np.ones(len(key), bool)  # lines with a value beyond int32 (reported as outside) are left out
        narrow[wide_feature[:, 0]] = False
        narrow[wide_label[:, 0]] = False
        positions = np.flatnonzero(narrow) if not narrow.all() else None
        take = (lambda c: c) if positions is None else (lambda c: c[positions])
        if positions is not None and not len(positions):
            return
        ks, fs, ls = take(key), take(feature), take(label)
        bits = [max(int(len(keys) - 1).bit_length(), 1)]
        lows = []
        for column in (fs, ls):
            low, high = int(column.min()), int(column.max())
            lows.append(low)
            bits.append(max((high - low).bit_length(), 1))
        if sum(bits) <= 64:
            packed = np.empty(len(ks), np.uint64)
            for b in range(0, len(ks), _CHUNK):
                s = slice(b, b + _CHUNK)
                p = ks[s].astype(np.uint64) << np.uint64(bits[1] + bits[2])
                p |= (fs[s].astype(np.int64) - lows[0]).astype(np.uint64) << np.uint64(bits[2])
                p |= (ls[s].astype(np.int64) - lows[1]).astype(np.uint64)
                packed[s] = p
            ordered = np.sort(packed)
            same = ordered[1:] == ordered[:-1]
            repeats = int(np.count_nonzero(same))
            if not repeats:
                return
            # The lines of the first `limit` repeated values, in index order: the first of each is the original.
            repeated = ordered[1:][same]  # sorted: its distinct values start where it changes
            shown = repeated[np.flatnonzero(np.r_[True, repeated[1:] != repeated[:-1]])[:self.limit]]
            at = np.flatnonzero(np.isin(packed, shown))
            pairs, first = [], {}
            for j, value in zip(at.tolist(), packed[at].tolist()):
                if value in first:
                    pairs.append((first[value], j))
                else:
                    first[value] = j
        else:
            order = np.lexsort((ls, fs, ks))
            same = (ks[order[1:]] == ks[order[:-1]]) & (fs[order[1:]] == fs[order[:-1]]) & (ls[order[1:]] ==
                                                                                               ls[order[:-1]])
            repeats = int(np.count_nonzero(same))
            if not repeats:
                return
            at = np.flatnonzero(same)[:self.limit]
            pairs = list(zip(order[at].tolist(), order[at + 1].tolist()))  # lexsort is stable: earlier line first
        self.counts["duplicate"] = repeats
        for a, b in sorted(pairs, key=lambda p: p[1])[:self.limit]:
            if positions is not None:
                a, b = int(positions[a]), int(positions[b])
            self.add("duplicate", index.where(b), f"the same line as {index.where(a)} (key {keys[int(key[b])]!r}, "
                     f"feature_index {int(feature[b])}, label_index {int(label[b])})", count=False)


def _reason(error: BaseException) -> str:
    if isinstance(error, _core.NpyFormatError):
        return f"NpyFormatError: {error.reason} (at byte {error.offset})"
    if isinstance(error, OSError) and error.strerror:
        return f"{type(error).__name__}: {error.strerror}"
    return f"{type(error).__name__}: {error}"
