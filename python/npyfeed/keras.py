"""Keras 3 (any backend: TensorFlow, JAX, PyTorch) over a `WindowSource`. This is the only module that imports Keras.

``import npyfeed`` never imports Keras; ``import npyfeed.keras`` (or the attribute ``npyfeed.keras``) does, and so
does Keras its backend (``KERAS_BACKEND``, set before Keras is first imported).

`PyDataset` is a ``keras.utils.PyDataset`` whose item ``i`` is batch ``i`` of the current epoch, taken from the
plan (`Plan.take`: a C++ stream that gathers the next ``prefetch`` batches ahead, GIL released; no Python per
sample). Keras asks for the batches in order (``fit(..., shuffle=False)``), so every batch after the first of an
epoch comes from the read-ahead.

Epochs: the dataset reads epoch ``epoch + n`` during the n-th epoch of ``fit`` (counting from 0), so a
``fit(..., initial_epoch=k)`` resumes with the same epochs when the dataset is made with ``epoch=k``. Keras
calls ``on_epoch_begin`` and ``on_epoch_end`` around each epoch, but also around reads that are not epochs:
before the first epoch, the TensorFlow backend reads items 0 and 1 for the element spec (outside any
epoch), and the JAX backend reads item 0 to build the model inside a begin/end pair of its own; it also calls
``on_epoch_end`` once more before the first epoch. So ``on_epoch_end`` moves to the next epoch only when, since
the last ``on_epoch_begin``, the epoch's last batch was read (with ``steps_per_epoch`` shorter than an epoch,
Keras carries on within it in the next Keras epoch, and the epoch moves on when its last batch was read). The
PyTorch adapter keeps its position in the same epoch cursor, which makes this decision. Limit:
an epoch of a single batch under the JAX backend counts the model-building read as an epoch: start at
``epoch - 1`` there (or use ``drop_remainder``/a smaller batch so that an epoch has two batches or more).
"""

from __future__ import annotations

import operator
import warnings

from . import _checks
from . import stats as _stats
from ._epochs import EpochCursor, KerasEpochCallback
from .plan import DEFAULT_MEMORY_BUDGET
from .stats import EpochStatsCallback

try:
    import keras
except ImportError as e:  # pragma: no cover - the message is what matters
    raise ImportError("npyfeed.keras needs Keras 3: pip install 'npyfeed[keras]' (or keras>=3 and a backend: "
                      "tensorflow, jax or torch)") from e

# (A str check first: the docs build mocks Keras.)
if isinstance(keras.__version__, str) and (int(keras.__version__.split(".")[0]) < 3
                                           or not hasattr(keras.utils.PyDataset, "on_epoch_begin")):
    raise ImportError("npyfeed.keras needs Keras 3 (a PyDataset with on_epoch_begin; tested with 3.15); this "
                      f"environment has Keras {keras.__version__}: "
                      "pip install 'npyfeed[keras]', or use npyfeed.tf.dataset with tf.keras")

__all__ = ["PyDataset", "EpochCallback", "StatsCallback"]


