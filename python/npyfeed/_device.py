"""Batches formed on the device (``npyfeed.tf.dataset(gather="device")``): the factor and label arrays a pipeline
reads are uploaded once, and each step sends only what its batch needs (start rows: a few integers per sample)
and forms ``(B, W, F...)`` and ``(B, L...)`` there with one gather each.

Layout on the device: one ``(rows + 1, row elements)`` tensor per kind (factors, labels), the keys' arrays one after
another in key order (only the keys of this shard with ``shard_by="keys"``), then one zero row that windows read
for rows outside their key's array (``bounds="pad"``). A step's host work is `rows`: the plan's ids of the batch
(`Plan.ids`, no IO), their (key, feature_index, label_index) from the index, and four int64 vectors.
"""

from __future__ import annotations

import ctypes

import numpy as np
import tensorflow as tf

from ._resources import available_memory

#: Share of the device's free memory (of the memory available, on the CPU) a pipeline may upload by default.
DEFAULT_BUDGET_SHARE = 0.8

STORAGE_DTYPES = ("float16", "bfloat16", "float32", "float64")


def device_free_bytes(device: str) -> int | None:
    """Free bytes on `device`: the CUDA runtime's cudaMemGetInfo for a GPU (the runtime TensorFlow's GPU wheel
    brings), the memory available for the CPU; None when it cannot be told."""
    spec = tf.DeviceSpec.from_string(device)
    if (spec.device_type or "CPU").upper() == "CPU":
        return available_memory()
    for name in ("libcudart.so", "libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0"):
        try:
            cudart = ctypes.CDLL(name)
        except OSError:
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if cudart.cudaSetDevice(int(spec.device_index or 0)) == 0 and \
                cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) == 0:
            return int(free.value)
    return None


