"""TensorFlow's private API, in one place: the only module of npyfeed that imports ``tensorflow.python``.

What the private surface buys (docs/tensorflow.md, "What the hand-off costs"):

* `map_in_caller`: tf.data's map class built directly, with no inter-op pool (``use_inter_op_parallelism=False``)
  and, where TensorFlow has it, ``force_synchronous``: the native feed's batch is taken in the thread that asks.
* `HostDataset`, `HostIterator`, `HostIteratorSpec`: a dataset whose ``repeat()`` reads consecutive epochs from a
  native range, and its iterator, with a shorter step (eager: no executor switch per batch; in a graph:
  ``IteratorGetNextSync``, the step's own thread takes the batch).

**Checked releases.** `CHECKED_VERSIONS` lists the TensorFlow releases (major, minor) on which every name of
`PRIVATE_NAMES`, `MAP_KEYWORDS` and `INSTANCE_ATTRIBUTES` was checked, with the TensorFlow tests passing: the two
stacks of ``.ci/constraints-floor.txt`` and ``.ci/constraints.txt``. ``tests/test_tf_compat.py`` fails on any
other release (``.ci/latest`` runs the newest one): check the surface there, then add the release.

**Fallback.** A name missing when this module is imported (a module gone, an attribute or a keyword of the map's
class) makes `AVAILABLE` False, and the pipelines take public ``tf.data`` API only: a plain ``map`` (its calls on
TensorFlow's inter-op pool: a thread hop per batch), TensorFlow's own dataset and iterator (its ``repeat()``
reads the next passes; its step switches executors per batch in an eager loop, and hops to the iterator's
thread in a graph). The same batches, more slowly; the first pipeline built says so once, naming what is missing.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading

import tensorflow as tf

log = logging.getLogger("npyfeed")

#: The TensorFlow releases (major, minor) this private surface was checked on: the floor stack (2.15, without
#: ``force_synchronous``) and the current one.
CHECKED_VERSIONS = ((2, 15), (2, 21))

#: Each private module, with what npyfeed takes from it ("A.b": attribute b of A).
PRIVATE_NAMES = {
    "tensorflow.python.autograph.core.ag_ctx": ("control_status_ctx", "Status.DISABLED"),
    "tensorflow.python.data.ops.dataset_ops": ("UnaryUnchangedStructureDataset",),
    "tensorflow.python.data.ops.iterator_ops": ("OwnedIterator", "OwnedIterator._next_internal", "IteratorSpec",
                                                "IteratorSpec._from_components", "GET_NEXT_CALL_ERROR_THRESHOLD",
                                                "GET_NEXT_CALL_ERROR_MESSAGE"),
    "tensorflow.python.data.ops.map_op": ("_MapDataset",),
    "tensorflow.python.data.util.structure": ("from_compatible_tensor_list",),
    "tensorflow.python.eager.context": ("context",),
    "tensorflow.python.framework.ops": ("colocate_with",),
    "tensorflow.python.ops.gen_dataset_ops": ("iterator_get_next", "iterator_get_next_sync"),
}

#: The keywords `map_in_caller` passes to ``_MapDataset`` (and ``force_synchronous``, where it exists: 2.16 on).
MAP_KEYWORDS = ("use_inter_op_parallelism", "preserve_cardinality")

#: Attributes of TensorFlow's own objects that the adapters read: only an object shows them, so the tests check
#: them on real ones (of each kind named here).
INSTANCE_ATTRIBUTES = {
    "dataset": ("_variant_tensor",),
    "OwnedIterator": ("_iterator_resource", "_flat_output_types", "_flat_output_shapes", "_element_spec",
                      "_get_next_call_count"),
    "IteratorSpec": ("_element_spec",),
    "executor": ("is_async",),
}

try:
    from tensorflow.python.autograph.core import ag_ctx
    from tensorflow.python.data.ops import dataset_ops, iterator_ops, map_op
    from tensorflow.python.data.util import structure
    from tensorflow.python.eager import context
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import gen_dataset_ops
except ImportError as e:
    _import_error = e.name or str(e)
else:
    _import_error = None


def _missing() -> list:
    """The private names (of `PRIVATE_NAMES`, `MAP_KEYWORDS`) this TensorFlow lacks, in full."""
    if _import_error is not None:
        return [_import_error]
    out = []
    for path, names in PRIVATE_NAMES.items():
        for name in names:
            obj = importlib.import_module(path)  # imported above: TensorFlow's own module
            for part in name.split("."):
                obj = getattr(obj, part, None)
            if obj is None:
                out.append(f"{path}.{name}")
    if not out:
        parameters = inspect.signature(map_op._MapDataset.__init__).parameters
        out += [f"tensorflow.python.data.ops.map_op._MapDataset({k}=)" for k in MAP_KEYWORDS if k not in parameters]
    return out


#: The private names this TensorFlow lacks (empty: all there).
MISSING = _missing()
#: Whether the private surface is all there; False: the pipelines use public tf.data API only.
AVAILABLE = not MISSING
#: Whether this TensorFlow's map takes ``force_synchronous`` (2.16 and later; 2.15 does not).
SYNCHRONOUS_MAP = AVAILABLE and "force_synchronous" in inspect.signature(map_op._MapDataset.__init__).parameters

_warned = threading.Event()


def version_checked(version: str = tf.__version__) -> bool:
    """Whether TensorFlow `version` (e.g. ``"2.21.0"``) is of a release in `CHECKED_VERSIONS`."""
    major, minor = (int(part) for part in version.split(".")[:2])
    return (major, minor) in CHECKED_VERSIONS


def private_api() -> bool:
    """Whether the pipelines may use the private surface (`AVAILABLE`); where they may not, the first call says
    so once (npyfeed's logger), naming what is missing."""
    if AVAILABLE:
        return True
    if not _warned.is_set():
        _warned.set()
        log.warning("npyfeed.tf: TensorFlow %s lacks %s: the pipelines use public tf.data API only (the same batches; "
                    "the hand-off takes a thread hop per batch, docs/tensorflow.md)", tf.__version__,
                    ", ".join(MISSING))
    return False


def map_in_caller(ds, fn):
    """``ds.map(fn)`` that calls `fn` in the thread asking for the element, one call at a time: no thread pool, no
    other thread to wake per batch (``use_inter_op_parallelism=False``; tf.data's own map runs its function on
    TensorFlow's inter-op pool, whose idle workers spin), never made parallel by tf.data's rewrites
    (``force_synchronous``; where `map_is_synchronous` is False, the caller turns ``map_parallelization`` off in
    the options). Without the private API, TensorFlow's own ``map``."""
    if not private_api():
        return ds.map(fn)
    if SYNCHRONOUS_MAP:
        return map_op._MapDataset(ds, fn, force_synchronous=True, use_inter_op_parallelism=False,
                                  preserve_cardinality=True)
    return map_op._MapDataset(ds, fn, use_inter_op_parallelism=False, preserve_cardinality=True)


def map_is_synchronous() -> bool:
    """Whether `map_in_caller`'s map is kept sequential by itself (``force_synchronous``)."""
    return AVAILABLE and SYNCHRONOUS_MAP


def host_dataset(ds, repeat=None):
    """`ds` as a `HostDataset` (``repeat()``: `repeat`, or TensorFlow's where None); without the private API,
    `ds` itself (TensorFlow's ``repeat()`` and iterator)."""
    return HostDataset(ds, repeat) if private_api() else ds


if AVAILABLE:

    class HostDataset(dataset_ops.UnaryUnchangedStructureDataset):
        """The dataset of a pipeline whose batches end on the host's CPU: its ``repeat()`` reads consecutive epochs
        from a native (checkpointed) range (`repeat` None: the one `npyfeed.tf.dataset` returned, whose repeat is
        TensorFlow's), and its iterators hand out batches with less Python per step (`HostIterator`)."""

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
                    return HostIterator(self)
            return super().__iter__()  # (raises TensorFlow's own error)

    class HostIterator(iterator_ops.OwnedIterator):
        """TensorFlow's iterator, with a shorter step.

        Eager: ``OwnedIterator``'s ``next()`` switches to a new synchronous executor and back, and repacks the
        element through ``tf.nest``, per batch (measured: a quarter of an eager loop's Python time per step). Where
        the thread's executor is already synchronous (TensorFlow's default), this reads ``(x, y)`` straight from the
        iterator op; otherwise TensorFlow's own ``next()``.

        In a graph (a ``tf.function``, Keras' train step): ``IteratorGetNextSync``, which takes the batch in the
        thread running the step, instead of ``IteratorGetNext``, which hands each call to the iterator's background
        thread and wakes the step's thread when it is done (two thread hops per batch). The pipeline's map runs in
        the thread that asks, so blocking it waits on nothing of TensorFlow's pool. A ``tf.function`` the iterator
        is passed to traces it as a `HostIteratorSpec` (its tracing type only), so that it gets this iterator
        again. Otherwise it is an ``OwnedIterator`` to TensorFlow: its type (``tf.data.IteratorSpec``, so
        SavedModel signatures, ``is_compatible_with``, ``tf.nest``), checkpoints, and the guard against unrolled
        ``next()`` calls in a graph without AutoGraph."""

        def _next_internal(self):
            if not tf.executing_eagerly():
                if ag_ctx.control_status_ctx().status == ag_ctx.Status.DISABLED:
                    self._get_next_call_count += 1  # as TensorFlow's: a Python loop unrolled into the graph
                    if self._get_next_call_count > iterator_ops.GET_NEXT_CALL_ERROR_THRESHOLD:
                        raise ValueError(iterator_ops.GET_NEXT_CALL_ERROR_MESSAGE)
                with ops.colocate_with(self._iterator_resource):
                    flat = gen_dataset_ops.iterator_get_next_sync(self._iterator_resource,
                                                                  output_types=self._flat_output_types,
                                                                  output_shapes=self._flat_output_shapes)
                return structure.from_compatible_tensor_list(self._element_spec, flat)
            if context.context().executor.is_async():
                return super()._next_internal()
            x, y = gen_dataset_ops.iterator_get_next(self._iterator_resource, output_types=self._flat_output_types,
                                                     output_shapes=self._flat_output_shapes)
            return x, y

        def __tf_tracing_type__(self, tracing_context):
            return HostIteratorSpec(self.element_spec).__tf_tracing_type__(tracing_context)

    class HostIteratorSpec(iterator_ops.IteratorSpec):
        """How a ``tf.function`` traces a `HostIterator`: its placeholder inside the function is a `HostIterator`
        (not an ``OwnedIterator``). Only a tracing type: the iterator's own type stays TensorFlow's
        ``IteratorSpec``."""

        __slots__ = []

        @property
        def value_type(self):
            return HostIterator

        def _from_components(self, components):
            return HostIterator(dataset=None, components=components, element_spec=self._element_spec)