class PyDataset(keras.utils.PyDataset):
    """A ``keras.utils.PyDataset`` of ``(x, y)`` numpy batches from `src`: item ``i`` is batch ``i`` of the
    current epoch, and each Keras epoch reads the next epoch.

    Parameters
    ----------
    src : WindowSource
    batch_size : int
    shuffle : bool or "blocks"
        The order of each epoch, as `WindowSource.plan`'s. Pass ``shuffle=False`` to ``model.fit``: Keras' own
        shuffle reorders the batches (see Warns).
    seed : int
        Seed of the order (the same on any machine).
    epoch : int
        The epoch of the first Keras epoch. With `EpochCallback` in ``fit``, Keras' epoch ``k`` reads epoch
        ``epoch + k`` (keep the default 0 and resume with ``BackupAndRestore``); without it, make the dataset
        with ``epoch=k`` for ``model.fit(ds, initial_epoch=k)`` (plus any offset you started with) so that a
        resumed run reads the epochs an uninterrupted one would have read.
    num_shards, shard_index
        This process's part of every epoch (e.g. one per host under a distribution strategy); the shards are
        disjoint and together cover each epoch exactly once.
    shard_by : {"samples", "keys"}
        How the shards split an epoch (`WindowSource.plan`): every n-th sample, or whole keys balanced by sample
        count (each process reads only its own keys' files).
    drop_remainder : bool
        Drop a last, smaller batch (every batch then has the same shape: one compilation under JAX/XLA).
    memory_budget : int
        With ``shuffle="blocks"``: bytes of array data held at once (see `WindowSource.plan`; the same default).
    prefetch : int
        Batches gathered ahead of the one Keras asks for.
    **pydataset_kwargs
        ``keras.utils.PyDataset``'s: ``workers`` (0 or 1; default 1) and ``max_queue_size``.

    Raises
    ------
    ValueError
        Bad arguments (as `WindowSource.plan`); ``use_multiprocessing=True`` or ``workers > 1``: npyfeed's own
        threads gather each batch with the GIL released, and Keras' workers would only take the batches out of
        order (each restarting the read-ahead); worker processes would also copy every batch back through
        pickling and run in a child forked from a process with running threads.

    Warns
    -----
    UserWarning
        Once, when Keras asks for the batches out of order (``model.fit``'s default ``shuffle=True`` permutes
        the batch indices of a PyDataset): each batch is then gathered without read-ahead, and the batches of an
        epoch differ in order from `WindowSource.batches`'. With ``shuffle="blocks"`` it raises ``RuntimeError``
        instead: every such batch would read its block again.

    Notes
    -----
    An item waiting for its batch when another thread calls ``ds.plan.close()`` raises `npyfeed.ClosedError`
    (as `Plan.take` does), which ends ``fit``.
    """

    def __init__(self, src, batch_size: int, *, shuffle: bool | str = False, seed: int = 0, epoch: int = 0,
                 num_shards: int = 1, shard_index: int = 0, shard_by: str = "samples", drop_remainder: bool = False,
                 memory_budget: int = DEFAULT_MEMORY_BUDGET, prefetch: int = 2, **pydataset_kwargs):
        workers = pydataset_kwargs.get("workers", 1)
        if pydataset_kwargs.get("use_multiprocessing", False):
            raise ValueError("npyfeed.keras.PyDataset: use_multiprocessing=True is not supported: npyfeed gathers "
                             "each batch on its own threads (GIL released); Keras' worker processes would fork a "
                             "process whose gather threads are running, take every n-th batch each (restarting "
                             "the read-ahead at each) and copy every batch back by pickling. Keep the default "
                             "(workers=1, use_multiprocessing=False)")
        if not _checks.is_int(workers) or workers > 1:
            raise (ValueError if _checks.is_int(workers) else _checks.ArgumentTypeError)(
                f"npyfeed.keras.PyDataset: workers={workers!r}: use 0 or 1 (the default). npyfeed "
                "already gathers `prefetch` batches ahead on its own threads; Keras' worker threads "
                "would only ask for the batches out of order, restarting the read-ahead")
        super().__init__(**pydataset_kwargs)
        self._plan = src.plan(batch_size, shuffle=shuffle, seed=seed, num_shards=num_shards, shard_index=shard_index,
                              shard_by=shard_by, drop_remainder=drop_remainder, memory_budget=memory_budget,
                              prefetch=prefetch)
        self._cursor = EpochCursor(len(self._plan), epoch)
        _stats.register(self, self._plan)
        self._first_epoch = self._cursor.epoch
        self._warned = False

    def stats(self) -> dict:
        """Live statistics of this dataset's plan (`npyfeed.Plan.stats`)."""
        return self._plan.stats()

    @property
    def plan(self):
        """The `Plan` the batches come from (``len(ds.plan) == len(ds)``)."""
        return self._plan

    @property
    def epoch(self) -> int:
        """The epoch item ``i`` is taken from now; the next one after each Keras epoch."""
        return self._cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read epoch `epoch` from now on (e.g. in a loop of your own that iterates ``ds`` directly)."""
        self._cursor.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self._plan)

    def __getitem__(self, index) -> tuple:
        index = operator.index(index)
        if not 0 <= index < len(self._plan):
            raise IndexError(f"npyfeed.keras.PyDataset: batch {index} of {len(self._plan)}")
        epoch, expected = self._cursor.served(index)
        if index not in (0, expected):
            self._out_of_order(index, expected)
        return self._plan.take(epoch, index)

    def on_epoch_begin(self) -> None:
        """Called by Keras before each epoch: from now on the items are this epoch's."""
        self._cursor.begin_pass()

    def on_epoch_end(self) -> None:
        """Called by Keras after each epoch: move to the next epoch if its last batch was read since
        ``on_epoch_begin`` (Keras also calls this around reads that are not epochs: see the module's docs)."""
        self._cursor.end_pass()

    def _out_of_order(self, index: int, expected: int) -> None:
        if self._plan.shuffle == "blocks":
            raise RuntimeError(f"npyfeed.keras.PyDataset: Keras asked for batch {index} after batch {expected - 1}: "
                               "with shuffle='blocks' every such batch would read its block again. Pass "
                               "shuffle=False to model.fit (its default, True, permutes the batches of a "
                               "PyDataset); the samples are shuffled here, by the dataset's shuffle=")
        if not self._warned:
            self._warned = True
            warnings.warn(f"npyfeed.keras.PyDataset: Keras asked for batch {index} after batch {expected - 1}: batches "
                          "out of order are gathered without read-ahead (slower), and their order is not "
                          "WindowSource.batches'. Pass shuffle=False to model.fit (its default, True, permutes the "
                          "batches of a PyDataset); the samples are shuffled by the dataset's shuffle=",
                          UserWarning, stacklevel=2)

    def __repr__(self) -> str:
        return f"npyfeed.keras.PyDataset(epoch {self._cursor.epoch}, {self._plan!r})"


