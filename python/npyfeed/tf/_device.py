"""Batches formed on the device (``npyfeed.tf.dataset(gather="device")``): the factor and label arrays a pipeline
reads are uploaded to the device, and each step sends only what its batch needs (start rows: a few integers per
sample) and forms ``(B, W, F...)`` and ``(B, L...)`` there with one gather each.

Layout on the device: one ``(rows + 1, row elements)`` tensor per kind (factors, labels), arrays one after another,
then one zero row that windows read for rows outside their key's array (``bounds="pad"``); resident (every key of
the pipeline, uploaded once) or streamed (``shuffle="blocks"`` over the budget: groups of batches sharing one
block's upload, a batch over two blocks a group of its own). The host's half, the layout, the reads through the
source's readers, the conversion to the storage dtype and each batch's start rows, is the core's
(``_core.DeviceRows``, ``csrc/npyfeed/device/device_rows.hpp``), and what fits on the device is decided by
``npyfeed._device_budget``, both shared with ``npyfeed.torch``; this module measures the device's free memory and
forms the batches there.
"""

from __future__ import annotations

import ctypes

import numpy as np
import tensorflow as tf

from .. import _core
from .._device_budget import BATCHES_HELD, default_budget, device_layout
from .._resources import available_memory, environment

#: In a graph (tf.compat.v1, tf.estimator), resident arrays are constants of the graph, whose protocol buffer
#: holds at most 2 GB: past this many bytes, shuffle="blocks" streams instead (groups flow through the pipeline).
GRAPH_CONSTANT_BYTES = 1 << 30


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
            (environment("TF_FORCE_GPU_ALLOW_GROWTH") or "").lower() == "true"
        return ordinal, in_use, growth, None if limit_mb is None else int(limit_mb) << 20
    return None


def _cudart():
    """The CUDA runtime the core found for pin_memory (one lookup: ``_core.cuda_runtime_library``), or None."""
    name = _core.cuda_runtime_library()
    try:
        return None if name is None else ctypes.CDLL(name)
    except OSError:
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
    """The arrays of a plan's keys for `device`, and the two halves of a step: `rows` or `group` (host, C++:
    ``_core.DeviceRows``, reading through the source's own readers) and `form` (device). `streams` tells which
    layout (module docstring)."""

    def __init__(self, src, plan, host_rows, device: str, budget: int | None):
        """`plan`: the pipeline's `Plan`; `host_rows`: a ``_core.DeviceRows`` over it, in the storage dtype."""
        self.window = src.window
        self.device = device
        self.batch_size = plan.batch_size
        self.out_dtype = tf.as_dtype(np.dtype(src.dtype))
        self.storage = tf.as_dtype(host_rows.storage_dtype)
        self.x_row_shape, self.y_row_shape = tuple(src.x_shape[1:]), tuple(src.y_shape)
        self.x_elems = int(np.prod(self.x_row_shape, dtype=np.int64))
        self.y_elems = int(np.prod(self.y_row_shape, dtype=np.int64))
        self.sample_bytes = (self.window * self.x_elems + self.y_elems) * self.out_dtype.size  # of a formed batch
        self.pad = src.bounds == "pad"
        self.host_rows = host_rows  # the core's half, which the pipeline's feed calls
        self._plan = plan
        batch_bytes = self.batch_size * self.sample_bytes
        if budget is None:
            budget = default_budget(device_free_bytes(device), device)
        # In a graph, resident arrays are graph constants (GRAPH_CONSTANT_BYTES).
        graph_limit = None if tf.executing_eagerly() else GRAPH_CONSTANT_BYTES + BATCHES_HELD * batch_bytes
        layout = device_layout(
            host_rows, plan, batch_bytes, budget, device, resident_limit=graph_limit,
            resident_refused=f"gather='device' in a graph (tf.compat.v1, tf.estimator) holds its arrays as graph "
                             f"constants, at most {GRAPH_CONSTANT_BYTES} bytes, and these are "
                             f"{host_rows.resident_bytes}: use shuffle='blocks' (streamed, no constants), "
                             f"shard_by='keys', a smaller storage_dtype, eager execution, or gather='host'")
        self.streams, self.needed_bytes, self.group_bytes = layout.streams, layout.needed_bytes, layout.group_bytes
        if not self.streams:
            self.factors = self._upload_resident(False, device)
            self.labels = self._upload_resident(True, device)

    @property
    def host_bytes_per_step(self) -> int:
        """Bytes a step's host half hands to TensorFlow for a full batch: four int64 per sample."""
        return 4 * 8 * self.batch_size

    @property
    def uploaded_bytes(self) -> int:
        """Bytes of arrays handed to TensorFlow for the device so far (the plan's ``device_bytes``)."""
        return self._plan.stats()["device_bytes"]

    def _host(self, rows: np.ndarray) -> np.ndarray:
        """Host rows in the storage dtype (the core hands bfloat16 over as its bits, uint16)."""
        return rows.view(self.storage.as_numpy_dtype) if self.storage == tf.bfloat16 else rows

    # -- resident ----------------------------------------------------------------------------------------
    def rows(self, epoch, batch):
        """Host half of a resident step: (x start row, first valid window row, end of valid window rows, label
        row) of batch `batch` of epoch `epoch`."""
        return self.host_rows.rows(int(epoch), int(batch))

    def _upload_resident(self, label: bool, device: str):
        """The arrays of the plan's keys one after another as (rows + 1, row elements) in the storage dtype on
        `device`, the last row zeros: read and converted by the core into one host array, uploaded at once (the
        device holds the arrays once, never a part and the whole)."""
        host = self._host(self.host_rows.read_resident(label))
        with tf.device(device):
            # Not tf.constant: measured on the CPU device, it holds two copies of the array for good; identity
            # copies the host array (which TensorFlow wraps without a copy) once onto the device, then it goes.
            return tf.identity(host)

    # -- streamed ----------------------------------------------------------------------------------------
    def groups(self, epoch: int) -> np.ndarray:
        """Streamed: epoch `epoch`'s groups, rows of (first batch, end batch, first block, last block: the same
        block for batches inside one, two or more for a batch that straddles them)."""
        return self.host_rows.groups(int(epoch))

    def num_groups(self, epoch) -> np.int64:
        return np.int64(len(self.groups(int(epoch))))

    def group(self, epoch, index):
        """Streamed, host half of group `index` of epoch `epoch`: its factor and label rows (zero row last) in
        the storage dtype, the start rows of its samples, batch after batch, and where each batch ends in them
        (int64, one per batch: batch i is samples ``[ends[i - 1] or 0, ends[i])``, as many as the plan's batch
        holds)."""
        factors, labels, *rows = self.host_rows.group(int(epoch), int(index))
        return (self._host(factors), self._host(labels), *rows)

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
        # The row shapes as int32 tensors: an empty one (1-d files, scalar rows) would otherwise be a float32 [].
        x_row, y_row_shape = tf.constant(self.x_row_shape, tf.int32), tf.constant(self.y_row_shape, tf.int32)
        x = tf.reshape(tf.cast(x, self.out_dtype), tf.concat([[b, self.window], x_row], 0))
        y = tf.reshape(tf.cast(y, self.out_dtype), tf.concat([[b], y_row_shape], 0))
        return x, y
