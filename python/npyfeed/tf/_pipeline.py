"""The pipelines behind `npyfeed.tf.dataset`, one builder each: `host_pipeline` (the native feed's, or the
fallback's) and `device_pipeline` (resident or streamed arrays). Imported by `npyfeed.tf` only (it imports
TensorFlow); the feeds they call are in `_feed`.

Every pipeline is native ``tf.data`` over positions, mapped through a gather of "batch b of epoch e"::

    range(1).map(next pass's epoch) -> flat_map(e: zip(e repeated, range(batches)))    # positions (e, b)
      -> map(gather "batch b of epoch e"), in the thread that asks

The gather takes the batch from the plan (``WindowSource.plan``, ``Plan.take``: a C++ stream positioned at the
next batch): the stream keeps the gathers of the next ``prefetch`` batches in flight by itself, as the numpy
iterator does, so the thread pool never waits for TensorFlow's hand-off. So on the native path the pipeline has
no ``prefetch`` of TensorFlow's and its map runs in the calling thread (`_compat.map_in_caller`; the fallback
keeps a parallel map of one call and a ``prefetch``): a step's ``next()`` takes a ready batch with no other thread
woken (a ``prefetch`` and a parallel map each cost a thread hop per batch, and TensorFlow's idle inter-op workers
spin; measured, 0.7-1 ms of CPU per batch on other threads, most of what an eager loop lost against the numpy
iterator). The dataset's iterator (`_compat.HostIterator`) also skips TensorFlow's per-step executor switch in
an eager loop, and in a graph takes the batch in the step's own thread (no hop to the iterator's background
thread). A request for exactly the next batch is served from the stream; any other position (a restored
checkpoint, a new epoch, a jump) starts a new stream there, so every batch is still a function of its position
alone (and calls from several TensorFlow threads would be correct, only slower). Its iterator is checkpointable
(``tf.train.Checkpoint``): with symbolic checkpointing (``tf.data.Options.experimental_symbolic_checkpoint``) the
state is the positions (a few bytes), never batches, and a restored iterator gathers the same batches again.

TensorFlow's private API: this module uses public ``tf.data`` only; the map in the calling thread and the dataset
and iterator classes come from `_compat`, which falls back to public API (the same batches, more slowly) where
a TensorFlow release lacks what they need. What npyfeed keeps for a dataset it returned (its plan, the feed's
registration, the arrays on the device, where its passes start) is in a registry of its own (`pipeline_of`), not
in attributes of TensorFlow's objects.

``shuffle="blocks"``: a blocks epoch is read in order (files whole, within a memory budget); its stream also
reads the blocks ahead within the budget.

Epochs: the feed's counter gives each pass over the dataset the next epoch, from its first batch, or where
`PassControl` put it (Keras' epoch and step, through `npyfeed.tf.EpochCallback`); ``dataset(...).repeat(count)``
reads epochs ``epoch, epoch + 1, ...`` from a native range, so the epoch is part of the checkpointed position and
a restored repeat continues across the epoch boundary.

``gather="device"``: the host part of the pipeline (positions, start rows) runs on the host's CPU, whatever
device scope it is made in (a strategy calls a dataset function per replica in its replica's scope); the batch is
formed on the target device by `_device.DeviceGather`.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from .. import _checks, _core
from .. import stats as _stats
from .._device_budget import storage_name
from . import _compat, _feed


class _BatchSpec(NamedTuple):
    """The dtype and shapes of a pipeline's batches (``B`` is None unless `drop_remainder`)."""

    dtype: tf.DType
    x_shape: tuple
    y_shape: tuple

    @classmethod
    def of(cls, src, batch_size: int, drop_remainder: bool) -> _BatchSpec:
        batch_dim = int(batch_size) if drop_remainder else None
        return cls(tf.as_dtype(np.dtype(src.dtype)), (batch_dim, *src.x_shape), (batch_dim, *src.y_shape))

    def ensure(self, x, y):
        return tf.ensure_shape(x, self.x_shape), tf.ensure_shape(y, self.y_shape)


def host_pipeline(src, plan, batch_size: int, drop_remainder: bool, epoch: int, device: str | None):
    """``gather="host"``: npyfeed's C++ gather forms each batch in host memory, taken by the feed's op (native) or
    ``numpy_function`` (the fallback), and sent to `device` (if given) by ``prefetch_to_device``."""
    batches = plan._core
    spec = _BatchSpec.of(src, batch_size, drop_remainder)
    feed, registration = _feed.open_feed(batches, epoch, spec.dtype)
    build = _host_native if isinstance(feed, _feed.NativeFeed) else _host_fallback
    finish = build(feed, spec, device)
    passes = PassControl(feed, registration, epoch, len(batches), mid_epoch=True)
    return _assemble(_epoch_positions(feed, len(batches)), feed.start_pass, finish, epoch=epoch, steps=len(batches),
                     hold=functools.partial(_hold, batches=batches, registration=registration, passes=passes),
                     on_host=device is None)