class _Passes:
    """A `PyDataset` as `EpochCallback` sees it: Keras' epoch k reads epoch ``epoch + k`` (item i is batch i of
    it, whatever step Keras starts at)."""

    def __init__(self, ds: PyDataset):
        self._ds = ds
        self.num_batches = len(ds)

    def start(self, keras_epoch: int, batch: int = 0) -> None:
        self._ds.set_epoch(self._ds._first_epoch + keras_epoch)


class EpochCallback(KerasEpochCallback, keras.callbacks.Callback):
    """A Keras callback that keeps a `PyDataset`'s epoch equal to Keras' epoch: each epoch of ``fit`` reads epoch
    ``epoch + k`` of `ds` (``k``: Keras' epoch, ``epoch``: the dataset's first, 0 by default), so a ``fit`` that
    ``keras.callbacks.BackupAndRestore`` resumed reads exactly the epochs an uninterrupted one reads (Keras 3
    restarts the interrupted epoch at its first step, also with ``save_freq=N``: the dataset reads that epoch
    from its first batch).

    ``model.fit(ds, shuffle=False, callbacks=[keras.callbacks.BackupAndRestore(dir),
    npyfeed.keras.EpochCallback(ds)])``.

    Raises
    ------
    TypeError
        `ds` is not a `PyDataset`.
    ValueError
        At the start of ``fit``, when its steps per epoch are not the dataset's length (``steps_per_epoch``:
        each Keras epoch must be one epoch of the dataset).
    """

    def __init__(self, ds: PyDataset):
        if not isinstance(ds, PyDataset):
            raise _checks.ArgumentTypeError(
                f"npyfeed.keras.EpochCallback needs an npyfeed.keras.PyDataset, got {type(ds).__name__}")
        super().__init__(_Passes(ds))


class StatsCallback(EpochStatsCallback, keras.callbacks.Callback):
    """A Keras callback that reports, per epoch, whether training waited for input: the pipeline's live statistics
    (`npyfeed.stats`) over the epoch, printed as one line, added to the logs (``npyfeed_wait_fraction``,
    ``npyfeed_samples_per_second``) and kept in ``epochs`` (a stats dict per epoch); on Linux also who had the
    cores (``npyfeed_main_cpu_wait``, ``cpu``: `npyfeed.stats.cpu_share`).

    ``model.fit(ds, callbacks=[npyfeed.keras.StatsCallback(ds)])`` with ``ds`` a `PyDataset` (or its
    `WindowSource`, or a `npyfeed.Plan`); ``verbose=0`` prints nothing.
    """
