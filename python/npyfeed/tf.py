"""`tf.data` pipelines over a `WindowSource`. This is the only module that imports TensorFlow.

``import npyfeed`` never imports TensorFlow; ``import npyfeed.tf`` (or the attribute ``npyfeed.tf``) does.
The pipeline is a ``Dataset.from_generator`` over ``src.batches(...)``: TensorFlow calls the generator from
its own threads, and each call waits for the C++ gather with the GIL released. No custom ops, so nothing
depends on TensorFlow's C++ ABI.

Zero copy: TensorFlow adopts a 64-byte-aligned numpy array handed to it by a generator without copying it
(and copies any other; numpy's own large allocations sit at 16 mod 64). Batch buffers are 64-byte aligned,
and a buffer is reused only after every reference to its batch, TensorFlow's included, is gone.

Shutdown: a ``from_generator`` call that is in flight when the interpreter starts finalizing never
finishes (CPython ends a thread that asks for the GIL after finalization began), so the prefetch iterator's
destructor, run by the main thread during finalization, waits for it forever. An `atexit` hook, which
runs while other threads can still take the GIL, therefore ends every epoch of every dataset made here and
waits (GIL released) until no generator call is in flight and the pipelines have gone quiet.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
import weakref

import numpy as np
import tensorflow as tf

__all__ = ["dataset"]

log = logging.getLogger("npyfeed")


def dataset(src, batch_size: int, *, shuffle: bool | str = False, seed: int = 0, drop_remainder: bool = False,
            device: str | None = None, input_context=None, prefetch: int = 2,
            memory_budget: int | None = None) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(x, y)`` batches from `src`; each pass over it is a new epoch.

    Parameters
    ----------
    src : WindowSource
    batch_size : int
        Batch size; with `input_context`, the *global* batch size, split evenly over the replicas.
    shuffle : bool or "blocks"
        Shuffle the samples: a seeded permutation of all samples per epoch, a new one each pass. ``"blocks"``
        (data sets larger than RAM): each file read once per epoch, whole, within `memory_budget`; see
        ``WindowSource.batches``.
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
    prefetch : int
        Batches the C++ side gathers ahead, in addition to TensorFlow's own ``prefetch(AUTOTUNE)``.
    memory_budget : int, optional
        With ``shuffle="blocks"``: bytes of array data held at once (default ``WindowSource.batches``'s).

    Returns
    -------
    tf.data.Dataset
        Elements ``(x, y)`` of dtype ``src.dtype`` and shapes ``(B, *src.x_shape)`` and ``(B, *src.y_shape)``
        (``B`` is None unless `drop_remainder`). Pass ``n`` (counting from 0) reads epoch ``n``: every
        iterator made over the dataset (a ``for`` loop, a Keras epoch, a ``repeat()``) starts the next one.
        Its cardinality is the number of batches per pass.

    Raises
    ------
    ValueError
        Bad arguments (also a global batch size that the replicas do not divide).
    """
    num_shards, shard_index = 1, 0
    if input_context is not None:
        if device is not None:
            raise ValueError("device= and input_context= exclude each other: under tf.distribute the strategy "
                             "copies the batches to its replicas")
        batch_size = input_context.get_per_replica_batch_size(batch_size)
        num_shards, shard_index = input_context.num_input_pipelines, input_context.input_pipeline_id
    if device is not None and not isinstance(device, str):
        raise TypeError(f"device must be a device name such as '/gpu:0', not {type(device).__name__}")
    options = dict(batch_size=batch_size, shuffle=shuffle if isinstance(shuffle, str) else bool(shuffle), seed=seed,
                   num_shards=num_shards, shard_index=shard_index, drop_remainder=bool(drop_remainder),
                   prefetch=prefetch)
    if memory_budget is not None:
        options["memory_budget"] = memory_budget
    # Check every argument here, where an error is readable, not in TensorFlow's thread at the first batch.
    src.batches(**options).close()
    steps = src.num_batches(batch_size, num_shards=num_shards, shard_index=shard_index,
                            drop_remainder=bool(drop_remainder))

    dtype = tf.as_dtype(np.dtype(src.dtype))
    batch_dim = int(batch_size) if drop_remainder else None
    signature = (tf.TensorSpec((batch_dim, *src.x_shape), dtype), tf.TensorSpec((batch_dim, *src.y_shape), dtype))
    with _state:
        _state.touch()  # from now on the exit hook waits for TensorFlow's threads to go quiet
    ds = tf.data.Dataset.from_generator(_Feed(src, options), output_signature=signature)
    ds = ds.apply(tf.data.experimental.assert_cardinality(steps))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    if device is not None:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device))
    return ds