def _host_native(feed, spec: _BatchSpec, device: str | None):
    """The native feed's host pipeline: the op takes the batch from the stream, which gathers the next ones
    meanwhile: no prefetch, no thread hop."""

    def load(e, b):
        return spec.ensure(*feed.take(e, b))

    def finish(positions, cardinality):
        ds = _compat.map_in_caller(positions, load).apply(tf.data.experimental.assert_cardinality(cardinality))
        options = _pipeline_options()
        # The stream reads ahead by itself: a prefetch that tf.data would inject is one more thread hop per batch
        # and holds batches for nothing.
        options.experimental_optimization.inject_prefetch = False
        if not _compat.map_is_synchronous():
            options.experimental_optimization.map_parallelization = False  # one take() at a time, in order
        return _prefetch_to(device, ds.with_options(options))

    return finish


def _host_fallback(feed, spec: _BatchSpec, device: str | None):
    """The fallback's host pipeline: its ``numpy_function`` needs the GIL, so it runs in TensorFlow's threads,
    beside the caller's (a parallel map of one call and a ``prefetch``)."""

    def load(e, b):
        return spec.ensure(*feed.take(e, b))

    def finish(positions, cardinality):
        ds = positions.map(load, num_parallel_calls=1, deterministic=True)
        ds = ds.apply(tf.data.experimental.assert_cardinality(cardinality))
        return _prefetch_to(device, ds.prefetch(tf.data.AUTOTUNE).with_options(_pipeline_options()))

    return finish


def _prefetch_to(device: str | None, ds):
    return ds if device is None else ds.apply(tf.data.experimental.prefetch_to_device(device))


def device_pipeline(src, plan, batch_size: int, drop_remainder: bool, epoch: int, device: str | None,
                    storage_dtype, device_memory_budget: int | None):
    """``gather="device"``: the arrays uploaded to `device` (default: `_default_device`), each batch formed there
    (`_device.DeviceGather`); resident, or streamed block by block over `device_memory_budget`."""
    from ._device import DeviceGather

    batches = plan._core
    storage = storage_name(src, storage_dtype)
    # The host half is the core's (the arrays read through the source's readers, the start rows); it checks
    # `storage_dtype` and refuses a source that transforms its rows.
    host_rows = _core.DeviceRows(batches, storage)
    target = device if device is not None else _default_device()
    _check_device(target)
    on_device = DeviceGather(src, plan, host_rows, target, device_memory_budget)
    spec = _BatchSpec.of(src, batch_size, drop_remainder)
    # The feed counts the passes' epochs and hands out the start rows and groups (native ops: no Python per step).
    feed, registration = _feed.open_feed(batches, epoch, spec.dtype, on_device)
    if on_device.streams:
        per_epoch, finish = _device_streamed(feed, on_device, spec, target)
    else:
        per_epoch, finish = _epoch_positions(feed, len(batches)), _device_resident(feed, on_device, spec, target)
    # A streamed epoch's groups are uploaded in order: its passes start at an epoch's first batch only.
    passes = PassControl(feed, registration, epoch, len(batches), mid_epoch=not on_device.streams)
    return _assemble(per_epoch, feed.start_pass, finish, epoch=epoch, steps=len(batches),
                     hold=functools.partial(_hold, batches=batches, registration=registration, passes=passes,
                                            on_device=on_device),
                     on_host=device is None and _is_host(target), host_scope=functools.partial(tf.device, "/cpu:0"))


def _device_resident(feed, on_device, spec: _BatchSpec, target: str):
    """Arrays resident on `target`: each step's start rows from the host, the batch formed by a map on `target`."""

    def start_rows(e, b):
        # The host's part of a step, four int64 vectors of B (no window crosses to the device).
        return tuple(tf.ensure_shape(t, (None,)) for t in feed.start_rows(e, b))

    def form(start, lo, hi, y_row):
        return spec.ensure(*on_device.form(on_device.factors, on_device.labels, start, lo, hi, y_row))

    def finish(positions, cardinality):
        ds = positions.map(start_rows, num_parallel_calls=1, deterministic=True)
        ds = ds.apply(tf.data.experimental.assert_cardinality(cardinality))
        ds = ds.prefetch(tf.data.AUTOTUNE).with_options(_device_options())
        if _is_host(target):
            return ds.map(form, num_parallel_calls=1, deterministic=True).prefetch(2)
        # The start rows go to the device; the batch is formed there, by a map that runs on the device.
        ds = ds.apply(tf.data.experimental.copy_to_device(target))
        with tf.device(target):
            return ds.map(form, num_parallel_calls=1, deterministic=True).prefetch(2)

    return finish


