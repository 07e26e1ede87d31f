"""Batches formed on the device (``npyfeed.tf.dataset(gather="device")``): the factor and label arrays a pipeline
reads are uploaded to the device, and each step sends only what its batch needs (start rows: a few integers per
sample) and forms ``(B, W, F...)`` and ``(B, L...)`` there with one gather each.

Layout on the device: one ``(rows + 1, row elements)`` tensor per kind (factors, labels), arrays one after another,
then one zero row that windows read for rows outside their key's array (``bounds="pad"``). Two ways to hold it:

* **resident** (what fits in the device budget): every key of this pipeline (its shard's keys with
  ``shard_by="keys"``), uploaded once at construction; a step's host work is `rows`: the plan's ids of the batch
  (`Plan.ids`, no IO), their (key, feature_index, label_index) from the index, and four int64 vectors.
* **streamed** (``shuffle="blocks"`` over more than the budget): each epoch is cut into *groups* of consecutive
  batches: the batches inside one block of the plan (`Plan.shard_blocks`) share one upload of that block's keys;
  a batch that straddles two blocks is a group of its own whose upload is its windows, taken on the host from
  both blocks' rows (one batch per block). `group` builds a group's upload and start rows on the host; the
  pipeline uploads the next group while the current one is consumed, so each block crosses once per epoch.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import tensorflow as tf

from ._resources import available_memory
from .plan import DEFAULT_MEMORY_BUDGET, shuffle_kind

#: Share of the device's free memory (of the memory available, on the CPU) a pipeline may upload by default.
DEFAULT_BUDGET_SHARE = 0.8

STORAGE_DTYPES = ("float16", "bfloat16", "float32", "float64")

#: Streamed: groups held on the device at once (the one being consumed and the next one, uploading).
GROUPS_HELD = 2
#: In a graph (tf.compat.v1, tf.estimator), resident arrays are constants of the graph, whose protocol buffer
#: holds at most 2 GB: past this many bytes, shuffle="blocks" streams instead (groups flow through the pipeline).
GRAPH_CONSTANT_BYTES = 1 << 30
#: Formed batches the device may hold at once beside the arrays (the pipeline's prefetch, one being formed, one
#: in the model's hands), counted in the budget.
BATCHES_HELD = 4


def device_free_bytes(device: str) -> int | None:
    """Bytes a pipeline may still place on `device` (the default ``device_memory_budget`` is 80% of it); None when
    it cannot be told.

    For the CPU device: the memory available (`npyfeed._resources.available_memory`). For a GPU, the uploads are
    TensorFlow tensors, so they come from TensorFlow's allocator on that GPU, and what it can still hand out is
    counted (`tensorflow_free_bytes`): the memory TensorFlow's pool holds but does not use, plus what it can
    still take from the device. The CUDA runtime's count of the device's free memory (``cudaMemGetInfo``, from
    the runtime TensorFlow's GPU wheel brings) is read without changing the calling thread's current device: it
    is saved and restored around the query (``cudaGetDevice``/``cudaSetDevice``), and not switched at all when
    the GPU is already the current one.
    """
    spec = tf.DeviceSpec.from_string(device)
    if (spec.device_type or "CPU").upper() == "CPU":
        return available_memory()
    allocator = _tensorflow_allocator(int(spec.device_index or 0))
    if allocator is None:
        return None
    ordinal, in_use, growth, limit = allocator
    memory = _cuda_memory(ordinal)
    if memory is None:
        return None
    free, total = memory
    return tensorflow_free_bytes(free, total, in_use, growth, limit)


def tensorflow_free_bytes(cuda_free: int, cuda_total: int, in_use: int, growth: bool, limit: int | None) -> int:
    """What TensorFlow's allocator on a GPU can still hand out, from the device's free and total memory (CUDA's
    count), the bytes TensorFlow's tensors use there (``tf.config.experimental.get_memory_info``'s
    ``"current"``), whether memory growth is on and the logical device's memory limit (None: not set).

    * A memory limit (``tf.config.set_logical_device_configuration``): TensorFlow's pool is that many bytes at
      most, whatever the device has free: ``limit - in_use``.
    * Memory growth on (``set_memory_growth``, ``TF_FORCE_GPU_ALLOW_GROWTH``): TensorFlow takes from the device
      as it needs, so the device's free memory is what is left; what its pool holds unused is not counted
      (an underestimate, on the safe side).
    * TensorFlow's default: one pool of nearly all the memory the device had free when TensorFlow started, taken
      at its first allocation, so ``cudaMemGetInfo`` then reports almost nothing free although the pool is
      mostly unused. The memory neither free nor used by TensorFlow's tensors counts as that pool:
      ``total - in_use`` (the device's free memory, plus the pool's unused part). The same before the pool is
      taken. Over-counted: the few percent TensorFlow leaves to the driver, and the memory of other processes
      on the same GPU, which the 80% share of the default budget is for (pass ``device_memory_budget`` on a
      shared GPU).
    """
    if limit is not None:
        return max(int(limit) - int(in_use), 0)
    if growth:
        return max(int(cuda_free), 0)
    return max(int(cuda_total) - int(in_use), 0)


def _tensorflow_allocator(logical_index: int):
    """For logical GPU `logical_index`: (its CUDA ordinal, bytes TensorFlow's tensors use there, whether memory
    growth is on, its memory limit in bytes or None); None when TensorFlow does not know it."""
    physical = tf.config.list_physical_devices("GPU")  # in CUDA's order: a GPU's index is its CUDA ordinal
    at = 0
    for gpu in tf.config.get_visible_devices("GPU"):  # logical GPUs: the visible ones in order (some virtual)
        ordinal = physical.index(gpu)
        configs = tf.config.get_logical_device_configuration(gpu) or [None]
        if logical_index >= at + len(configs):
            at += len(configs)
            continue
        config = configs[logical_index - at]
        limit_mb = getattr(config, "memory_limit", None)
        try:
            in_use = int(tf.config.experimental.get_memory_info(f"GPU:{logical_index}")["current"])
        except (ValueError, KeyError, RuntimeError):
            in_use = 0  # no allocator there yet: TensorFlow uses nothing
        growth = bool(tf.config.experimental.get_memory_growth(gpu)) or \
            os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH", "").strip().lower() == "true"
        return ordinal, in_use, growth, None if limit_mb is None else int(limit_mb) << 20
    return None


def _cudart():
    for name in ("libcudart.so", "libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _cuda_memory(ordinal: int):
    """(free, total) bytes of CUDA device `ordinal` (``cudaMemGetInfo``), or None. ``cudaMemGetInfo`` reads the
    calling thread's current device: the current device is saved first and restored after, so the caller's
    thread (TensorFlow's, a user's) keeps its device; it is not switched when `ordinal` is already current."""
    cudart = _cudart()
    if cudart is None:
        return None
    current = ctypes.c_int(-1)
    if cudart.cudaGetDevice(ctypes.byref(current)) != 0:
        return None
    switch = current.value != ordinal
    if switch and cudart.cudaSetDevice(ordinal) != 0:
        return None
    try:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
            return None
        return int(free.value), int(total.value)
    finally:
        if switch:
            cudart.cudaSetDevice(current.value)


class DeviceGather:
    """The arrays of `plan`'s keys for `device`, and the two halves of a step: `rows` or `group` (host) and `form`
    (device). `streams` tells which layout (module docstring)."""

    def __init__(self, src, plan, device: str, storage_dtype, budget: int | None):
        if src._transform is not None:
            raise ValueError("gather='device' does not apply features=, label_columns=, nan=, posinf=, neginf= or "
                             "normalize= yet (the device holds the arrays as they are): use gather='host'")
        self.window = src.window
        self.device = device
        self.batch_size = plan.batch_size
        self.out_dtype = tf.as_dtype(np.dtype(src.dtype))
        self.storage = tf.as_dtype(storage_dtype) if storage_dtype is not None else self.out_dtype
        self.x_row_shape, self.y_row_shape = tuple(src.x_shape[1:]), tuple(src.y_shape)
        self.x_elems = int(np.prod(self.x_row_shape, dtype=np.int64))
        self.y_elems = int(np.prod(self.y_row_shape, dtype=np.int64))
        self.sample_bytes = (self.window * self.x_elems + self.y_elems) * self.out_dtype.size  # of a formed batch
        self.pad = src.bounds == "pad"
        self._src = src
        self._plan = plan
        # Every key's rows (factor, label), for the offsets of any layout.
        factor_shapes, label_shapes = src._key_shapes(range(len(src.keys)))
        self.factor_len = np.array([s[0] for s in factor_shapes], np.int64)
        self.label_len = np.array([s[0] if s else 1 for s in label_shapes], np.int64)
        keys = plan._core.shard_keys
        keys = np.arange(len(src.keys)) if keys is None else np.asarray(keys, np.int64)
        needed = self._layout_bytes(keys)
        batch_bytes = self.batch_size * self.sample_bytes
        if budget is None:
            free = device_free_bytes(device)
            if free is None:
                raise ValueError(f"gather='device': cannot tell the free memory of {device}; pass device_memory_budget")
            budget = int(free * DEFAULT_BUDGET_SHARE)
        self.budget = budget
        in_graph = not tf.executing_eagerly()
        resident_limit = min(budget, GRAPH_CONSTANT_BYTES + BATCHES_HELD * batch_bytes) if in_graph else budget
        self.streams = needed + BATCHES_HELD * batch_bytes > resident_limit
        self.host_bytes_per_step = 0  # bytes the last step's host half handed to TensorFlow per batch
        self.uploaded_bytes = 0  # bytes of arrays handed to TensorFlow for the device so far
        self._groups = None  # streamed: (epoch, groups, blocks) of the last epoch asked
        self._host_blocks: list = []  # streamed: ((epoch, block), rows) of the last two blocks read
        if not self.streams:
            self.needed_bytes = needed + BATCHES_HELD * batch_bytes
            self.factor_first, self.label_first = self._first_rows(keys)
            self.y_zero_row = int(self.label_len[keys].sum())
            self.factors = self._upload_resident(keys, False, device)
            self.labels = self._upload_resident(keys, True, device)
            return
        if shuffle_kind(plan.shuffle) != "blocks" and needed + BATCHES_HELD * batch_bytes <= budget:
            raise ValueError(
                f"gather='device' in a graph (tf.compat.v1, tf.estimator) holds its arrays as graph constants, "
                f"at most {GRAPH_CONSTANT_BYTES} bytes, and these are {needed}: use shuffle='blocks' (streamed, no "
                f"constants), shard_by='keys', a smaller storage_dtype, eager execution, or gather='host'")
        if shuffle_kind(plan.shuffle) != "blocks":
            raise ValueError(
                f"gather='device' needs {needed + BATCHES_HELD * batch_bytes} bytes on {device} for the arrays of "
                f"{len(keys)} keys and {BATCHES_HELD} batches, over the device_memory_budget of {budget} bytes; use "
                f"shuffle='blocks' (each block uploaded once per epoch), shard_by='keys' (each process uploads its "
                f"shard's keys only), a smaller storage_dtype (e.g. 'float16'), or gather='host'")
        self.group_bytes, memory_budget = self._largest_group_bytes(plan)
        self.needed_bytes = GROUPS_HELD * self.group_bytes + BATCHES_HELD * batch_bytes
        if self.needed_bytes > budget:
            raise ValueError(
                f"gather='device' with shuffle='blocks' holds {GROUPS_HELD} blocks of up to {self.group_bytes} "
                f"bytes on {device} (memory_budget={memory_budget}: blocks of up to half of it in data bytes) and "
                f"{BATCHES_HELD} batches: {self.needed_bytes} bytes, over the device_memory_budget of {budget} "
                f"bytes; use a smaller memory_budget, a smaller storage_dtype (e.g. 'float16'), or gather='host'")

    def _largest_group_bytes(self, plan) -> tuple:
        """Streamed: (the most device bytes one group takes, the plan's memory budget). A block holds keys whose
        bytes of array data (as the plan counts them) fit in half the memory budget, or one larger key: its
        device bytes are at most that cap times the largest device/data ratio of a key, or the largest key's.
        A straddling batch's group is its windows."""
        itemsize = self.storage.size
        key_bytes = np.maximum(plan._core.key_bytes.astype(np.float64), 1.0)
        device_bytes = (self.factor_len * self.x_elems + self.label_len * self.y_elems) * itemsize
        memory_budget = plan.memory_budget if plan.memory_budget is not None else DEFAULT_MEMORY_BUDGET
        block = max(int(device_bytes.max(initial=0)), int(memory_budget // 2 * (device_bytes / key_bytes).max()))
        block += (self.x_elems + self.y_elems) * itemsize  # the zero rows
        straddler = ((self.batch_size * self.window + 1) * self.x_elems + (self.batch_size + 1) * self.y_elems) * \
            itemsize
        return max(block, straddler), memory_budget

    # -- resident ----------------------------------------------------------------------------------------
    def rows(self, epoch, batch):
        """Host half of a resident step: (x start row, first valid window row, end of valid window rows, label
        row), from the plan's ids of batch `batch` of epoch `epoch`."""
        ids = self._plan._core.ids(int(epoch), int(batch))
        out = self._start_rows(ids, self.factor_first, self.label_first, self.y_zero_row)
        self.host_bytes_per_step = sum(a.nbytes for a in out)
        self._count_batch(ids)
        return out

    def _count_upload(self, nbytes: int) -> None:
        self.uploaded_bytes += nbytes
        self._plan._stats_core().uploaded(nbytes)

    def _count_batch(self, ids) -> None:
        """The plan's statistics count a batch whose start rows the host half made (formed on the device)."""
        self._plan._stats_core().served(len(ids), len(ids) * self.sample_bytes, 0, 0)

    def _start_rows(self, ids, factor_first, label_first, y_zero_row):
        keys, features, labels = self._src._core.sample_fields(ids)
        first = features - (self.window - 1)
        start = factor_first[keys] + first
        lo = np.zeros(len(ids), np.int64)
        hi = np.full(len(ids), self.window, np.int64)
        y = label_first[keys] + labels
        if self.pad:
            lo = np.clip(-first, 0, self.window)
            hi = np.clip(self.factor_len[keys] - first, 0, self.window)
            y = np.where((labels >= 0) & (labels < self.label_len[keys]), y, y_zero_row)
        return start, lo, hi, y

    def _upload_resident(self, keys, label: bool, device: str):
        """The arrays of `keys` one after another as (rows + 1, row elements) in the storage dtype on `device`,
        the last row zeros: read and converted a chunk of keys at a time into one host array, uploaded at once
        (the device holds the arrays once, never a part and the whole)."""
        row_elems = self.y_elems if label else self.x_elems
        rows = self.label_len if label else self.factor_len
        host = np.empty((int(rows[keys].sum()) + 1, row_elems), self.storage.as_numpy_dtype)
        host[-1] = 0
        at, chunk, chunk_bytes = 0, [], 0
        for i, k in enumerate(keys):
            chunk.append(int(k))
            chunk_bytes += int(rows[k]) * row_elems * 8
            if chunk_bytes >= UPLOAD_CHUNK_BYTES or i == len(keys) - 1:
                part = self._host_rows(chunk, label)
                host[at:at + len(part)] = part
                at, chunk, chunk_bytes = at + len(part), [], 0
        self._count_upload(host.nbytes)
        with tf.device(device):
            # Not tf.constant: measured on the CPU device, it holds two copies of the array for good; identity
            # copies the host array (which TensorFlow wraps without a copy) once onto the device, then it goes.
            return tf.identity(host)

    # -- streamed ----------------------------------------------------------------------------------------
    def groups(self, epoch: int) -> tuple:
        """Streamed: epoch `epoch`'s groups as rows (first batch, end batch, first block, last block: the same
        block for a group of batches inside one, two or more for a batch that straddles them), and its blocks
        (`Plan.shard_blocks`). The last epoch's are kept."""
        cached = self._groups
        if cached is not None and cached[0] == epoch:
            return cached[1], cached[2]
        size, batch = self._plan._core.shard_size, self.batch_size
        num_batches = len(self._plan._core)
        blocks = self._plan._core.shard_blocks(epoch)
        ends = np.array([end for _, end, _ in blocks], np.int64)
        first = np.arange(num_batches, dtype=np.int64) * batch
        first_block = np.searchsorted(ends, first, side="right")
        last_block = np.searchsorted(ends, np.minimum(first + batch, size) - 1, side="right")
        # A group starts at every straddling batch, and at every batch in another block than the previous one.
        straddles = first_block != last_block
        starts = np.flatnonzero(straddles | np.concatenate([[True], first_block[1:] != first_block[:-1]])
                                | np.concatenate([[False], straddles[:-1]])) if num_batches else np.zeros(0, int)
        table = np.stack([starts, np.append(starts[1:], num_batches)[:len(starts)], first_block[starts],
                          last_block[starts]], 1).astype(np.int64).reshape(-1, 4)
        self._groups = (epoch, table, blocks)
        return table, blocks

    def num_groups(self, epoch) -> np.int64:
        return np.int64(len(self.groups(int(epoch))[0]))

    def group(self, epoch, index):
        """Streamed, host half of group `index` of epoch `epoch`: its factor and label rows (zero row last) in
        the storage dtype, and the start rows of its samples, batch after batch. A straddling batch's rows are its
        windows, taken on the host from its blocks' rows (converted once, as every block's)."""
        epoch, index = int(epoch), int(index)
        table, blocks = self.groups(epoch)
        first_batch, end_batch, first_block, last_block = (int(v) for v in table[index])
        batch_ids = [self._plan._core.ids(epoch, b) for b in range(first_batch, end_batch)]
        ids = np.concatenate(batch_ids)
        if first_block == last_block:
            factors, labels, factor_first, label_first = self._block_rows(epoch, first_block, blocks)
            rows = self._start_rows(ids, factor_first, label_first, len(labels) - 1)
        else:
            parts = [self._block_rows(epoch, k, blocks) for k in range(first_block, last_block + 1)]
            factor_first, label_first = parts[0][2].copy(), parts[0][3].copy()
            x_offset, y_offset = len(parts[0][0]) - 1, len(parts[0][1]) - 1
            for k, part in zip(range(first_block + 1, last_block + 1), parts[1:]):
                keys = np.asarray(blocks[k][2], np.int64)
                factor_first[keys] = part[2][keys] + x_offset
                label_first[keys] = part[3][keys] + y_offset
                x_offset, y_offset = x_offset + len(part[0]) - 1, y_offset + len(part[1]) - 1
            joined_x = np.concatenate([p[0][:-1] for p in parts] + [parts[0][0][-1:]])
            joined_y = np.concatenate([p[1][:-1] for p in parts] + [parts[0][1][-1:]])
            start, lo, hi, y_row = self._start_rows(ids, factor_first, label_first, len(joined_y) - 1)
            j = np.arange(self.window)
            window_rows = np.where((j >= lo[:, None]) & (j < hi[:, None]), start[:, None] + j, len(joined_x) - 1)
            n = len(ids)
            factors = self._with_zero_row(joined_x[window_rows.reshape(-1)])
            labels = self._with_zero_row(joined_y[y_row])
            rows = (np.arange(n, dtype=np.int64) * self.window, np.zeros(n, np.int64),
                    np.full(n, self.window, np.int64), np.arange(n, dtype=np.int64))
        self._count_upload(factors.nbytes + labels.nbytes)
        for one in batch_ids:
            self._count_batch(one)
        self.host_bytes_per_step = sum(a.nbytes for a in rows) // max(end_batch - first_batch, 1)
        return (factors, labels, *rows)

    def _block_rows(self, epoch: int, block: int, blocks) -> tuple:
        """Block `block`'s (factor rows, label rows, zero row last, in the storage dtype; each key's first factor
        row, first label row); the last two blocks asked are kept (a straddling batch reads the next block
        before that block's own group does)."""
        for key, value in self._host_blocks:
            if key == (epoch, block):
                return value
        keys = np.asarray(blocks[block][2], np.int64)
        factor_first, label_first = self._first_rows(keys)
        value = (self._with_zero_row(self._host_rows(keys.tolist(), False)),
                 self._with_zero_row(self._host_rows(keys.tolist(), True)), factor_first, label_first)
        self._host_blocks = [*self._host_blocks, ((epoch, block), value)][-2:]
        return value

    def _first_rows(self, keys: np.ndarray) -> tuple:
        """Per key of the source (-1 for keys not in `keys`): its first factor row and first label row when the
        arrays of `keys` lie one after another in that order."""
        factor_first = np.full(len(self.factor_len), -1, np.int64)
        label_first = np.full(len(self.label_len), -1, np.int64)
        factor_first[keys], label_first[keys] = _starts(self.factor_len[keys]), _starts(self.label_len[keys])
        return factor_first, label_first

    def _with_zero_row(self, host: np.ndarray) -> np.ndarray:
        out = np.empty((len(host) + 1, host.shape[1]), host.dtype)
        out[:-1] = host
        out[-1] = 0
        return out

    # -- both --------------------------------------------------------------------------------------------
    def _host_rows(self, keys: list, label: bool) -> np.ndarray:
        """The arrays of `keys` one after another as (rows, row elements) in the storage dtype, converted as
        numpy's ``astype`` does: to float64 for float64 data or storage, else float32, then to the storage type."""
        row_elems = self.y_elems if label else self.x_elems
        arrays = self._src._key_arrays(keys, label)
        wide = self.storage == tf.float64 or any(np.dtype(a.dtype).itemsize > 4 and a.dtype.kind == "f" for a in arrays)
        host = np.concatenate([np.asarray(a).reshape(len(a), row_elems) for a in arrays]) if arrays else \
            np.zeros((0, row_elems), np.float32)
        return host.astype(np.float64 if wide else np.float32, copy=False).astype(self.storage.as_numpy_dtype,
                                                                                  copy=False)

    def form(self, factors, labels, start, lo, hi, y_row):
        """Device half of a step: the batch, with one gather of factor rows and one of label rows (the last row of
        `factors` is the zero row). Its ops name the device: tf.data's map and flat_map kernels are the host's,
        and a dataset function whose ops name another device runs as a multi-device function, these ops there."""
        with tf.device(self.device):
            return self._form(factors, labels, start, lo, hi, y_row)

    def _form(self, factors, labels, start, lo, hi, y_row):
        j = tf.range(self.window, dtype=tf.int64)
        rows = start[:, None] + j[None, :]
        if self.pad:
            valid = (j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None])
            rows = tf.where(valid, rows, tf.cast(tf.shape(factors, out_type=tf.int64)[0] - 1, tf.int64))
        x = tf.gather(factors, rows)
        y = tf.gather(labels, y_row)
        b = tf.shape(start)[0]
        x = tf.reshape(tf.cast(x, self.out_dtype), tf.concat([[b, self.window], self.x_row_shape], 0))
        y = tf.reshape(tf.cast(y, self.out_dtype), tf.concat([[b], self.y_row_shape], 0))
        return x, y

    def _layout_bytes(self, keys) -> int:
        rows_x, rows_y = int(self.factor_len[keys].sum()) + 1, int(self.label_len[keys].sum()) + 1
        return (rows_x * self.x_elems + rows_y * self.y_elems) * self.storage.size


def _starts(lengths: np.ndarray) -> np.ndarray:
    """First row of each array laid one after another."""
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else np.zeros(0, np.int64)


#: Host memory one upload step holds: keys are read and converted this many bytes at a time.
UPLOAD_CHUNK_BYTES = 256 << 20
