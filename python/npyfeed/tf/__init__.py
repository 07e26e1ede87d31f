"""`tf.data` pipelines over a `WindowSource`: `dataset` and the Keras callbacks `EpochCallback` and
`StatsCallback`. This is the only public module that imports TensorFlow.

``import npyfeed`` never imports TensorFlow; ``import npyfeed.tf`` (or the attribute ``npyfeed.tf``) does.

Batches reach TensorFlow through npyfeed's op library (no Python per batch, no copy), or where it does not load
(one warning says why) or with ``NPYFEED_TF_OPS=0``, through one ``tf.numpy_function`` call per batch. Each pass
over a dataset reads the next epoch; its iterators are checkpointable (``tf.train.Checkpoint``: the checkpoint
holds positions, never batches). Errors of a gather (a truncated file, a bad header) reach the loop as
``tf.errors.OpError`` with npyfeed's message, which names the file, index line or key.

How the pipelines are built is in `_pipeline`; how they reach their plan (the op library, the fallback and
its exit hook) in `_feed`; the private TensorFlow API they use, and its public fallback, in `_compat`.
"""

from __future__ import annotations

import os

import tensorflow as tf

from .. import _checks, _epochs
from .. import stats as _stats
from .._device_budget import checked_arguments
from ..plan import DEFAULT_MEMORY_BUDGET
from . import _pipeline

__all__ = ["dataset", "EpochCallback", "StatsCallback"]