def _device_streamed(feed, on_device, spec: _BatchSpec, target: str):
    """Arrays streamed to `target`: each epoch's groups of batches, each group uploaded once (the next while the
    current one is consumed), then its batches formed on `target`. Returns the positions of an epoch (its groups
    ``(e, g)``) and the pipeline over them."""

    def epoch_groups(e, first=None):
        # Epoch e's groups of batches, as (e, g) like _epoch_positions' (e, b). A pass starts at the first batch
        # (`first` is 0: PassControl refuses another for this pipeline).
        e = tf.ensure_shape(feed.seen(e), ())
        return tf.data.Dataset.range(tf.ensure_shape(feed.num_groups(e), ())).map(lambda g: (e, g))

    def load_group(e, g):
        # The group's upload (host arrays), start rows and the end of each of its batches in them.
        out = feed.group(e, g, on_device.storage)
        shapes = [(None, on_device.x_elems), (None, on_device.y_elems)] + [(None,)] * 5
        return tuple(tf.ensure_shape(t, s) for t, s in zip(out, shapes))

    def group_batches(factors, labels, start, lo, hi, y_row, ends):
        # On the device: the group's batches, as the core cut them, each one gather from the group's arrays.
        begins = tf.concat([tf.zeros([1], tf.int64), ends[:-1]], 0)

        def one(a, b):
            return spec.ensure(*on_device.form(factors, labels, start[a:b], lo[a:b], hi[a:b], y_row[a:b]))

        return tf.data.Dataset.from_tensor_slices((begins, ends)).map(one)

    def finish(groups, cardinality):
        ds = groups.map(load_group, num_parallel_calls=1, deterministic=True)
        ds = ds.prefetch(1)  # the next group read while the current one is consumed
        on_host = _is_host(target)
        if not on_host:
            ds = ds.apply(tf.data.experimental.copy_to_device(target))
        with tf.device(target):
            if not on_host:
                ds = ds.prefetch(1)  # and uploaded while the current one is consumed
            ds = ds.flat_map(group_batches).apply(tf.data.experimental.assert_cardinality(cardinality))
            return ds.prefetch(2).with_options(_device_options())

    return epoch_groups, finish


def _epoch_positions(feed, steps: int):
    """Epoch e's positions ``(e, b)``, b in ``range(first, steps)``, as a function of e (a pass: of ``(e, first)``)
    for ``flat_map``."""

    def one_epoch(e, first=None):
        # Also called when a checkpointed iterator is restored into epoch e: the next pass continues after it.
        e = tf.ensure_shape(feed.seen(e), ())
        first = tf.constant(0, tf.int64) if first is None else tf.ensure_shape(first, ())
        # (e, b) by a zip, not a map: no function call per batch.
        return tf.data.Dataset.zip((tf.data.Dataset.from_tensors(e).repeat(steps - first),
                                    tf.data.Dataset.range(first, steps)))

    return one_epoch


def _assemble(per_epoch, start_pass, finish, *, epoch: int, steps: int, hold, on_host: bool,
              host_scope=contextlib.nullcontext):
    """The dataset a pipeline returns: each pass starts where `start_pass` says (the next epoch's first batch,
    unless `PassControl` moved it), its positions (`per_epoch`) turned into batches by `finish(positions,
    cardinality)`, made inside `host_scope`. Where its batches end on the host (`on_host`), a
    `_compat.HostDataset`, whose ``repeat()`` reads consecutive epochs from a native range (without TensorFlow's
    private API: TensorFlow's dataset and ``repeat()``).

    A pass that starts at batch k of an epoch (Keras' step k, restored mid-epoch) has ``steps - k`` batches, and
    Keras asks for no more; its cardinality still says ``steps``."""

    def repeat(count):
        count = -1 if count is None else int(count)
        if count < 0:
            epochs, cardinality = tf.data.Dataset.range(epoch, _checks.EPOCH_LIMIT), tf.data.INFINITE_CARDINALITY
        else:
            epochs, cardinality = tf.data.Dataset.range(epoch, epoch + count), count * steps
        with host_scope():
            ds = finish(epochs.flat_map(per_epoch), cardinality)
        # Its epochs are the range's, not Keras': no passes to start.
        return hold(_compat.host_dataset(ds) if on_host else ds, passes=None)

    with host_scope():
        ds = finish(tf.data.Dataset.range(1).map(start_pass).flat_map(per_epoch), steps)
    return hold(_compat.host_dataset(ds, repeat) if on_host else ds)


