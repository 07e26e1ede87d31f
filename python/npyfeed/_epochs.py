"""The epoch cursor of the framework adapters: which batch of which epoch is read next.

The plan answers "batch b of epoch e"; an adapter only has to know the position ``(epoch, batch)`` it reads next.
`EpochCursor` is that position, for ``npyfeed.keras.PyDataset`` and ``npyfeed.torch.WindowDataset`` alike:

* Every batch handed out is recorded (`served`): the position moves past it. After an epoch's last batch the
  position is ``(epoch, num_batches)``, "read to its end": the *next pass* reads the next epoch from its first
  batch (`next_pass`, `position`), so a checkpoint taken right after the last batch resumes at the next epoch.
* Keras reads item ``i`` of "the current epoch" (`epoch`), and brackets each of its epochs with
  ``on_epoch_begin``/``on_epoch_end`` (`begin_pass`/`end_pass`), but also reads items outside its epochs (for the
  element spec, to build the model) and calls ``on_epoch_end`` without an epoch: the current epoch moves on at
  `end_pass` only when the epoch's last batch was read since `begin_pass`. Reads outside a pass never move it.
* PyTorch reads whole passes: `next_pass` gives the epoch and first batch of the next one (the next epoch once
  the current one was read to its end).

Thread safety: every method takes the cursor's lock.

`KerasEpochCallback` is the body of the Keras callbacks ``npyfeed.tf.EpochCallback`` and
``npyfeed.keras.EpochCallback``: it tells a dataset Keras' epoch (and the step Keras starts it from), so that a
``fit`` that ``BackupAndRestore`` resumed reads the epochs an uninterrupted one reads.
"""

from __future__ import annotations

import threading

from . import _checks


class EpochCursor:
    """The position ``(epoch, batch)`` an adapter reads next, over epochs of `num_batches` batches each."""

    def __init__(self, num_batches: int, epoch: int = 0):
        self._num_batches = int(num_batches)
        self._epoch = _checks.epoch(epoch)
        self._batch = 0  # the next batch of self._epoch; num_batches: the epoch was read to its end
        self._in_pass = False  # between begin_pass and end_pass
        self._read_last = False  # the epoch's last batch was served since begin_pass
        self._lock = threading.Lock()

    @property
    def num_batches(self) -> int:
        return self._num_batches

    @property
    def epoch(self) -> int:
        """The current epoch: the one an item without an explicit epoch is read from (Keras' item ``i``)."""
        with self._lock:
            return self._epoch

    def position(self) -> tuple:
        """``(epoch, batch)`` of the next batch a new pass reads: after an epoch's last batch, the next epoch's
        first."""
        with self._lock:
            return self._normalized()

    def next_pass(self) -> tuple:
        """Start a pass: ``(epoch, first batch)`` it reads (`position`), which becomes the current position."""
        with self._lock:
            self._epoch, self._batch = self._normalized()
            return self._epoch, self._batch

    def served(self, batch: int, epoch: int | None = None) -> tuple:
        """Record that batch `batch` of `epoch` (default: the current epoch) was handed out: the position moves
        past it. Returns ``(epoch, expected)``: the epoch of the batch and the batch the cursor expected (the one
        after the last served; a different `batch` means the reader jumped)."""
        with self._lock:
            epoch = self._epoch if epoch is None else epoch
            expected = self._batch
            self._epoch, self._batch = epoch, batch + 1
            if self._in_pass and batch == self._num_batches - 1:
                self._read_last = True
            return epoch, expected

    def set_epoch(self, epoch: int) -> None:
        """Read epoch `epoch` from its first batch from now on."""
        epoch = _checks.epoch(epoch)
        with self._lock:
            self._epoch, self._batch, self._read_last = epoch, 0, False

    def restore(self, epoch: int, batch: int) -> None:
        """Continue at batch `batch` of epoch `epoch` (``batch == num_batches``: the epoch was read to its end)."""
        epoch = _checks.epoch(epoch)
        n = self._num_batches
        batch = _checks.integer(batch, "batch", 0, n + 1, what=f"in [0, {n}]")
        with self._lock:
            self._epoch, self._batch, self._read_last = epoch, batch, False

    def begin_pass(self) -> None:
        """A framework's epoch begins (Keras' ``on_epoch_begin``)."""
        with self._lock:
            self._in_pass = True

    def end_pass(self) -> None:
        """A framework's epoch ends (Keras' ``on_epoch_end``): the current epoch moves on if its last batch was
        served since `begin_pass`; a call without a pass, or after a pass that did not reach the last batch
        (``steps_per_epoch`` shorter than an epoch), leaves it."""
        with self._lock:
            if self._in_pass and self._read_last:
                self._epoch, self._batch, self._read_last = self._epoch + 1, 0, False
            self._in_pass = False

    def _normalized(self) -> tuple:
        if self._batch >= self._num_batches:
            return self._epoch + 1, 0
        return self._epoch, self._batch

    def __repr__(self) -> str:
        epoch, batch = self.position()
        return f"batch {batch} of epoch {epoch}"


class KerasEpochCallback:
    """The body of the Keras callbacks ``npyfeed.tf.EpochCallback`` and ``npyfeed.keras.EpochCallback`` (each mixes
    it into its Keras' ``Callback``): before each Keras epoch, the dataset's next pass is set to epoch ``epoch +
    keras_epoch`` (``epoch``: the dataset's first epoch), from the batch of Keras' first step in it.

    Keras tells its epoch to ``on_epoch_begin`` (also the one ``BackupAndRestore`` restored); tf.keras 2 restored
    mid-epoch (``BackupAndRestore(save_freq=N)``) starts the epoch at step k, which ``on_train_batch_begin`` tells
    before the step reads its batch. Keras 3 starts every epoch at step 0.

    Parameters
    ----------
    passes
        What the dataset exposes: ``num_batches`` (batches per epoch) and ``start(keras_epoch, batch)`` (the next
        pass starts there).
    """

    # tf.keras 2: the batch hooks may receive the logs as tensors (no sync with the step for this callback).
    _supports_tf_logs = True

    def __init__(self, passes):
        super().__init__()
        self._passes = passes
        self._epoch = None  # Keras' epoch whose first step has not begun yet

    def on_train_begin(self, logs=None):
        steps = (getattr(self, "params", None) or {}).get("steps")
        if steps is not None and steps != self._passes.num_batches:
            raise ValueError(f"{type(self).__name__}: fit runs {steps} steps per epoch over a dataset of "
                             f"{self._passes.num_batches} batches per epoch; this callback keeps each Keras epoch "
                             "one epoch of the dataset: leave steps_per_epoch out (or pass the dataset's length)")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._passes.start(epoch, 0)

    def on_train_batch_begin(self, batch, logs=None):
        if self._epoch is None:
            return
        epoch, self._epoch = self._epoch, None
        if batch:  # Keras resumes this epoch at step `batch`: its first batch is the epoch's batch `batch`
            self._passes.start(epoch, batch)