class DeviceGather:
    """The arrays of `plan`'s keys on `device`, and the two halves of a step: `rows` (host) and `form` (device)."""

    def __init__(self, src, plan, device: str, storage_dtype, budget: int | None):
        if src._transform is not None:
            raise ValueError("gather='device' does not apply features=, label_columns=, nan=, posinf=, neginf= or "
                             "normalize= yet (the device holds the arrays as they are): use gather='host'")
        self.window = src.window
        self.out_dtype = tf.as_dtype(np.dtype(src.dtype))
        self.storage = tf.as_dtype(storage_dtype) if storage_dtype is not None else self.out_dtype
        self.x_row_shape, self.y_row_shape = tuple(src.x_shape[1:]), tuple(src.y_shape)
        self.pad = src.bounds == "pad"
        self._src = src
        self._plan = plan
        keys = plan._core.shard_keys
        keys = list(range(len(src.keys))) if keys is None else list(keys)
        x_elems = int(np.prod(self.x_row_shape, dtype=np.int64))
        y_elems = int(np.prod(self.y_row_shape, dtype=np.int64))
        factor_shapes, label_shapes = src._key_shapes(keys)
        self.factor_rows = np.array([s[0] for s in factor_shapes], np.int64)
        self.label_rows = np.array([s[0] if s else 1 for s in label_shapes], np.int64)
        itemsize = self.storage.size
        needed = (int(self.factor_rows.sum()) + 1) * x_elems * itemsize + (int(self.label_rows.sum()) + 1) * y_elems * itemsize
        if budget is None:
            free = device_free_bytes(device)
            if free is None:
                raise ValueError(f"gather='device': cannot tell the free memory of {device}; pass device_memory_budget")
            budget = int(free * DEFAULT_BUDGET_SHARE)
        if needed > budget:
            raise ValueError(
                f"gather='device' needs {needed} bytes on {device} for the arrays of {len(keys)} keys, over the "
                f"device_memory_budget of {budget} bytes; use shard_by='keys' (each process uploads its shard's "
                f"keys only), a smaller storage_dtype (e.g. 'float16'), or gather='host'")
        self.needed_bytes = needed
        # Per key (all keys of the source; -1 for keys not uploaded): its first row in the device tensors.
        self.factor_first = np.full(len(src.keys), -1, np.int64)
        self.label_first = np.full(len(src.keys), -1, np.int64)
        self.factor_first[keys] = np.concatenate([[0], np.cumsum(self.factor_rows)[:-1]]) if keys else []
        self.label_first[keys] = np.concatenate([[0], np.cumsum(self.label_rows)[:-1]]) if keys else []
        self.factor_len = np.zeros(len(src.keys), np.int64)
        self.label_len = np.zeros(len(src.keys), np.int64)
        self.factor_len[keys], self.label_len[keys] = self.factor_rows, self.label_rows
        self.x_zero_row, self.y_zero_row = int(self.factor_rows.sum()), int(self.label_rows.sum())
        self.factors = _upload(src, keys, False, x_elems, self.storage, device)
        self.labels = _upload(src, keys, True, y_elems, self.storage, device)
        self.host_bytes_per_step = 0  # bytes the last step's `rows` handed to TensorFlow

    def rows(self, epoch, batch):
        """Host half of a step: (x start row, first valid window row, end of valid window rows, label row)."""
        ids = self._plan._core.ids(int(epoch), int(batch))
        keys, features, labels = self._src._core.sample_fields(ids)
        first = features - (self.window - 1)
        start = self.factor_first[keys] + first
        lo = np.zeros(len(ids), np.int64)
        hi = np.full(len(ids), self.window, np.int64)
        y = self.label_first[keys] + labels
        if self.pad:
            lengths = self.factor_len[keys]
            lo = np.clip(-first, 0, self.window)
            hi = np.clip(lengths - first, 0, self.window)
            y = np.where((labels >= 0) & (labels < self.label_len[keys]), y, self.y_zero_row)
        out = (start, lo, hi, y)
        self.host_bytes_per_step = sum(a.nbytes for a in out)
        return out

    def form(self, start, lo, hi, y_row):
        """Device half of a step: the batch, with one gather of factor rows and one of label rows."""
        j = tf.range(self.window, dtype=tf.int64)
        rows = start[:, None] + j[None, :]
        if self.pad:
            valid = (j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None])
            rows = tf.where(valid, rows, tf.constant(self.x_zero_row, tf.int64))
        x = tf.gather(self.factors, rows)
        y = tf.gather(self.labels, y_row)
        b = tf.shape(start)[0]
        x = tf.reshape(tf.cast(x, self.out_dtype), tf.concat([[b, self.window], self.x_row_shape], 0))
        y = tf.reshape(tf.cast(y, self.out_dtype), tf.concat([[b], self.y_row_shape], 0))
        return x, y


#: Host memory one upload step holds: keys are read and converted this many bytes at a time.
UPLOAD_CHUNK_BYTES = 256 << 20


def _upload(src, keys, label: bool, row_elems: int, storage, device: str):
    """The arrays of `keys` one after another as (rows + 1, row_elems) in `storage` on `device`, the last row
    zeros. Read and converted on the host a chunk of keys at a time (as numpy's astype would: to float64 first
    for float64 data, else float32, then to `storage` on the device), joined on the device."""
    parts, chunk, chunk_bytes = [], [], 0

    def flush():
        nonlocal chunk, chunk_bytes
        arrays = src._key_arrays(chunk, label)
        wide = storage == tf.float64 or any(np.dtype(a.dtype).itemsize > 4 and a.dtype.kind == "f" for a in arrays)
        host = np.concatenate([np.asarray(a).reshape(len(a), row_elems) for a in arrays]).astype(
            np.float64 if wide else np.float32, copy=False)
        with tf.device(device):
            parts.append(tf.cast(tf.constant(host), storage))
        chunk, chunk_bytes = [], 0

    for k, shape in zip(keys, src._key_shapes(keys)[1 if label else 0]):
        chunk.append(k)
        chunk_bytes += int(np.prod(shape, dtype=np.int64)) * 8
        if chunk_bytes >= UPLOAD_CHUNK_BYTES:
            flush()
    if chunk:
        flush()
    with tf.device(device):
        parts.append(tf.zeros((1, row_elems), storage))
        return tf.concat(parts, 0) if len(parts) > 1 else parts[0]