def _pipeline_options() -> tf.data.Options:
    """The options of every pipeline: symbolic checkpoints, and no autotuning model.

    With autotuning on (tf.data's default), each iterator runs a model thread that wakes at periods doubling from
    10 ms to a minute, and deleting the iterator waits for the end of the current period (TensorFlow 2.15 and 2.21;
    measured in docs/tensorflow.md, "No autotuning thread": a ``fit`` whose last step ended 4.3 s in returned at
    5.11 s, the sum of the periods from 10 ms to 2.56 s). Keras deletes its iterator at the end of every
    ``fit``/``evaluate``/``predict``, so each call lost up to a period. These pipelines have nothing to tune (the
    stream reads ahead by itself); a ``prefetch(AUTOTUNE)`` still sizes its buffer by itself, and a parallel map
    appended with ``AUTOTUNE`` runs at the runner's parallelism (``options.autotune.enabled = True`` turns the
    model back on)."""
    options = tf.data.Options()
    options.experimental_symbolic_checkpoint = True  # checkpoints hold positions, not prefetched batches
    options.autotune.enabled = False
    return options


def _device_options() -> tf.data.Options:
    options = _pipeline_options()
    # tf.data's default graph rewrites at each iterator's start copy the tensors a function captures (the uploaded
    # arrays: measured, one more copy of them per dataset); this pipeline needs none of them.
    options.experimental_optimization.apply_default_optimizations = False
    return options


class Pipeline(NamedTuple):
    """What npyfeed keeps for a dataset `npyfeed.tf.dataset` returned (`pipeline_of`), for as long as the dataset
    lives: an iterator holds its dataset, so all of this stays while anything can still ask for a batch."""

    #: The plan (its ``_core``): the native feed's batches come from it, the fallback's gather holds it weakly.
    batches: object
    #: The native feed's registration, whose id the graph names (None for the fallback).
    registration: object
    #: gather="device": the arrays on the device (`_device.DeviceGather`); else None.
    device: object
    #: Where its passes start (`PassControl`), for `npyfeed.tf.EpochCallback`; None for ``repeat()``'s dataset.
    passes: PassControl | None


#: The datasets `npyfeed.tf.dataset` returned (and their ``repeat()``), each with its `Pipeline`; an entry goes
#: with its dataset. Keyed by the dataset object (tf.data datasets hash by identity).
_pipelines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pipeline_of(ds) -> Pipeline | None:
    """The `Pipeline` of `ds`, a dataset `npyfeed.tf.dataset` returned (or its ``repeat()``); None for any other
    object (datasets derived from it included)."""
    try:
        return _pipelines.get(ds)
    except TypeError:  # not weakly referenceable, or not hashable: not one of ours
        return None


def _hold(ds, batches, registration, passes, on_device=None):
    """Registers `ds` as a pipeline's dataset: its `Pipeline` (the plan, the native feed's `registration`, the
    arrays on the device, its `passes`) lives as long as it does, and its plan's statistics are npyfeed's
    statistics of it (`npyfeed.stats`: of this dataset object, not of datasets derived from it)."""
    _pipelines[ds] = Pipeline(batches, registration, on_device, passes)
    _stats.register(ds, batches.stats)
    # The one attribute set on TensorFlow's object: ``ds.stats()``, public API (docs: live statistics).
    ds.stats = lambda: _stats.as_dict(batches.stats.counts())
    return ds


class PassControl:
    """Where the next pass over a pipeline starts, for `npyfeed.tf.EpochCallback`: the feed's counter (native or
    fallback) set to epoch ``epoch + keras_epoch``, at batch `batch` (Keras' first step of the epoch).

    `mid_epoch`: whether a pass may start after an epoch's first batch (not for streamed ``gather="device"``,
    whose groups are uploaded in order)."""

    def __init__(self, feed, registration, epoch: int, num_batches: int, *, mid_epoch: bool):
        # The native feed's counter is in _core (the registration's); the fallback's is the feed's own.
        self._set = feed.set_next_pass if registration is None else registration.set_next_pass
        self.first_epoch = epoch
        self.num_batches = num_batches
        self._mid_epoch = mid_epoch

    def start(self, keras_epoch: int, batch: int = 0) -> None:
        """The next pass reads epoch ``first_epoch + keras_epoch`` from batch `batch` on."""
        if batch and not self._mid_epoch:
            raise ValueError(f"npyfeed.tf: Keras starts its epoch {keras_epoch} at step {batch}, and a streamed "
                             "gather='device' pipeline (shuffle='blocks' over device_memory_budget) starts a pass "
                             "at an epoch's first batch only: checkpoint once per epoch (BackupAndRestore's "
                             "default save_freq='epoch'), or use gather='host'")
        self._set(_checks.epoch(self.first_epoch + keras_epoch), batch)


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
