"""How `npyfeed.tf`'s pipelines reach their plan: the feed of epochs and batches, and the process bookkeeping of
the Python calls TensorFlow's threads make. Imported by `npyfeed.tf` only (it imports TensorFlow).

Two feeds hand a batch to TensorFlow:

* **Native ops** (`NativeFeed`, the default): ``_tf_ops.so``, an op library registered through TensorFlow's
  stable C API only (``tensorflow/c/ops.h``, ``kernels.h``, ``tf_tensor.h``, ``tf_status.h``), so one binary
  serves TensorFlow 2.15 and later; it is built without TensorFlow and holds no copy of npyfeed's core: it calls
  ``_core`` through a versioned table of C functions (``csrc/npyfeed/tf/tf_feed_abi.h``). ``NpyfeedTake`` returns
  npyfeed's 64-byte aligned batch buffers as the tensors' memory (no copy; a buffer goes back to its pool once
  TensorFlow lets go). No Python runs per batch (nor per pass: the epoch counter is an op too), so the gather
  needs neither the GIL nor an exit hook. **Lifetime:** a graph holds only the feed's id (an int64); the feed
  stays registered in ``_core`` while the dataset lives (an iterator holds its dataset; a dataset made inside a
  ``tf.function`` or a ``tf.compat.v1`` graph is held by that graph: `hold_in_graph`). A call with an id whose
  dataset is gone fails with ``FailedPreconditionError``, never touches freed memory; a call in flight holds its
  feed until it returns, and one still waiting for its gather when the dataset goes stops waiting
  (``CancelledError``, within 50 ms).
* **The fallback** (`FallbackFeed`), ``tf.numpy_function`` (one Python call per batch, GIL released inside):
  used when ``NPYFEED_TF_OPS=0`` or when the op library does not load (one warning says why). TensorFlow adopts a
  64-byte aligned numpy array without copying it.

The exit hook: a ``numpy_function`` call in flight when the interpreter starts finalizing may never finish
(CPython ends a thread that asks for the GIL after finalization began), so an iterator's destructor, run by the
main thread during finalization, could wait for it forever. Every Python call TensorFlow's threads make (the
fallback's gathers and ``gather="device"``'s host half there: `DeviceCall`) enters and leaves `python_calls`, and an
`atexit` hook, `stop_python_calls`, makes further calls fail at once and waits until none is in flight (the
native path never enters it). The design notes of the documentation explain why.

Epochs: a counter (in the native feed, or a Python int behind a ``numpy_function``: `EpochCounter`) gives each
pass over the dataset the next epoch, from its first batch; `set_next_pass` (Keras' epoch, through
`npyfeed.tf.EpochCallback`) puts the next pass at another epoch and batch.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import threading
import time
import weakref

import numpy as np
import tensorflow as tf

from .. import _checks, _core
from .._resources import environment

log = logging.getLogger("npyfeed")

#: The environment variable that chooses the feed: "0" forces the numpy_function fallback.
_OPS_ENV = "NPYFEED_TF_OPS"
_ops_lock = threading.Lock()
_ops_result: list = []  # [module or None] once tried


def native_ops():
    """npyfeed's op library (``_tf_ops.so``), initialised with _core's feed table; None for the
    ``numpy_function`` fallback (``NPYFEED_TF_OPS=0``, or the library does not load: one warning says why)."""
    if environment(_OPS_ENV) == "0":
        return None
    with _ops_lock:
        if not _ops_result:
            _ops_result.append(_load_native_ops())
        return _ops_result[0]


def _load_native_ops():
    path = os.path.join(os.path.dirname(os.path.abspath(_core.__file__)), "_tf_ops.so")  # installed beside _core
    try:
        if not os.path.exists(path):
            raise OSError(f"{path} is not installed")
        ops = tf.load_op_library(path)
        # The same handle as TensorFlow's (dlopen of one path): its init sees the ops' globals.
        init = ctypes.CDLL(path).npyfeed_tf_ops_init
        init.argtypes, init.restype = [ctypes.c_void_p], ctypes.c_int
        code = init(_core.tf_feed_api())
        if code == -2:
            raise RuntimeError(f"{path} did not find TensorFlow's C functions in this process")
        if code != 0:
            raise RuntimeError(f"{path} was built for another version of _core's feed table")
        return ops
    except Exception as e:  # noqa: BLE001 - any failure means the fallback, said once
        log.warning("npyfeed.tf: native ops unavailable (%s: %s); batches go through tf.numpy_function",
                    type(e).__name__, e)
        return None


def open_feed(batches, epoch: int, dtype, on_device=None):
    """The feed of a pipeline over the plan `batches` (its ``_core`` plan), whose first pass reads `epoch`;
    with `on_device` (a `_device.DeviceGather`, ``gather="device"``), also of its start rows and groups.

    Returns ``(feed, registration)``: the feed (`NativeFeed` where the op library loads, else `FallbackFeed`)
    makes the pipeline's ops; `registration` is what the dataset must hold while its graph may call the feed
    (the native feed's registration in ``_core``; None for the fallback, whose calls hold what they need).
    """
    ops = native_ops()
    if ops is None:
        return FallbackFeed(batches, epoch, dtype, on_device), None
    # The graph holds only the feed's id; the feed stays registered while the datasets hold it (an iterator
    # through its dataset; in a graph, the graph itself: hold_in_graph).
    registration = _core.TfFeed(batches, int(epoch), None if on_device is None else on_device.host_rows)
    if not tf.executing_eagerly():
        hold_in_graph(registration)
    return NativeFeed(ops, registration.id, dtype), registration


class NativeFeed:
    """The op library's feed: each method makes one op that names the feed by its id (an int64), so the graph
    holds nothing else of it.

    Parameters
    ----------
    ops
        The op library (`native_ops`).
    feed_id : int
        The id of the feed registered in ``_core`` (``_core.TfFeed``).
    dtype : tf.DType
        The batches' dtype.
    """

    def __init__(self, ops, feed_id: int, dtype):
        self._ops = ops
        self._id = feed_id
        self._dtype = dtype

    def start_pass(self, pass_index):
        """Where a new pass over the dataset starts, ``(epoch, batch)`` (`pass_index`: 0, an element of
        ``range(1)``)."""
        return tuple(self._ops.npyfeed_next_pass(self._id, pass_index, name="npyfeed_next_pass"))

    def seen(self, e):
        """Epoch `e` is read (also by a restored iterator): the next pass reads a later one."""
        return self._ops.npyfeed_seen_epoch(self._id, e, name="npyfeed_epoch")

    def take(self, e, b):
        """Batch `b` of epoch `e`, as ``(x, y)``."""
        return self._ops.npyfeed_take(self._id, e, b, T=self._dtype, name="npyfeed_gather")

    def start_rows(self, e, b):
        """``gather="device"``, resident: batch `b` of epoch `e` as its start rows (four int64 vectors)."""
        return self._ops.npyfeed_start_rows(self._id, e, b, name="npyfeed_rows")

    def num_groups(self, e):
        """``gather="device"``, streamed: the number of groups of epoch `e` (an int64 scalar)."""
        return self._ops.npyfeed_num_groups(self._id, e, name="npyfeed_groups")

    def group(self, e, g, storage):
        """``gather="device"``, streamed: group `g` of epoch `e`, its arrays in `storage` (adopted, no copy), its
        start rows and the end of each of its batches in them (`_device.DeviceGather.group`)."""
        return self._ops.npyfeed_group(self._id, e, g, T=storage, name="npyfeed_group")


class FallbackFeed:
    """The ``numpy_function`` feed: one Python call per batch (`FallbackGather`), one per pass (`EpochCounter`).

    Parameters are those of `NativeFeed`'s, with the plan `batches` and the first pass's `epoch` in place of a
    registered feed.
    """

    def __init__(self, batches, epoch: int, dtype, on_device=None):
        # In a graph (tf.compat.v1, tf.estimator, inside a tf.function) the pipeline outlives the Python dataset,
        # and the graph owns the gather: hold it strongly there.
        weak = tf.executing_eagerly()
        self._gather = FallbackGather(batches, weak=weak)
        self._passes = EpochCounter(epoch, len(batches))
        self._dtype = dtype
        self._on_device = None if on_device is None else {
            method: DeviceCall(on_device, method, weak) for method in ("rows", "num_groups", "group")}
        expect_python_calls()

    def start_pass(self, pass_index):
        """Where a new pass over the dataset starts, ``(epoch, batch)``. `pass_index` is an input as the native
        op's is: without one, TensorFlow runs the call when an iterator is made (a stateless function of
        nothing), not when the pass starts, and a pass set after that (Keras 2 makes an epoch's iterator before
        ``on_epoch_begin``; it also makes one more that it never reads) would come too late."""
        return tuple(tf.numpy_function(self._passes.start, [pass_index], (tf.int64, tf.int64), stateful=False,
                                       name="npyfeed_next_pass"))

    def set_next_pass(self, epoch: int, batch: int) -> None:
        """The next pass starts at batch `batch` of epoch `epoch`; the one after it at epoch ``epoch + 1``."""
        self._passes.set_next(epoch, batch)

    def seen(self, e):
        """Epoch `e` is read (also by a restored iterator): the next pass reads a later one."""
        return tf.numpy_function(self._passes.seen, [e], tf.int64, stateful=False, name="npyfeed_epoch")

    def take(self, e, b):
        """Batch `b` of epoch `e`, as ``(x, y)``."""
        return tf.numpy_function(self._gather, [e, b], (self._dtype, self._dtype), stateful=False,
                                 name="npyfeed_gather")

    def start_rows(self, e, b):
        """``gather="device"``, resident: batch `b` of epoch `e` as its start rows (four int64 vectors)."""
        return tf.numpy_function(self._on_device["rows"], [e, b], (tf.int64,) * 4, stateful=False,
                                 name="npyfeed_rows")

    def num_groups(self, e):
        """``gather="device"``, streamed: the number of groups of epoch `e` (an int64 scalar)."""
        return tf.numpy_function(self._on_device["num_groups"], [e], tf.int64, stateful=False, name="npyfeed_groups")

    def group(self, e, g, storage):
        """``gather="device"``, streamed: group `g` of epoch `e`, its arrays in `storage`, its start rows and the
        end of each of its batches in them (`_device.DeviceGather.group`)."""
        return tf.numpy_function(self._on_device["group"], [e, g], (storage, storage) + (tf.int64,) * 5,
                                 stateful=False, name="npyfeed_group")


#: The feeds' registrations each graph holds (`hold_in_graph`); an entry goes with its graph.
_graph_feeds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_graph_feeds_lock = threading.Lock()


def hold_in_graph(registration) -> None:
    """In a graph (tf.compat.v1, inside a tf.function) the pipeline outlives the Python dataset: the graph holds
    the feed's `registration` (as it holds a ``numpy_function``'s callable), and lets it go with the graph."""
    graph = tf.compat.v1.get_default_graph()
    with _graph_feeds_lock:
        _graph_feeds.setdefault(graph, []).append(registration)


class FallbackGather:
    """Batch b of epoch e, as ``tf.numpy_function`` calls it: one Python call per batch, GIL released inside.

    TensorFlow keeps a ``numpy_function``'s callable (in the traced function's graph) after the dataset is gone,
    so in eager mode this holds the gather (and through it the source, its mappings and buffers) only weakly: the
    datasets returned by `npyfeed.tf.dataset` hold it, and an iterator holds its dataset.
    """

    def __init__(self, batches, weak: bool):
        self._batches = weakref.ref(batches) if weak else (lambda: batches)

    def __call__(self, epoch, batch):
        batches = self._batches()
        if batches is None:
            raise RuntimeError("npyfeed.tf: the dataset was garbage-collected while its pipeline still ran")
        if not python_calls.enter():
            raise RuntimeError("npyfeed.tf: the interpreter is exiting")
        try:
            return batches.take(int(epoch), int(batch))
        finally:
            python_calls.leave()


class DeviceCall:
    """gather="device" on the fallback: a host half of a step (`DeviceGather.rows`, `.num_groups`, `.group`), held
    weakly in eager mode like `FallbackGather`."""

    def __init__(self, on_device, method: str, weak: bool):
        self._device = weakref.ref(on_device) if weak else (lambda: on_device)
        self._method = method

    def __call__(self, *args):
        on_device = self._device()
        if on_device is None:
            raise RuntimeError("npyfeed.tf: the dataset was garbage-collected while its pipeline still ran")
        if not python_calls.enter():  # as FallbackGather: the exit hook waits for calls in flight, refuses new ones
            raise RuntimeError("npyfeed.tf: the interpreter is exiting")
        try:
            return getattr(on_device, self._method)(*args)
        finally:
            python_calls.leave()


class EpochCounter:
    """Where each new pass starts: the next epoch's first batch, or where `set_next` put it. Its calls are
    ``numpy_function(stateful=False)``: a checkpoint does not hold this count (a restored iterator calls `seen`
    with its epoch instead), and TensorFlow need not warn about it. The native feed's counter does the same in
    C++ (``TfFeed::next_pass``)."""

    def __init__(self, epoch: int, num_batches: int):
        self._next = (epoch, 0)
        self._num_batches = num_batches
        self._lock = threading.Lock()

    def start(self, pass_index=None) -> tuple:
        with self._lock:
            epoch, batch = self._next
            self._next = (epoch + 1, 0)
            return np.int64(epoch), np.int64(batch)

    def set_next(self, epoch: int, batch: int) -> None:
        epoch = _checks.epoch(epoch)
        n = self._num_batches
        batch = _checks.integer(batch, "batch", 0, n, what=f"in [0, {n}) (the batches of an epoch)")
        with self._lock:
            self._next = (epoch, batch)

    def seen(self, epoch) -> np.int64:
        with self._lock:
            if self._next[0] <= int(epoch):
                self._next = (int(epoch) + 1, 0)
        return np.int64(epoch)


class PythonCalls(threading.Condition):
    """Process-wide bookkeeping of the Python calls TensorFlow's threads make, for the exit hook: calls in
    flight, last activity."""

    def __init__(self):
        super().__init__(threading.Lock())
        self.closing = False
        self.in_flight = 0
        self.used = False
        self.last_activity = 0.0

    def touch(self) -> None:  # with the lock held
        self.used = True
        self.last_activity = time.monotonic()

    def enter(self) -> bool:
        with self:
            self.touch()
            if self.closing:
                return False
            self.in_flight += 1
            return True

    def leave(self) -> None:
        with self:
            self.in_flight -= 1
            self.touch()
            self.notify_all()


python_calls = PythonCalls()

#: After the exit hook stopped new calls, it waits for this long without any call (enough for a TensorFlow
#: thread that was waiting for the GIL to make its call, see the end, and finalize).
_QUIET_S = 0.2
#: The longest the exit hook waits for calls in flight.
_EXIT_TIMEOUT_S = 30.0


def expect_python_calls() -> None:
    """A pipeline whose steps call Python was made: from now on the exit hook waits for TensorFlow's threads to
    go quiet."""
    with python_calls:
        python_calls.touch()


def stop_python_calls() -> None:
    """Exit hook: make further calls fail, then wait until none is in flight and all is quiet."""
    with python_calls:
        if python_calls.closing:
            return
        python_calls.closing = True
        if not python_calls.used:
            return
        python_calls.touch()
    deadline = time.monotonic() + _EXIT_TIMEOUT_S
    with python_calls:
        while True:
            now = time.monotonic()
            if python_calls.in_flight == 0 and now - python_calls.last_activity >= _QUIET_S:
                return
            if now >= deadline:
                log.warning("npyfeed.tf: %d batch gather(s) still in flight at exit after %.0f s",
                            python_calls.in_flight, _EXIT_TIMEOUT_S)
                return
            python_calls.wait(min(_QUIET_S / 4, deadline - now))  # releases the GIL


atexit.register(stop_python_calls)
