"""Window samples: an index of (feature_index, label_index, key) lines over per-key factor and label arrays.

Sample ``i`` is ``factor[key][feature_index - W + 1 : feature_index + 1]`` (W rows) and
``label[key][label_index]``, converted to ``dtype``. Batches are gathered in C++ (GIL released) into one
contiguous, 64-byte-aligned buffer per batch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from . import _checks, _core
from . import stats as _stats
from ._resources import MAX_HEADER_SIZE, default_npz_memory_limit, resolve_placement, thread_choice
from ._source_warnings import SourceWarnings
from ._transform import transform_spec
from ._window_inputs import (
    BOUNDS,
    MISSING,
    check_common,
    check_folders,
    check_keys,
    dense_keys,
    dtype_name,
    files_read,
    key_arrays,
    key_files,
    load_index,
    open_index,
)
from .loading import _native, _resolve_mode
from .plan import DEFAULT_MEMORY_BUDGET, BatchIterator, Plan, shuffle_kind

log = logging.getLogger("npyfeed")

__all__ = ["WindowSource", "BatchIterator", "BOUNDS", "SampleLocation"]


class SampleLocation(NamedTuple):
    """`WindowSource.locate`'s answer, one entry per sample: ``key`` (uint32), ``feature_index``, ``label_index``."""

    key: np.ndarray
    feature_index: np.ndarray
    label_index: np.ndarray