def dataset(src, batch_size: int, *, shuffle: bool | str = False, seed: int = 0, drop_remainder: bool = False,
            device: str | None = None, input_context=None, num_shards: int | None = None,
            shard_index: int | None = None, prefetch: int = 2, epoch: int = 0,
            memory_budget: int = DEFAULT_MEMORY_BUDGET, shard_by: str = "samples", gather: str = "host",
            device_memory_budget: int | None = None, storage_dtype=None, pin_memory: bool = False) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(x, y)`` batches from `src`; each pass over it is a new epoch.

    Parameters
    ----------
    src : WindowSource
    batch_size : int
        Batch size; with `input_context`, the *global* batch size, split evenly over the replicas.
    shuffle : bool or "blocks"
        Shuffle the samples: a seeded permutation of all samples per epoch, a new one each pass. ``"blocks"``
        (data sets larger than RAM): each file read once per epoch, whole, within `memory_budget`, batches in
        the order of ``WindowSource.plan(shuffle="blocks")``; see its docstring and the guide (docs/blocks.md).
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
        The epoch of the first pass. With `EpochCallback` in ``fit``, Keras' epoch ``k`` reads epoch
        ``epoch + k`` (keep the default 0 and resume with ``BackupAndRestore``); without it, pass Keras'
        ``initial_epoch`` here after a restart.
    memory_budget : int
        With ``shuffle="blocks"``: bytes of array data held at once (the same default as `WindowSource.plan`).
        It decides the order too: keep it fixed to reproduce (or resume) an epoch.
    shard_by : {"samples", "keys"}
        How the shards (`num_shards` or `input_context`) split an epoch (`WindowSource.plan`): every n-th sample,
        or whole keys balanced by sample count (each pipeline reads only its own keys' files).
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
    pin_memory : bool
        With ``gather="host"``: gather into page-locked buffers registered once with the CUDA runtime TensorFlow
        has loaded (`Plan.batches`' `pin_memory`), for the GPU `device` names (default: the first), so that
        copying a batch to a GPU (``prefetch_to_device``, a strategy's replicas) reads it by DMA instead of
        through the driver's staging buffer (on an H200 through PyTorch: 51.8 against 11.7 GB/s; TensorFlow's
        own copy not measured on a GPU yet). The tensors adopt npyfeed's buffers as before; TensorFlow holds
        each until its copy is done. ``RuntimeError`` without a CUDA runtime.
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
    device_memory_budget = checked_arguments(gather, device_memory_budget, storage_dtype)
    if gather == "device" and pin_memory:
        raise ValueError("pin_memory= applies to gather='host' only (gather='device' sends start rows, not batches)")
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
        raise _checks.ArgumentTypeError(f"device must be a device name such as '/gpu:0', not {type(device).__name__}")
    epoch = _checks.epoch(epoch)  # [0, _checks.EPOCH_LIMIT), as everywhere; repeat() forever ends there
    # Every argument is checked here, by the plan, where an error is readable (not in TensorFlow's thread at
    # the first batch). One stream, read in order: one call at a time (it gathers `prefetch` batches ahead).
    plan = src.plan(batch_size, shuffle=shuffle, seed=seed, num_shards=num_shards, shard_index=shard_index,
                    drop_remainder=bool(drop_remainder), memory_budget=memory_budget, prefetch=prefetch,
                    shard_by=shard_by)
    if gather == "host":
        if pin_memory:
            tf.config.list_physical_devices("GPU")  # TensorFlow loads its CUDA runtime, which the pinning uses
            plan._core.pin_taken_batches(_gpu_index(device))
        return _pipeline.host_pipeline(src, plan, batch_size, drop_remainder, epoch, device)
    return _pipeline.device_pipeline(src, plan, batch_size, drop_remainder, epoch, device, storage_dtype,
                                        device_memory_budget)


def _gpu_index(device: str | None) -> int:
    """The CUDA ordinal a pipeline's batches go to: the GPU `device` names, else the first."""
    spec = tf.DeviceSpec.from_string(device or "")
    return int(spec.device_index or 0) if (spec.device_type or "").upper() == "GPU" else 0


class EpochCallback(_epochs.KerasEpochCallback, tf.keras.callbacks.Callback):
    """A Keras callback (``tf.keras``: Keras 2 or 3) that keeps the dataset's epoch equal to Keras' epoch: each
    epoch of ``fit`` reads epoch ``epoch + k`` of `ds` (``k``: Keras' epoch, ``epoch``: the dataset's first,
    0 by default), so a ``fit`` that ``keras.callbacks.BackupAndRestore`` resumed reads exactly the epochs an
    uninterrupted one reads, with no epoch to find and pass by hand.

    Keras 3 restarts the interrupted epoch at its first step (also with ``BackupAndRestore(save_freq=N)``), and
    the dataset reads that epoch from its first batch. tf.keras 2 with ``save_freq=N`` resumes mid-epoch, at
    the step after the last backup: the dataset's pass then starts at that batch of the epoch, so the resumed
    run reads the batches the interrupted one had not trained on.

    Parameters
    ----------
    ds : tf.data.Dataset
        A dataset returned by `dataset`, the one passed to ``fit`` (or one that ``fit`` reads through
        ``ds.map(...)`` and the like: they share its passes), not its ``repeat()``.

    Raises
    ------
    TypeError
        `ds` is not a dataset returned by `dataset` (or is its ``repeat()``, whose epochs are its own).
    ValueError
        At the start of ``fit``, when its steps per epoch are not the dataset's batches per epoch
        (``steps_per_epoch``: each Keras epoch must be one pass); when tf.keras 2 resumes mid-epoch over a
        streamed ``gather="device"`` pipeline, which starts passes at an epoch's first batch only.

    Examples
    --------
    >>> ds = npyfeed.tf.dataset(src, 256, shuffle=True, seed=0)                            # doctest: +SKIP
    >>> model.fit(ds, epochs=10, callbacks=[keras.callbacks.BackupAndRestore("backup"),  # doctest: +SKIP
    ...                                     npyfeed.tf.EpochCallback(ds)])
    """

    def __init__(self, ds):
        pipeline = _pipeline.pipeline_of(ds)
        passes = None if pipeline is None else pipeline.passes
        if passes is None:
            raise _checks.ArgumentTypeError(
                "npyfeed.tf.EpochCallback needs a dataset returned by npyfeed.tf.dataset (not its repeat(), nor a "
                f"dataset derived from it), got {type(ds).__name__}")
        super().__init__(passes)


class StatsCallback(_stats.EpochStatsCallback, tf.keras.callbacks.Callback):
    """A Keras callback (``tf.keras``: Keras 2 or 3) that reports, per epoch, whether training waited for input.

    Over each epoch it reads the pipeline's live statistics (`npyfeed.stats`): prints one line (``verbose=1``)
    such as ``input-bound: the model waited 63% of its time for batches (...)``, adds
    ``npyfeed_wait_fraction`` and ``npyfeed_samples_per_second`` to the logs (so to the ``History``), keeps the
    epoch's stats dict in ``epochs``, and with `log_dir` writes them as TensorBoard scalars (``tf.summary``,
    ``npyfeed/<field>`` at step = epoch). On Linux the line also says who had the cores
    (`npyfeed.stats.cpu_summary`; ``npyfeed_main_cpu_wait`` in the logs, a `npyfeed.stats.cpu_share` dict per
    epoch in ``cpu``): whether the model's main thread waited for a core held by npyfeed's workers.

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
        metadata = tf.compat.v1.SummaryMetadata()
        metadata.plugin_data.plugin_name = "scalars"
        with self._writer.as_default():
            for name in self.SCALARS:
                tf.summary.write(f"npyfeed/{name}", tf.constant(float(stats[name]), tf.float32), step=epoch,
                                 metadata=metadata.SerializeToString())
        self._writer.flush()