class _Feed:
    """The generator `from_generator` calls once per iterator: each call starts the next epoch."""

    def __init__(self, src, options: dict):
        self._src = src
        self._options = options
        self._epochs = itertools.count()

    def __call__(self):
        if not _state.enter():
            return iter(())
        try:
            feed = _Epoch(self._src.batches(epoch=next(self._epochs), **self._options))
            with _state:
                _state.epochs.add(feed)  # if the exit hook started meanwhile, feed's first next() stops it
            return feed
        finally:
            _state.leave()


class _Epoch:
    """One pass, as the iterator `from_generator` pulls from; stops at once when the interpreter exits."""

    def __init__(self, batches):
        self._batches = batches
        # A BatchIterator is not meant to be used by two threads at once: close() from the exit hook must not
        # overlap a next() in TensorFlow's thread.
        self._lock = threading.Lock()

    def __iter__(self):
        return self

    def __next__(self):
        if not _state.enter():
            self.close()
            raise StopIteration
        try:
            with self._lock:
                batches = self._batches
                if batches is None:
                    raise StopIteration
                try:
                    return next(batches)
                finally:
                    if _state.closing:
                        self._batches = None
                        batches.close()
        finally:
            _state.leave()

    def close(self, *, blocking: bool = True) -> bool:
        """Cancels the read-ahead. With ``blocking=False``, leaves an epoch whose next() is in flight alone."""
        if not self._lock.acquire(blocking):
            return False
        try:
            batches, self._batches = self._batches, None
        finally:
            self._lock.release()
        if batches is not None:
            batches.close()
        return True


class _State(threading.Condition):
    """Process-wide bookkeeping for the exit hook: live epochs, generator calls in flight, last activity."""

    def __init__(self):
        super().__init__(threading.Lock())
        self.closing = False
        self.in_flight = 0
        self.epochs = weakref.WeakSet()  # TensorFlow holds the epochs; one goes when TF finalizes its iterator
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


_state = _State()

#: After the exit hook stopped the epochs, it waits for this long without any generator call (enough for a
#: TensorFlow thread that was waiting for the GIL to make its call, see the end, and finalize).
_QUIET_S = 0.2
#: The longest the exit hook waits for gathers in flight.
_EXIT_TIMEOUT_S = 30.0


def _stop_all_feeds() -> None:
    """Exit hook: end every epoch, then wait until no generator call is in flight and all is quiet."""
    with _state:
        if _state.closing:
            return
        _state.closing = True
        if not _state.used:
            return
        _state.touch()
        epochs = list(_state.epochs)
    for feed in epochs:
        feed.close(blocking=False)  # one in flight closes itself when its next() returns
    deadline = time.monotonic() + _EXIT_TIMEOUT_S
    with _state:
        while True:
            now = time.monotonic()
            quiet = now - _state.last_activity
            if _state.in_flight == 0 and (quiet >= _QUIET_S or (not _state.epochs and quiet >= _QUIET_S / 4)):
                return
            if now >= deadline:
                log.warning("npyfeed.tf: %d batch gather(s) still in flight at exit after %.0f s",
                            _state.in_flight, _EXIT_TIMEOUT_S)
                return
            _state.wait(min(_QUIET_S / 4, deadline - now))  # releases the GIL


atexit.register(_stop_all_feeds)
