"""`tf.data` pipelines over a `WindowSource`. This is the only module that imports TensorFlow.

``import npyfeed`` never imports TensorFlow; ``import npyfeed.tf`` (or the attribute ``npyfeed.tf``) does.

The pipeline is native ``tf.data`` over positions, mapped through a gather of "batch b of epoch e"::

    range(1).map(next pass's epoch) -> flat_map(e: zip(e repeated, range(batches)))    # positions (e, b)
      -> map(gather "batch b of epoch e"), in the thread that asks

The gather takes the batch from the plan (``WindowSource.plan``, ``Plan.take``: a C++ stream positioned at the
next batch): the stream keeps the gathers of the next ``prefetch`` batches in
flight by itself, as the numpy iterator does, so the thread pool never waits for TensorFlow's hand-off. So on
the native path (below) the pipeline has no ``prefetch`` of TensorFlow's and its map runs in the calling thread
(the fallback keeps a parallel map of one call and a ``prefetch``): a step's ``next()`` takes a
ready batch with no other thread woken (a ``prefetch`` and a parallel map each cost a thread hop per batch, and
TensorFlow's idle inter-op workers spin; measured, 0.7-1 ms of CPU per batch on other threads, most of what an
eager loop lost against the numpy iterator). In an eager loop, the dataset's iterator also skips TensorFlow's
per-step executor switch (`_Iterator`). A
request for exactly the next batch is served from the stream; any other position (a restored checkpoint, a new
epoch, a jump) starts a new stream there, so every batch is still a function of its position alone (and calls
from several TensorFlow threads would be correct, only slower). Its iterator is checkpointable
(``tf.train.Checkpoint``): with symbolic checkpointing (``tf.data.Options.experimental_symbolic_checkpoint``)
the state is the positions (a few bytes), never batches, and a restored iterator gathers the same batches again.

Two ways to hand a batch to TensorFlow:

* **Native ops** (the default): ``_tf_ops.so``, an op library registered through TensorFlow's stable C API only
  (``tensorflow/c/ops.h``, ``kernels.h``, ``tf_tensor.h``, ``tf_status.h``), so one binary serves TensorFlow 2.15
  and later; it is built without TensorFlow and holds no copy of npyfeed's core: it calls ``_core`` through a
  versioned table of C functions (``csrc/npyfeed/tf_feed_abi.h``). ``NpyfeedTake`` returns npyfeed's 64-byte
  aligned batch buffers as the tensors' memory (no copy; a buffer goes back to its pool once TensorFlow lets go).
  No Python runs per batch (nor per pass: the epoch counter is an op too), so the gather needs neither the GIL
  nor an exit hook. **Lifetime:** a graph holds only the feed's id (an int64); the feed stays registered in
  ``_core`` while the dataset lives (an iterator holds its dataset; a dataset made inside a ``tf.function`` or a
  ``tf.compat.v1`` graph is held by that graph). A call with an id whose dataset is gone fails with
  ``FailedPreconditionError``, never touches freed memory; a call in flight holds its feed until it returns,
  and one still waiting for its gather when the dataset goes stops waiting (``CancelledError``, within 50 ms).
* **The fallback**, ``tf.numpy_function`` (one Python call per batch, GIL released inside): used when
  ``NPYFEED_TF_OPS=0`` or when the op library does not load (one warning says why). TensorFlow adopts a 64-byte
  aligned numpy array without copying it. A ``numpy_function`` call in flight when the interpreter starts
  finalizing may never finish (CPython ends a thread that asks for the GIL after finalization began), so the
  iterator's destructor, run by the main thread during finalization, could wait for it forever; an `atexit`
  hook (this path only) makes further gathers fail at once and waits until none is in flight.

Errors of a gather (a truncated file, a bad header) reach the loop as ``tf.errors.OpError`` with npyfeed's
message, which names the file, index line or key.

``shuffle="blocks"``: a blocks epoch is read in order (files whole, within a memory budget); its stream also
reads the blocks ahead within the budget.

Epochs: a counter (in the feed, or a Python int behind a ``numpy_function``) gives each pass over the dataset
the next epoch; ``dataset(...).repeat(count)`` reads epochs ``epoch, epoch + 1, ...`` from a native range, so
the epoch is part of the checkpointed position and a restored repeat continues across the epoch boundary.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2
from tensorflow.python.data.ops import dataset_ops, iterator_ops, map_op
from tensorflow.python.eager import context
from tensorflow.python.framework import ops
from tensorflow.python.ops import gen_dataset_ops

from . import _checks, _tf_feed
from . import stats as _stats
from .plan import DEFAULT_MEMORY_BUDGET

__all__ = ["dataset", "StatsCallback"]



def dataset(src, batch_size: int, *, shuffle: bool | str = False, seed: int = 0, drop_remainder: bool = False,
            device: str | None = None, input_context=None, num_shards: int | None = None,
            shard_index: int | None = None, prefetch: int = 2, epoch: int = 0,
            memory_budget: int = DEFAULT_MEMORY_BUDGET, shard_by: str = "samples", gather: str = "host",
            device_memory_budget: int | None = None, storage_dtype=None) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(x, y)`` batches from `src`; each pass over it is a new epoch.

    Parameters
    ----------
    src : WindowSource
    batch_size : int
        Batch size; with `input_context`, the *global* batch size, split evenly over the replicas.
    shuffle : bool or "blocks"
        Shuffle the samples: a seeded permutation of all samples per epoch, a new one each pass. ``"blocks"``
        (data sets larger than RAM): each file read once per epoch, whole, within `memory_budget`, batches in
        the order of ``WindowSource.batches(shuffle="blocks")``; see its docstring and the README.
        Checkpointable like the others; a restored iterator (or a jump to another position) first reads the
        block(s) of its batch again.
    seed : int
        Seed of the permutation (same seed and epoch, same order, on any machine).
    drop_remainder : bool
        Drop a last, smaller batch (the batch dimension is then static).
    device : str, optional
        E.g. ``"/gpu:0"``: end the pipeline with ``tf.data.experimental.prefetch_to_device(device)``, which
        must stay the last transformation (Keras needs no ``repeat()``: each of its epochs is a new pass).
        Not with `input_context` (the strategy places batches on its replicas itself).
    input_context : tf.distribute.InputContext, optional
        As passed by ``strategy.distribute_datasets_from_function``: this pipeline reads shard
        ``input_pipeline_id`` of ``num_input_pipelines`` of every epoch (shards are disjoint and together cover
        the epoch exactly once) in batches of ``input_context.get_per_replica_batch_size(batch_size)``.
    num_shards, shard_index : int, optional
        Without a strategy (e.g. one process per GPU): this pipeline reads shard `shard_index` of `num_shards`
        of every epoch, in batches of `batch_size` (this pipeline's own), as `WindowSource.plan`. Default: the
        whole epoch (1 and 0). Not with `input_context`, which names the shard itself.
    prefetch : int
        Batches the stream gathers ahead of the one TensorFlow asks for (in flight at once). The pipeline adds
        no ``prefetch`` of TensorFlow's (nor lets tf.data inject one): a batch the stream has ready is handed
        over in the calling thread.
    epoch : int
        The epoch of the first pass (e.g. Keras ``initial_epoch`` after a restart).
    memory_budget : int
        With ``shuffle="blocks"``: bytes of array data held at once (the same default as `WindowSource.plan`).
        It decides the order too: keep it fixed to reproduce (or resume) an epoch.
    shard_by : {"samples", "keys"}
        How the shards (`num_shards` or `input_context`) split an epoch (`WindowSource.plan`): every n-th sample, or whole
        keys balanced by sample count (each pipeline reads only its own keys' files).
    gather : {"host", "device"}
        ``"host"`` (the default): npyfeed's C++ gather forms each batch in host memory, and `device` (if given)
        receives it by ``prefetch_to_device``. ``"device"``: the factor and label arrays this pipeline reads (its
        shard's keys with ``shard_by="keys"``, else all) are uploaded once to `device` (default: the first GPU
        TensorFlow sees, else ``/cpu:0``); each step sends only the batch's start rows from the host (four
        integers per sample, from the plan's ids) and forms ``(B, W, F...)`` and ``(B, L...)`` there with one
        gather each, so windows never cross PCIe. Same batches, orders, shards, epochs and checkpoints as
        ``"host"``; ``bounds="pad"`` reads zero rows. Over `device_memory_budget`, ``shuffle="blocks"`` streams:
        each block of the plan uploaded once per epoch, the next while the current one is consumed (a batch
        over two blocks is uploaded as its windows); any other order raises ``ValueError``. Several replicas in
        one process (``MirroredStrategy``): one pipeline per replica, with ``InputOptions(
        experimental_replication_mode=PER_REPLICA, experimental_place_dataset_on_device=True,
        experimental_fetch_to_device=False)``, each on its replica's device (the default device is the
        enclosing ``tf.device`` scope's); one pipeline for several replicas is refused. Memory: the arrays in
        `storage_dtype` on the device and 4 batches (while uploading, the arrays once in host memory too);
        streamed, two blocks and 4 batches. Iterators on another device than the host's CPU
        cannot be checkpointed (TensorFlow's ``copy_to_device``).
    device_memory_budget : int, optional
        With ``gather="device"``: the most bytes the device may hold for this pipeline; over it, streamed blocks
        (``shuffle="blocks"``) or ``ValueError`` naming the bytes needed and suggesting ``shuffle="blocks"``,
        ``shard_by="keys"`` or a smaller `storage_dtype`. Default: 80% of what TensorFlow's allocator on the
        GPU can still hand out (the unused part of its memory pool, or with memory growth the device's free
        memory: the rule is in the TensorFlow guide, ``gather="device"``), or of the memory available on the
        CPU device.
    storage_dtype : {"float16", "bfloat16", "float32", "float64"}, optional
        With ``gather="device"``: the type the arrays are held in on the device (default ``src.dtype``); half
        the memory with float16/bfloat16, batches still come in ``src.dtype`` (each value rounded to
        `storage_dtype` once, as numpy's ``astype`` does).

    Returns
    -------
    tf.data.Dataset
        Elements ``(x, y)`` of dtype ``src.dtype`` and shapes ``(B, *src.x_shape)`` and ``(B, *src.y_shape)``
        (``B`` is None unless `drop_remainder`). Pass ``n`` (counting from 0) reads epoch ``epoch + n``: every
        iterator made over the dataset (a ``for`` loop, a Keras epoch) starts the next one. Its cardinality is
        the number of batches per pass. ``.repeat(count)`` on it reads epochs ``epoch, epoch + 1, ...``
        (``count`` of them, or forever) as one checkpointable stream. Its iterators save and restore with
        ``tf.train.Checkpoint(iterator=it)``: the checkpoint holds positions, not batches, and a restored
        iterator (in a new process, over a dataset made with the same arguments) yields the same batches as an
        uninterrupted one. Checkpoint ``repeat()``'s iterator: a single pass restores its position, but
        the epoch it then reads is the new dataset's next pass's, not necessarily the saved one.

    Raises
    ------
    ValueError
        Bad arguments (also a global batch size that the replicas do not divide, or `input_context` with
        `num_shards`/`shard_index`).
    """
    if gather not in ("host", "device"):
        raise (ValueError if isinstance(gather, str) else _checks.ArgumentTypeError)(
            f"gather must be 'host' or 'device', got {gather!r}")
    if gather == "host" and (device_memory_budget is not None or storage_dtype is not None):
        raise ValueError("device_memory_budget= and storage_dtype= apply to gather='device' only")
    if input_context is not None and (num_shards is not None or shard_index is not None):
        raise ValueError("input_context= names this pipeline's shard itself: pass it, or num_shards=/shard_index=, "
                         "not both")
    num_shards = 1 if num_shards is None else num_shards
    shard_index = 0 if shard_index is None else shard_index
    if input_context is not None:
        if gather == "device" and input_context.num_replicas_in_sync > input_context.num_input_pipelines:
            raise ValueError(
                f"gather='device' forms batches on one device per pipeline, and this strategy has "
                f"{input_context.num_replicas_in_sync} replicas over {input_context.num_input_pipelines} input "
                f"pipeline(s): pass options=tf.distribute.InputOptions(experimental_replication_mode="
                f"tf.distribute.InputReplicationMode.PER_REPLICA, experimental_place_dataset_on_device=True, "
                f"experimental_fetch_to_device=False) to distribute_datasets_from_function (one pipeline per "
                f"replica, on its replica's device), run one process per GPU, or use gather='host'")
        if device is not None:
            raise ValueError("device= and input_context= exclude each other: under tf.distribute the strategy "
                             "copies the batches to its replicas")
        batch_size = input_context.get_per_replica_batch_size(batch_size)
        num_shards, shard_index = input_context.num_input_pipelines, input_context.input_pipeline_id
    if device is not None and not isinstance(device, str):
        raise TypeError(f"device must be a device name such as '/gpu:0', not {type(device).__name__}")
    epoch = _checks.epoch(epoch)  # [0, _checks.EPOCH_LIMIT), as everywhere; repeat() forever ends there
    # Every argument is checked here, by the plan, where an error is readable (not in TensorFlow's thread at
    # the first batch). One stream, read in order: one call at a time (it gathers `prefetch` batches ahead).
    plan = src.plan(batch_size, shuffle=shuffle, seed=seed, num_shards=num_shards, shard_index=shard_index,
                    drop_remainder=bool(drop_remainder), memory_budget=memory_budget, prefetch=prefetch,
                    shard_by=shard_by)
    batches = plan._core
    # In a graph (tf.compat.v1, tf.estimator, inside a tf.function) the pipeline outlives the Python dataset, and
    # the graph owns the gather: hold it strongly there.
    weak = tf.executing_eagerly()
    on_device = None
    # gather="device": the pipeline's host part on the host's CPU, whatever device scope it is made in (a strategy
    # calls a dataset function per replica in its replica's scope); its device part on `target`.
    host_scope = contextlib.nullcontext
    if gather == "device":
        host_scope = functools.partial(tf.device, "/cpu:0")
        from ._device import STORAGE_DTYPES, DeviceGather

        if storage_dtype is not None and str(storage_dtype) not in STORAGE_DTYPES:
            raise ValueError(f"storage_dtype must be one of {STORAGE_DTYPES}, got {storage_dtype!r}")
        if device_memory_budget is not None:
            device_memory_budget = _checks.positive(device_memory_budget, "device_memory_budget")
        target = device if device is not None else _default_device()
        _check_device(target)
        on_device = DeviceGather(src, plan, target, storage_dtype, device_memory_budget)
        _tf_feed.expect_python_calls()  # its host half is Python in TensorFlow's threads: the exit hook waits for it
    steps = len(batches)

    dtype = tf.as_dtype(np.dtype(src.dtype))
    batch_dim = int(batch_size) if drop_remainder else None
    x_shape, y_shape = (batch_dim, *src.x_shape), (batch_dim, *src.y_shape)

    feed, registration = _tf_feed.open_feed(batches, epoch, dtype)
    start_pass, seen, take = feed.start_pass, feed.seen, feed.take
    native = isinstance(feed, _tf_feed.NativeFeed)

    def one_epoch(e):
        # Also called when a checkpointed iterator is restored into epoch e: the next pass continues after it.
        e = tf.ensure_shape(seen(e), ())
        # (e, b) by a zip, not a map: no function call per batch.
        return tf.data.Dataset.zip((tf.data.Dataset.from_tensors(e).repeat(steps), tf.data.Dataset.range(steps)))

    def load(e, b):
        x, y = take(e, b)
        return tf.ensure_shape(x, x_shape), tf.ensure_shape(y, y_shape)

    def start_rows(e, b):
        # gather="device": the host's part of a step, four int64 vectors of B (no window crosses to the device).
        rows = _tf_feed.DeviceCall(on_device, "rows", weak)
        return tf.numpy_function(rows, [e, b], (tf.int64,) * 4, stateful=False, name="npyfeed_rows")

    def form(start, lo, hi, y_row):
        x, y = on_device.form(on_device.factors, on_device.labels, start, lo, hi, y_row)
        return tf.ensure_shape(x, x_shape), tf.ensure_shape(y, y_shape)

    def epoch_groups(e):
        # gather="device", streamed: epoch e's groups of batches, as (e, g) like one_epoch's (e, b).
        e = tf.ensure_shape(seen(e), ())
        count = tf.numpy_function(_tf_feed.DeviceCall(on_device, "num_groups", weak), [e], tf.int64, stateful=False,
                                  name="npyfeed_groups")
        return tf.data.Dataset.range(tf.ensure_shape(count, ())).map(lambda g: (e, g))

    def load_group(e, g):
        # The group's upload (host arrays) and start rows.
        storage = on_device.storage
        out = tf.numpy_function(_tf_feed.DeviceCall(on_device, "group", weak), [e, g], (storage, storage) + (tf.int64,) * 4,
                                stateful=False, name="npyfeed_group")
        shapes = [(None, on_device.x_elems), (None, on_device.y_elems)] + [(None,)] * 4
        return tuple(tf.ensure_shape(t, s) for t, s in zip(out, shapes))

    def group_batches(factors, labels, start, lo, hi, y_row):
        # On the device: the group's batches, each one gather from the group's arrays.
        n = tf.shape(start, out_type=tf.int64)[0]
        size = tf.constant(batch_size, tf.int64)

        def one(i):
            a = i * size
            b = tf.minimum(a + size, n)
            x, y = on_device.form(factors, labels, start[a:b], lo[a:b], hi[a:b], y_row[a:b])
            return tf.ensure_shape(x, x_shape), tf.ensure_shape(y, y_shape)

        return tf.data.Dataset.range((n + size - 1) // size).map(one)

    def with_checkpoint_options(ds):
        options = tf.data.Options()
        options.experimental_symbolic_checkpoint = True  # checkpoints hold positions, not prefetched batches
        if on_device is None and native:
            # The stream reads ahead by itself: a prefetch that tf.data would inject is one more thread hop per
            # batch and holds batches for nothing.
            options.experimental_optimization.inject_prefetch = False
            if not _SYNCHRONOUS_MAP:
                options.experimental_optimization.map_parallelization = False  # one take() at a time, in order
        elif on_device is not None:
            # tf.data's default graph rewrites at each iterator's start copy the tensors a function captures (the
            # uploaded arrays: measured, one more copy of them per dataset); this pipeline needs none of them.
            options.experimental_optimization.apply_default_optimizations = False
        return ds.with_options(options)

    def finish_streamed(groups, cardinality):
        # gather="device", streamed: `groups` are the passes' (e, g); each group uploaded once, then its batches.
        ds = groups.map(load_group, num_parallel_calls=1, deterministic=True)
        ds = ds.prefetch(1)  # the next group read while the current one is consumed
        on_host = _is_host(target)
        if not on_host:
            ds = ds.apply(tf.data.experimental.copy_to_device(target))
        with tf.device(target):
            if not on_host:
                ds = ds.prefetch(1)  # and uploaded while the current one is consumed
            ds = ds.flat_map(group_batches).apply(tf.data.experimental.assert_cardinality(cardinality))
            return with_checkpoint_options(ds.prefetch(2))

    def finish(positions, cardinality):
        # `positions`: the passes' (e, b) (one_epoch), or streamed their (e, g) (epoch_groups).
        if on_device is not None and on_device.streams:
            return finish_streamed(positions, cardinality)
        if on_device is None:
            if native:
                # The op takes the batch from the stream, which gathers the next ones meanwhile: no prefetch, no
                # thread hop.
                ds = _map_in_caller(positions, load)
            else:
                # The fallback's numpy_function needs the GIL: in TensorFlow's threads, beside the caller's.
                ds = positions.map(load, num_parallel_calls=1, deterministic=True)
            ds = ds.apply(tf.data.experimental.assert_cardinality(cardinality))
            ds = with_checkpoint_options(ds if native else ds.prefetch(tf.data.AUTOTUNE))
            if device is not None:
                ds = ds.apply(tf.data.experimental.prefetch_to_device(device))
            return ds
        ds = positions.map(start_rows, num_parallel_calls=1, deterministic=True)
        ds = ds.apply(tf.data.experimental.assert_cardinality(cardinality))
        ds = with_checkpoint_options(ds.prefetch(tf.data.AUTOTUNE))
        if _is_host(target):
            return ds.map(form, num_parallel_calls=1, deterministic=True).prefetch(2)
        # The start rows go to the device; the batch is formed there, by a map that runs on the device.
        ds = ds.apply(tf.data.experimental.copy_to_device(target))
        with tf.device(target):
            return ds.map(form, num_parallel_calls=1, deterministic=True).prefetch(2)

    def repeat(count):
        count = -1 if count is None else int(count)
        if count < 0:
            epochs, cardinality = tf.data.Dataset.range(epoch, _checks.EPOCH_LIMIT), tf.data.INFINITE_CARDINALITY
        else:
            epochs, cardinality = tf.data.Dataset.range(epoch, epoch + count), count * steps
        with host_scope():
            ds = finish(epochs.flat_map(per_epoch), cardinality)
        if device is not None or (on_device is not None and not _is_host(target)):
            return _hold(ds, batches, registration, on_device)
        return _hold(_Dataset(ds), batches, registration, on_device)

    per_epoch = epoch_groups if on_device is not None and on_device.streams else one_epoch
    with host_scope():
        ds = finish(tf.data.Dataset.range(1).map(start_pass).flat_map(per_epoch), steps)
    if device is not None or (on_device is not None and not _is_host(target)):
        return _hold(ds, batches, registration, on_device)
    return _hold(_Dataset(ds, repeat), batches, registration, on_device)  # (its repeat() reads consecutive epochs)


def _hold(ds, batches, registration, on_device=None):
    """The dataset holds the plan (see `_tf_feed.FallbackGather`) and, on the native path, the feed's
    `registration` its graph names by id: an
    iterator holds its dataset, so the feed stays registered while anything can still ask it for a batch. With
    gather="device" it also holds the arrays on the device (`_device.DeviceGather`)."""
    ds._npyfeed_batches = batches
    ds._npyfeed_feed = registration
    ds._npyfeed_device = on_device
    # Live statistics of its plan (npyfeed.stats): on this dataset object, not on datasets derived from it.
    ds._stats_core = lambda: batches.stats
    ds.stats = lambda: _stats.as_dict(batches.stats.counts())
    return ds




def _default_device() -> str:
    """Where an op made here would run: the device of an enclosing ``tf.device`` scope (also the replica's device
    when a strategy calls a dataset function per replica), else TensorFlow's default, the first GPU it sees,
    else the CPU."""
    if tf.executing_eagerly():
        placed = tf.zeros(()).device
        if placed:
            return placed
    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else "/cpu:0"


def _is_host(device: str) -> bool:
    """Whether `device` is the host's first CPU, where tf.data runs (no copy to another device)."""
    spec = tf.DeviceSpec.from_string(device)
    return (spec.device_type or "CPU").upper() == "CPU" and not spec.device_index


def _check_device(device: str) -> None:
    """A device TensorFlow has: an unknown one is refused here, at construction."""
    spec = tf.DeviceSpec.from_string(device)
    kind = (spec.device_type or "CPU").upper()
    known = tf.config.list_logical_devices(kind)
    index = spec.device_index or 0
    if index >= len(known):
        raise ValueError(f"device {device!r}: TensorFlow sees {len(known)} {kind} device(s) "
                         f"({', '.join(d.name for d in known) or 'none'})")



class _Dataset(dataset_ops.UnaryUnchangedStructureDataset):
    """A host pipeline's dataset: its ``repeat()`` reads consecutive epochs from a native (checkpointed) range
    (`repeat` None: the one `dataset` returned, whose repeat is TensorFlow's), and its iterators hand out batches
    with less Python per step (`_Iterator`)."""

    def __init__(self, ds, repeat=None):
        self._repeat = repeat
        super().__init__(ds, ds._variant_tensor)

    def repeat(self, count=None, name=None):
        """Epochs ``epoch, epoch + 1, ...``: `count` of them (None or -1: forever), checkpointable."""
        if self._repeat is None:
            return super().repeat(count, name=name)
        return self._repeat(count)

    def __iter__(self):
        if tf.executing_eagerly() or tf.inside_function():
            with ops.colocate_with(self._variant_tensor):  # as TensorFlow's own __iter__
                return _Iterator(self)
        return super().__iter__()  # (raises TensorFlow's own error)


class _Iterator(iterator_ops.OwnedIterator):
    """TensorFlow's iterator, with a shorter eager step: an eager ``next()`` of ``OwnedIterator`` switches to a new
    synchronous executor and back, and repacks the element through ``tf.nest``, per batch (measured: a quarter of
    an eager loop's Python time per step). Where the thread's executor is already synchronous (TensorFlow's
    default), this reads ``(x, y)`` straight from the iterator op; otherwise, and in graphs, TensorFlow's own
    ``next()``. Saved, restored and traced as an ``OwnedIterator``."""

    def _next_internal(self):
        if not tf.executing_eagerly() or context.context().executor.is_async():
            return super()._next_internal()
        x, y = gen_dataset_ops.iterator_get_next(self._iterator_resource, output_types=self._flat_output_types,
                                                 output_shapes=self._flat_output_shapes)
        return x, y


def _map_in_caller(ds, fn):
    """``ds.map(fn)`` that calls `fn` in the thread asking for the element, one call at a time: no thread pool, no
    other thread to wake per batch (``use_inter_op_parallelism=False``; tf.data's own map runs its function on
    TensorFlow's inter-op pool, whose idle workers spin), never made parallel by tf.data's rewrites
    (``force_synchronous``, or where TensorFlow lacks it, ``map_parallelization`` off in the options)."""
    if _SYNCHRONOUS_MAP:
        return map_op._MapDataset(ds, fn, force_synchronous=True, use_inter_op_parallelism=False,
                                  preserve_cardinality=True)
    return map_op._MapDataset(ds, fn, use_inter_op_parallelism=False, preserve_cardinality=True)


#: Whether this TensorFlow's map takes ``force_synchronous`` (2.16 and later; 2.15 does not).
_SYNCHRONOUS_MAP = "force_synchronous" in inspect.signature(map_op._MapDataset.__init__).parameters




class StatsCallback(_stats.EpochStatsCallback, tf.keras.callbacks.Callback):
    """A Keras callback (``tf.keras``: Keras 2 or 3) that reports, per epoch, whether training waited for input.

    Over each epoch it reads the pipeline's live statistics (`npyfeed.stats`): prints one line (``verbose=1``)
    such as ``input-bound: the model waited 63% of its time for batches (...)``, adds
    ``npyfeed_wait_fraction`` and ``npyfeed_samples_per_second`` to the logs (so to the ``History``), keeps the
    epoch's stats dict in ``epochs``, and with `log_dir` writes them as TensorBoard scalars (``tf.summary``,
    ``npyfeed/<field>`` at step = epoch).

    Parameters
    ----------
    source
        A dataset returned by `dataset` (its plan), a `WindowSource` (all its pipelines) or a `Plan`.
    log_dir : str, optional
        A TensorBoard log folder (e.g. the ``TensorBoard`` callback's, or a folder of its own).
    verbose : int
        1 (default): one line per epoch; 0: silent.

    Examples
    --------
    >>> ds = npyfeed.tf.dataset(src, 256, shuffle=True)                                      # doctest: +SKIP
    >>> model.fit(ds, epochs=3, callbacks=[npyfeed.tf.StatsCallback(ds, log_dir="logs")])  # doctest: +SKIP
    """

    #: The fields written to TensorBoard.
    SCALARS = ("wait_fraction", "samples_per_second", "wait_seconds", "gather_seconds", "read_ahead", "block_waits",
               "block_bytes_read", "device_bytes")

    def __init__(self, source, *, log_dir: str | None = None, verbose: int = 1):
        super().__init__(source, verbose=verbose)
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self._writer = None

    def _write(self, epoch: int, stats: dict) -> None:
        if self.log_dir is None:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        # tf.summary.write with the scalars plugin's metadata is what tf.summary.scalar writes; that one needs the
        # TensorBoard package, which TensorFlow no longer installs.
        metadata = summary_pb2.SummaryMetadata()
        metadata.plugin_data.plugin_name = "scalars"
        with self._writer.as_default():
            for name in self.SCALARS:
                tf.summary.write(f"npyfeed/{name}", tf.constant(float(stats[name]), tf.float32), step=epoch,
                                 metadata=metadata.SerializeToString())
        self._writer.flush()