class WindowSource:
    """Window samples over per-key `.npy` files (or arrays), gathered in C++.

    Parameters
    ----------
    index_files : str, os.PathLike or sequence of them
        Text files of ``feature_index,label_index,key`` lines (blank lines and spaces are tolerated). A glob
        pattern (``"/data/index/train_*.txt"``) stands for the files it matches, in sorted order (a path that
        exists is taken as it is); a pattern that matches no file raises ``FileNotFoundError`` naming it.
    factor_dir, label_dir : str or os.PathLike
        Key ``k`` reads ``<factor_dir>/<k>.npy`` (shape ``(T, F...)``) and ``<label_dir>/<k>.npy``
        (shape ``(T_label, L...)``), or, where there is no such file, ``<k>.npz`` beside it: an archive holding
        one array, or the member named by `member`. A sample is ``x`` of shape ``x_shape = (W, F...)`` and
        ``y`` of shape ``y_shape``, a label row's shape as ``np.load`` gives it: ``(L...)``, and ``()`` for label
        files of shape ``(T_label,)``, whose labels are scalars (batches' ``y`` then has shape ``(B,)``;
        ``label_columns=[0]`` makes it ``(B, 1)``). Every key's rows must have the same shape.
    window : int
        Rows per sample, W.
    mode : {"auto", "mmap", "read", "direct"}
        How the gather reads the files. ``"auto"`` (the default) is ``"mmap"`` here (for whole-file loads it
        is ``"read"``): zero-copy from the page cache, which all processes on the machine share. ``"read"``
        and ``"direct"`` read only the rows a batch needs.
    threads : int, optional
        Gather threads. Default: ``NPYFEED_THREADS``, else one per CPU of `cpus`, else this process's share of
        the CPUs it may use (``os.sched_getaffinity``): where the launcher says how many processes share the
        node (``LOCAL_WORLD_SIZE``, ``SLURM_NTASKS_PER_NODE``, ``OMPI_COMM_WORLD_LOCAL_SIZE``) and has not
        pinned each to a slice of its own, those CPUs divided by that number (at least 1). ``describe()`` says
        what was chosen and why. With
        ``mode="direct"`` each thread keeps 4 reads in flight (4 x `threads` pool workers), since O_DIRECT
        workers mostly wait for the device. Where the files are not in the page cache (and always in mode
        ``"direct"``), the open reads their headers at least 16 at a time, whatever ``threads``: each waits
        for the device, which answers many at once.
    dtype : {"float32", "float64"}
        Output element type; sources of any bool/int/float16/32/64 type are converted on the way.
    bounds : {"error", "skip", "pad"}
        Windows starting before row 0 or ending past the last row, and label rows outside the label array:
        raise ``IndexError`` naming file, line, key and rows (default), drop them (see `skipped`), or read
        the missing rows as zeros.
    missing : {"error", "skip"}
        Keys whose factor or label file is missing (neither ``<k>.npy`` nor ``<k>.npz``): raise
        ``FileNotFoundError`` listing the first few (default), or leave them out with all their samples and log
        one warning (``npyfeed`` logger) counting them (see `missing_keys`); a data set refreshed overnight
        that lost a stock then still trains. A `factor_dir` or `label_dir` that does not exist is an error
        either way, and so is a source left with no key.
    max_header_size : int
        Largest `.npy` header accepted.
    cpus : iterable of int, optional
        CPUs this source's gather threads run on (their affinity; default ``threads`` is then one per CPU),
        e.g. a slice of the cores this trainer was given, away from the ones TensorFlow's threads use. Only
        npyfeed's own pool threads for this placement are placed; the caller's threads, and the threads of
        sources with another placement, are never changed. Default: wherever the starting thread may run.
    nice : int, optional
        Niceness of those threads, -20 to 19 (lower than the process's needs privileges).
    io_priority : {"idle", "best-effort", "realtime"} or (class, level), optional
        Linux IO priority of those threads (see `npyfeed.load_many`).
    cache : bool
        Compile the index files once into a binary cache file (12 bytes per sample) that every later open, in
        any process, maps read-only: the page cache then holds one copy per node, and opening takes no parse.
        An entry is keyed by the index files' path, size, mtime and inode; a stale or corrupt one is rebuilt.
        ``False`` parses the files into this process's memory (still 12 bytes per sample).
    cache_dir : str or os.PathLike, optional
        Where the cache lives: default ``$NPYFEED_CACHE_DIR``, else ``$XDG_CACHE_HOME/npyfeed``, else
        ``~/.cache/npyfeed``. A folder that cannot be written gives a warning (``npyfeed`` logger) and the index
        is kept in memory.
    member : str, optional
        For `.npz` sources: the member to read (default: the archive must hold exactly one array).
    npz_memory_limit : int, optional
        `.npz` members are inflated (deflated members) or copied (stored members not viewed in place:
        misaligned, or ``mode`` other than ``"mmap"``) once, at construction, and held in memory for the
        source's life. This caps their total size in bytes (default: half the memory available, as
        ``MemAvailable`` or a cgroup's limit gives it); going over
        raises ``ValueError`` naming the file.
    features : sequence of int or slice, optional
        The factor columns to read (the last axis of ``(T, F)`` files; of the flattened row for N-d rows), in
        any order, repeats allowed, negative values counting from the end: ``x_shape`` becomes
        ``(W, len(features))`` and ``x[b, w] == factor[t][features]``. Only those columns are copied (and read,
        from Fortran-order files). Default: every column, rows as stored.
    label_columns : sequence of int or slice, optional
        The same for the label rows: ``y_shape`` becomes ``(len(label_columns),)``.
    nan, posinf, neginf : float, optional
        Replace NaN, +inf and -inf in the output (factor and label rows alike), in the same pass, exactly as
        ``np.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf)`` does on the converted (`dtype`) output;
        a value converts to `dtype` first. ``None`` (the default) keeps them.
    normalize : (mean, std), optional
        Standardise the factor rows: ``(x - mean) / std`` computed in `dtype` (`mean` and `std` are converted
        to it first), after the replacement; as ``(x - mean) * (1 / std)``, within an ulp or two of numpy's
        division (a std whose reciprocal would be subnormal is divided by). Each is one value per selected feature,
        shape ``(len(features),)`` (or any shape numpy broadcasts to the output row, a scalar included); `mean` must
        be finite and `std` positive and finite in `dtype`. Labels are never normalised (a loss usually wants
        them in their own units; scale them with the model's output). Rows that ``bounds="pad"`` adds
        outside an array stay zeros.

    Raises
    ------
    FileNotFoundError
        A `factor_dir` or `label_dir` that does not exist (naming it); with ``missing="error"``, keys whose
        factor or label file is missing (the first few are listed).
    ValueError
        A malformed index line (file and line named), files whose row shapes differ, bad arguments (`cpus`
        this process cannot use among them; a column of `features` or `label_columns` out of range; a `mean`
        or `std` of the wrong shape or dtype, a std that is not positive and finite), each naming the
        argument and the value.
    TypeError
        A `features` or `label_columns` that is not a sequence of integers or a slice, a replacement that is
        not a float, a `normalize` that is not a pair.
    PermissionError
        A `nice` or `io_priority` that needs privileges this process lacks.
    IndexError
        With ``bounds="error"``, the first sample outside its arrays.
    NpyFormatError, OSError
        A corrupt or unreadable data file.

    Examples
    --------
    A quarter of the factors, NaN as 0, infinities clipped, standardised per feature:

    >>> src = WindowSource("train.idx", "factors", "labels", 100, features=slice(0, 64), nan=0.0,
    ...                    posinf=1e6, neginf=-1e6, normalize=(mean[:64], std[:64]),
    ...                    label_columns=[2])  # doctest: +SKIP
    >>> src.x_shape, src.y_shape  # doctest: +SKIP
    ((100, 64), (1,))
    """

    def __init__(self, index_files, factor_dir, label_dir, window: int, *, mode: str = "auto",
                 threads: int | None = None, dtype="float32", bounds: str = "error", missing: str = "error",
                 max_header_size: int = MAX_HEADER_SIZE, cpus=None, nice: int | None = None, io_priority=None,
                 cache: bool = True, cache_dir=None,
                 member: str | None = None, npz_memory_limit: int | None = None, features=None,
                 label_columns=None, nan: float | None = None, posinf: float | None = None,
                 neginf: float | None = None, normalize=None):
        window, out_dtype = check_common(window, dtype, bounds)
        transform = transform_spec(features, label_columns, nan, posinf, neginf, normalize)
        placement = resolve_placement(cpus, nice, io_priority)
        nthreads, why = thread_choice(threads, placement.get("cpus"))
        index, index_cache, built = load_index(index_files, cache, cache_dir, nthreads)
        factor_dir, label_dir = check_folders(factor_dir, label_dir)  # after the index: its errors come first
        self._open_files(index, factor_dir, label_dir, window, out_dtype, bounds, mode, nthreads, placement,
                         max_header_size, member, npz_memory_limit, transform, missing=missing)
        self._index_cache, self._index_built = index_cache, built
        self._threads_why = why

    def _open_files(self, index, factor_dir, label_dir, window, out_dtype, bounds, mode, nthreads, placement,
                    max_header_size, member, npz_memory_limit, transform, dense=None, missing="error") -> None:
        core_mode = _resolve_mode(mode, auto="mmap")
        if not isinstance(missing, str):
            raise _checks.ArgumentTypeError(f"missing must be one of {MISSING}, got {missing!r}")
        keys = index.keys
        factor_paths, label_paths = key_files(factor_dir, keys), key_files(label_dir, keys)
        core = _core.open_window_files(index, [_native(p) for p in factor_paths], [_native(p) for p in label_paths],
                                       window, dtype_name(out_dtype), bounds, core_mode,
                                       nthreads, max_header_size, **placement, npz_member=member or "",
                                       npz_memory_limit=npz_memory_limit or default_npz_memory_limit(),
                                       transform=transform, dense=dense, missing=missing)
        self._init(core, index, window, out_dtype, core_mode, nthreads, bounds)
        self._member = member
        self._transform = transform
        gone = set(core.missing_keys)
        kept = [k for k in range(len(keys)) if k not in gone]
        self._files = files_read([factor_paths[k] for k in kept] + [label_paths[k] for k in kept])
        if gone:
            names = [keys[k] for k in sorted(gone)]
            log.warning("npyfeed: %d of %d keys have no factor or label file and are left out (missing='skip'), "
                        "with their %d samples: %s%s", len(names), len(keys), core.missing_samples,
                        ", ".join(repr(k) for k in names[:5]), ", ..." if len(names) > 5 else "")
        self._warnings.direct_fallback(self)

    @classmethod
    def dense(cls, factor_dir, label_dir, window: int, *, stride: int = 1, horizon: int = 0, keys=None,
              mode: str = "auto", threads: int | None = None, dtype="float32", missing: str = "error",
              max_header_size: int = MAX_HEADER_SIZE, cpus=None, nice: int | None = None, io_priority=None,
              member: str | None = None,
              npz_memory_limit: int | None = None, features=None, label_columns=None, nan: float | None = None,
              posinf: float | None = None, neginf: float | None = None, normalize=None) -> WindowSource:
        """Every window of every key, without an index file.

        Sample ``j`` of key ``k`` is the window ending at row ``i = W - 1 + j * stride`` of
        ``<factor_dir>/<k>.npy`` (rows ``[i - W + 1, i + 1)``) and row ``i + horizon`` of ``<label_dir>/<k>.npy``
        (``.npz`` beside them as for `WindowSource`); windows whose label row would be past the end of the label
        array are left out, as are rows past the end of the factor array. Samples are numbered key by key, then
        by row, so `epoch_order`, shards, ``shuffle=True`` and ``shuffle="blocks"`` work as for index files. The
        index is one range per key: no memory per sample.

        Parameters
        ----------
        factor_dir, label_dir : str or os.PathLike
        window : int
            Rows per sample, W.
        stride : int
            Rows between the ends of consecutive windows (at least 1).
        horizon : int
            Label row = the window's last row + `horizon` (at least 0): ``horizon=5`` pairs a window with the
            label five rows later.
        keys : sequence of str, optional
            The keys to read, in this order. Default: every ``<k>.npy`` or ``<k>.npz`` in `factor_dir` that has a
            label file in `label_dir`, sorted by name.
        mode, threads, dtype, missing, max_header_size, cpus, nice, io_priority, member, npz_memory_limit
            As for `WindowSource` (there is no `bounds`: every window lies inside its arrays; `missing` matters
            only for `keys` given).
        features, label_columns, nan, posinf, neginf, normalize
            As for `WindowSource`.

        Raises
        ------
        ValueError
            A `stride` below 1 or a `horizon` below 0 (naming the value), no key found, a key that cannot name a
            file or is given twice, no window that fits; the errors of `WindowSource`.
        TypeError
            A `stride`, `horizon` or `keys` of the wrong type.

        Examples
        --------
        >>> src = WindowSource.dense("factors", "labels", 100, stride=5, horizon=1,
        ...                          features=slice(0, 64), nan=0.0)  # doctest: +SKIP
        >>> src.describe(0)  # doctest: +SKIP
        "dense sample 0: key 'k00000', window rows [0, 100) of factors/k00000.npy, label row 100 of ..."
        """
        window, out_dtype = check_common(window, dtype, "error")
        for name, value in (("stride", stride), ("horizon", horizon)):
            if not _checks.is_int(value):
                raise _checks.ArgumentTypeError(f"{name} must be an integer, got {value!r}")
        transform = transform_spec(features, label_columns, nan, posinf, neginf, normalize)
        placement = resolve_placement(cpus, nice, io_priority)
        nthreads, why = thread_choice(threads, placement.get("cpus"))
        factor_dir, label_dir = check_folders(factor_dir, label_dir)
        keys = dense_keys(factor_dir, label_dir) if keys is None else check_keys(keys)
        self = cls.__new__(cls)
        self._open_files(_core.dense_index(keys, factor_dir), factor_dir, label_dir, window, out_dtype, "error",
                         mode, nthreads, placement, max_header_size, member, npz_memory_limit, transform,
                         dense=(int(stride), int(horizon)), missing=missing)
        self._threads_why = why
        return self

    @classmethod
    def from_arrays(cls, index, factors: Mapping, labels: Mapping, window: int, *, threads: int | None = None,
                    dtype="float32", bounds: str = "error", cpus=None, nice: int | None = None,
                    io_priority=None, cache: bool = True, cache_dir=None, features=None, label_columns=None,
                    nan: float | None = None, posinf: float | None = None, neginf: float | None = None,
                    normalize=None) -> WindowSource:
        """Window samples over arrays already in memory, e.g. the dict from `load_factor_files`.

        Parameters
        ----------
        index : path(s) of index files, or a sequence of ``(feature_index, label_index, key)`` tuples
        factors, labels : mapping of key -> numpy.ndarray
            Arrays are used in place when C-contiguous (otherwise a contiguous copy is made once).
        window, threads, dtype, bounds, cpus, nice, io_priority
            As for `WindowSource`. There is no `mode`: the arrays are read in place, and the source's
            ``mode`` attribute says ``"memory"``.
        cache, cache_dir
            For index files, as for `WindowSource` (a list of tuples is never cached).
        features, label_columns, nan, posinf, neginf, normalize
            As for `WindowSource`.

        Examples
        --------
        >>> factors = {"a": np.array([[1.0, np.nan], [np.inf, 4.0], [5.0, 6.0]], dtype=np.float32)}
        >>> labels = {"a": np.arange(6.0).reshape(3, 2)}
        >>> src = WindowSource.from_arrays([(2, 2, "a")], factors, labels, 2, features=[1, 0], nan=0.0,
        ...                                posinf=9.0, label_columns=[1])
        >>> x, y = src.get([0])
        >>> x.tolist(), y.tolist()
        ([[[4.0, 9.0], [6.0, 5.0]]], [[5.0]])
        """
        window, out_dtype = check_common(window, dtype, bounds)
        transform = transform_spec(features, label_columns, nan, posinf, neginf, normalize)
        placement = resolve_placement(cpus, nice, io_priority)
        nthreads, why = thread_choice(threads, placement.get("cpus"))
        core_index, index_cache, built = open_index(index, cache, cache_dir, nthreads)
        factor_arrays, label_arrays = key_arrays(core_index.keys, factors, labels)
        # The core reads these arrays in place and keeps them alive itself, as long as it needs them.
        core = _core.window_source_from_arrays(core_index, factor_arrays, label_arrays, window,
                                               dtype_name(out_dtype), bounds, nthreads, **placement,
                                               transform=transform)
        self = cls.__new__(cls)
        self._init(core, core_index, window, out_dtype, "memory", nthreads, bounds)
        self._transform = transform
        self._arrays = (factor_arrays, label_arrays)  # already kept alive by the core: no copy
        self._index_cache, self._index_built = index_cache, built
        self._threads_why = why
        return self

    def _init(self, core, index, window, dtype, mode, threads, bounds):
        self._core = core
        _stats.register(self, core.stats)
        self._index = index
        self._files = ()
        self._index_cache = None
        self._index_built = False  # this open compiled the index files (for tests)
        self._warnings = SourceWarnings()
        self._samples_by_key = None  # shuffle="blocks": the samples grouped by key, made by the first such plan
        self._arrays = None  # from_arrays: (factor arrays, label arrays) in key order
        self._member = None
        self._transform = None  # features=, label_columns=, nan=, ..., normalize= as the core takes them
        self.bounds = bounds
        self.window = window
        self.dtype = dtype
        self.mode = mode
        self.threads = threads
        self._threads_why = ""  # what chose `threads` (thread_choice), for describe()

    # -- description ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._core)

    def stats(self) -> dict:
        """Live statistics of every pipeline over this source, added up (each plan's own: `Plan.stats`), as a dict
        of `npyfeed.stats.FIELDS`: batches and samples served, the consumer's wait against the gathers' work,
        read-ahead, blocks read, bytes uploaded to a device. Always counted; reading them costs microseconds.
        `npyfeed.stats.summary` says in one line whether the consumers were input-bound."""
        return _stats.as_dict(self._core.stats.counts())

    @property
    def direct_fallback(self) -> tuple:
        """With ``mode="direct"``: the files whose O_DIRECT reads the filesystem refused (tmpfs before Linux 6.6,
        ramfs, some FUSE), which are read with buffered reads instead; empty when O_DIRECT works. A refusal can
        come at open or at a file's first read: a warning on the ``npyfeed`` logger names the first such file,
        at construction or at the end of the epoch that met it."""
        return tuple(self._core.direct_fallbacks) if self.mode == "direct" else ()

    @property
    def mapping_limit(self) -> int | None:
        """With ``mode="mmap"`` over more files than the process may map at once (half of what
        ``vm.max_map_count`` leaves; ``NPYFEED_MAX_MAPPINGS`` replaces that limit): the most mappings kept,
        files being mapped when read and the least recently used unmapped; halved, once per shortage, when
        the kernel refuses a mapping anyway (the refused reads use pread). ``None`` when every file has its
        own mapping (the usual case)."""
        limit = self._core.mapping_limit if self.mode == "mmap" else 0
        return limit or None

    @property
    def files(self) -> tuple:
        """The factor files, then the label files, one per key in `keys` order (empty for `from_arrays`)."""
        return self._files

    @property
    def index_cache(self) -> str | None:
        """The compiled index cache file this source maps, or None (``cache=False``, a list index, or a cache
        dir that could not be written)."""
        return self._index_cache

    @property
    def keys(self) -> list:
        """Distinct keys, in order of first appearance in the index."""
        return list(self._index.keys)

    @property
    def skipped(self) -> int:
        """Samples dropped by ``bounds="skip"``."""
        return self._core.skipped

    @property
    def missing_keys(self) -> tuple:
        """Keys left out by ``missing="skip"`` (no factor or label file), in `keys` order; their samples are not
        among this source's. Empty when every key has its files."""
        keys = self._index.keys
        return tuple(keys[k] for k in self._core.missing_keys)

    @property
    def x_shape(self) -> tuple:
        """Shape of one sample's features: ``(W, F, ...)``."""
        return tuple(self._core.x_shape)

    @property
    def y_shape(self) -> tuple:
        """Shape of one sample's label, a label row's: ``(L, ...)``, or ``()`` for 1-d label files (scalar labels:
        a batch's ``y`` is ``(B,)``). A model's output size is ``math.prod(y_shape)``, which is 1 for ``()``."""
        return tuple(self._core.y_shape)

    def describe(self, sample: int | None = None) -> str:
        """Where sample `sample` comes from: index file, line, key, feature and label index. Without `sample`,
        the source itself: samples, keys, shapes, mode, the samples and keys left out, and the gather threads
        with the reason for their number (an argument, ``NPYFEED_THREADS``, `cpus`, or this process's share
        of the node's CPUs).

        Raises ``IndexError`` for samples outside ``[0, len(self))``.
        """
        if sample is None:
            return self._summary()
        sample = int(sample)
        if not 0 <= sample < len(self):
            raise IndexError(f"sample {sample} out of range for {len(self)} samples")
        return self._core.describe(sample)

    def _summary(self) -> str:
        keys = len(self._index.keys)
        lines = [f"{len(self)} samples of {keys} keys, x {self.x_shape} y {self.y_shape} {self.dtype}, "
                 f"mode={self.mode!r}"]
        if self.skipped:
            lines.append(f"left out: {self.skipped} samples outside their arrays (bounds='skip')")
        missing = self.missing_keys
        if missing:
            shown = ", ".join(repr(k) for k in missing[:5]) + (", ..." if len(missing) > 5 else "")
            lines.append(f"left out: {len(missing)} of {keys} keys without a file, with their "
                         f"{self._core.missing_samples} samples (missing='skip'): {shown}")
        why = f" ({self._threads_why})" if self._threads_why else ""
        lines.append(f"threads: {self.threads}{why}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"WindowSource({len(self)} samples, {len(self._index.keys)} keys, x {self.x_shape}, y {self.y_shape}, "
                f"{self.dtype}, mode={self.mode!r})")

    # -- access --------------------------------------------------------------------------------------
    def get(self, sample_ids) -> tuple:
        """Gather the given samples: ``x`` of shape ``(B, *x_shape)``, ``y`` of shape ``(B, *y_shape)``.

        Raises ``IndexError`` for ids outside ``[0, len(self))``.
        """
        return self._core.get(_checks.sample_ids(sample_ids))

    def locate(self, sample_ids) -> SampleLocation:
        """Where samples come from, as arrays (what `describe` says of one sample): ``key``, numbers into `keys`;
        ``feature_index`` and ``label_index``, from each sample's index line (dense sources: the window's last
        row and its label row). Raises ``IndexError`` for ids outside ``[0, len(self))``."""
        return SampleLocation(*self._core.sample_fields(_checks.sample_ids(sample_ids)))

    def plan(self, batch_size: int, *, shuffle: bool | str = False, seed: int = 0, num_shards: int = 1,
             shard_index: int = 0, drop_remainder: bool = False, memory_budget: int = DEFAULT_MEMORY_BUDGET,
             prefetch: int = 2, shard_by: str = "samples") -> Plan:
        """The batches of every epoch of one shard, by position: the one owner of "batch b of epoch e".

        Parameters
        ----------
        batch_size : int
        shuffle : bool or "blocks"
            ``False``: the index's order. ``True``: a seeded permutation of all samples per epoch (the same on
            any machine for the same ``seed``, epoch and number of samples); shard ``i`` of ``n`` then takes
            every n-th id starting at ``i``, so shards are disjoint and together cover the epoch exactly once.
            A sample is read where it lies (a random read per sample when the data is not in the page cache).
            ``"blocks"`` (data sets larger than RAM): the keys are permuted and grouped in that order into
            blocks whose factor and label arrays fit in ``memory_budget / 2`` bytes (a key larger than that is
            a block of its own), and the samples are shuffled within each block; the epoch is the blocks one
            after another, each file read once per epoch, whole and in sequence. Shard ``i`` of ``n`` takes a
            contiguous part of it (sizes as for ``shuffle=True``), so each shard reads only about ``1/n`` of the
            files; each shard's part starts a block, and where a shard holds more than one block its first
            three are smaller (1/8, 1/4, 1/2 of a full one), so that its first batch waits for little. The
            same on any machine for the same ``seed``, epoch, ``memory_budget``, ``num_shards`` and data (the
            order depends on the number of shards).
        seed : int
            In ``[0, 2**64)``; ignored without `shuffle`.
        num_shards, shard_index
            This plan's part of each epoch (e.g. one per worker): shard `shard_index` of `num_shards`. The same
            two arguments (and `shard_by`) on every entry point: `batches`, `epoch_order`, `num_batches`,
            ``npyfeed.tf.dataset`` (which also takes a ``tf.distribute.InputContext``), ``npyfeed.keras.PyDataset``
            and ``npyfeed.torch.WindowDataset`` (where ``rank``/``world_size`` are the same thing).
        drop_remainder : bool
            Drop a last, smaller batch.
        shard_by : {"samples", "keys"}
            How an epoch is split between shards. ``"samples"`` (the default): as described under `shuffle`.
            ``"keys"``: each shard is a set of whole keys (with ``shuffle=True`` or ``False``), balanced by sample
            count (shards differ by at most the largest key's samples): keys are assigned largest first, each to
            the shard with the fewest samples so far. A shard's epoch is its own samples, in index order or (with
            ``shuffle=True``) a seeded permutation of them per epoch. Shards are disjoint and together cover every
            sample exactly once per epoch, and each shard reads only its own keys' files, so each of ten processes
            reads (and keeps in its page cache) about a tenth of the data. What it means for training: each step's
            global batch is a sample stratified by shard (unbiased when the shards are balanced by sample count),
            but per-replica statistics (batch norm, cross-sectional losses over a replica's batch) see only that
            shard's keys. Not with ``shuffle="blocks"``.
        memory_budget : int
            With ``shuffle="blocks"``: bytes of array data held at once (two blocks: one consumed while the
            next is read; default ``npyfeed.plan.DEFAULT_MEMORY_BUDGET``, 2 GiB, a constant, since it decides the
            order: keep it fixed to reproduce an epoch). Every entry point (`batches`, `epoch_order`,
            ``npyfeed.tf.dataset`` and the Keras and PyTorch adapters) has the same default, and ``None`` means
            it too, so they all give the same order. Batch buffers, and a key larger than half the budget, come on
            top; so do the samples grouped by key, built by the source's first blocks plan and shared by the later
            ones (nothing per sample where the index lists each key's lines together, else 4 bytes per sample).
        prefetch : int
            Batches gathered ahead of the one asked for (at least 1), by `Plan.take` and `Plan.batches`.

        Returns
        -------
        Plan
            ``len(plan)`` batches per epoch; ``plan.ids(epoch, b)``, ``plan.take(epoch, b)``,
            ``plan.order(epoch)`` and ``plan.batches(epoch)``.

        Raises
        ------
        TypeError
            An argument of the wrong type (the error is also a ``ValueError``).
        ValueError
            A value out of range (``batch_size`` or ``num_shards`` below 1, ``shard_index`` outside
            ``[0, num_shards)``, a ``memory_budget`` below 1, ``shuffle`` other than True, False or "blocks").
        """
        kind = shuffle_kind(shuffle)
        if shard_by not in ("samples", "keys"):
            raise (ValueError if isinstance(shard_by, str) else _checks.ArgumentTypeError)(
                f"shard_by must be 'samples' or 'keys', got {shard_by!r}")
        batch_size = _checks.positive(batch_size, "batch_size")
        num_shards = _checks.positive(num_shards, "num_shards")
        shard_index = _checks.integer(shard_index, "shard_index", 0, num_shards)
        seed = _checks.u64(seed, "seed") if kind != "none" else 0
        prefetch = _checks.positive(prefetch, "prefetch")
        if kind == "blocks":
            memory_budget = _checks.integer(DEFAULT_MEMORY_BUDGET if memory_budget is None else memory_budget,
                                            "memory_budget", 1, what="a positive number of bytes")
        else:
            memory_budget = None
        core = _core.Plan(self._core, kind, seed, num_shards, shard_index, batch_size, bool(drop_remainder),
                          memory_budget or 0, prefetch, self._samples_by_key, shard_by)
        if core.samples_by_key is not None:
            self._samples_by_key = core.samples_by_key  # grouped once per source, shared by its plans
        if kind == "global":
            self._warnings.larger_than_memory(self)  # whatever will read the plan
        return Plan(self, core, batch_size=batch_size, shuffle="blocks" if kind == "blocks" else kind == "global",
                    seed=seed, num_shards=num_shards, shard_index=shard_index, drop_remainder=bool(drop_remainder),
                    memory_budget=memory_budget, prefetch=prefetch, shard_by=shard_by)

    def epoch_order(self, epoch: int = 0, *, shuffle: bool | str = False, seed: int = 0, num_shards: int = 1,
                    shard_index: int = 0, memory_budget: int = DEFAULT_MEMORY_BUDGET,
                    shard_by: str = "samples") -> np.ndarray:
        """Sample ids of one epoch for one shard, in the order `batches` yields them: ``plan(...).order(epoch)``.

        See `plan` for the orders (`shuffle`), shards (`shard_by`) and `memory_budget`.
        """
        plan = self.plan(1, shuffle=shuffle, seed=seed, num_shards=num_shards, shard_index=shard_index,
                         memory_budget=memory_budget, shard_by=shard_by)
        return plan.order(epoch)

    def num_batches(self, batch_size: int, *, num_shards: int = 1, shard_index: int = 0,
                    drop_remainder: bool = False, shard_by: str = "samples") -> int:
        """Batches per epoch for one shard (the same for every order): ``len(plan(...))``."""
        return len(self.plan(batch_size, num_shards=num_shards, shard_index=shard_index,
                             drop_remainder=drop_remainder, shard_by=shard_by))

    def batches(self, batch_size: int, *, shuffle: bool | str = False, seed: int = 0, epoch: int = 0,
                num_shards: int = 1, shard_index: int = 0, drop_remainder: bool = False, prefetch: int = 2,
                start_batch: int = 0, memory_budget: int = DEFAULT_MEMORY_BUDGET,
                shard_by: str = "samples") -> BatchIterator:
        """Iterate over one epoch as ``(x, y)`` numpy batches, gathered ahead in C++:
        ``plan(...).batches(epoch, start_batch=start_batch)``.

        Parameters
        ----------
        batch_size, shuffle, seed, num_shards, shard_index, drop_remainder, memory_budget, prefetch, shard_by
            See `plan`.
        epoch : int
            The epoch, in ``[0, 2**62)``; with `shuffle`, each epoch has its own order.
        start_batch : int
            Resume at this batch of the epoch (a restarted job does not replay data).

        Returns
        -------
        BatchIterator
            Each batch owns its memory; buffers are reused only after every reference to a batch is gone.
        """
        plan = self.plan(batch_size, shuffle=shuffle, seed=seed, num_shards=num_shards, shard_index=shard_index,
                         drop_remainder=drop_remainder, memory_budget=memory_budget, prefetch=prefetch,
                         shard_by=shard_by)
        return plan.batches(epoch, start_batch=start_batch)

