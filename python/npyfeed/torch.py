"""PyTorch over a `WindowSource`. This is the only module that imports PyTorch.

``import npyfeed`` never imports torch; ``import npyfeed.torch`` (or the attribute ``npyfeed.torch``) does.

`WindowDataset` is an ``IterableDataset`` of whole ``(x, y)`` batches, read from the plan (`Plan.batches`: a
C++ stream that gathers the next ``prefetch`` batches ahead, GIL released) and handed over as tensors that share
the batch's memory (``torch.from_numpy``: no copy). Use it with ``DataLoader(ds, batch_size=None)`` (the batches
are already made) and ``num_workers=0`` (npyfeed's threads do the work).

Position: the dataset remembers the next batch it will yield, ``(epoch, batch)``. Each ``iter(ds)`` reads from
there to the end of that epoch; after an epoch's last batch the position is the next epoch's first, so each
pass over a ``DataLoader`` is the next epoch. `set_epoch` moves it, like ``DistributedSampler.set_epoch``;
``state_dict()`` / ``load_state_dict()`` save and restore it, as torchdata's ``StatefulDataLoader`` calls them.
The position is kept in the epoch cursor the Keras adapter shares (``npyfeed._epochs.EpochCursor``).

``gather="device"`` forms the batches on the device instead: the arrays of the plan's keys are uploaded once
(resident) or block by block (``shuffle="blocks"`` over ``device_memory_budget``; what fits is decided by
``npyfeed._device_budget``, as for ``npyfeed.tf``), and each batch is sent as start rows (``_core.DeviceRows``, the
host half both adapters share) and formed there by one gather of factor rows and one of label rows.
"""

from __future__ import annotations

import collections
import math
import sys

import numpy as np

from . import _core
from . import stats as _stats
from ._device_budget import checked_arguments, default_budget, device_layout, storage_name
from ._epochs import EpochCursor
from ._resources import available_memory
from .plan import DEFAULT_MEMORY_BUDGET

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as e:  # pragma: no cover - the message is what matters
    raise ImportError("npyfeed.torch needs PyTorch: pip install 'npyfeed[torch]'") from e

__all__ = ["WindowDataset"]

_NO_WORKERS = ("npyfeed.torch.WindowDataset runs in the main process only: use DataLoader(..., num_workers=0). "
               "npyfeed already gathers `prefetch` batches ahead on its own threads with the GIL released; worker "
               "processes would copy every batch through shared memory, and would have to be forked from a process "
               "whose gather threads are running (or pickle the source)")


def _collated_by_a_loader(dataset) -> bool:
    """Whether ``iter(dataset)`` was called by a ``DataLoader`` that batches the elements itself."""
    # torch's DataLoader (torchdata's StatefulDataLoader too) starts each pass in its fetcher,
    # `_IterableDatasetFetcher.__init__(self, dataset, auto_collation, collate_fn, drop_last)`, which calls
    # `iter(dataset)`; `auto_collation` is true when the loader has a batch_size (1 by default).
    # That fetcher is the only caller with this argument: looked up by name a few frames up, nothing else.
    frame = sys._getframe(2)  # the caller of WindowDataset.__iter__
    try:
        for _ in range(3):
            if frame is None:
                return False
            local = frame.f_locals
            if local.get("dataset") is dataset and "auto_collation" in local:
                return bool(local["auto_collation"])
            frame = frame.f_back
        return False
    finally:
        del frame


def _distributed() -> tuple:
    """(rank, world size) from torch.distributed when it is initialised, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _cuda_device(device):
    """`device` as a ``torch.device`` of type cuda with its index (None stays None)."""
    if device is None:
        return None
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"npyfeed.torch.WindowDataset: device= takes a CUDA device, got {device!r} (without device= "
                         "the batches are CPU tensors)")
    if not torch.cuda.is_available():
        raise RuntimeError(f"npyfeed.torch.WindowDataset: device={device!r}, but PyTorch sees no CUDA GPU")
    return torch.device("cuda", d.index if d.index is not None else torch.cuda.current_device())


def _gather_device(device):
    """The device of ``gather="device"``: a CUDA device (with its index) or the CPU."""
    if device is None:
        raise ValueError("npyfeed.torch.WindowDataset: gather='device' needs device= (a CUDA device, or 'cpu')")
    if torch.device(device).type == "cpu":
        return torch.device("cpu")
    return _cuda_device(device)


#: The torch dtypes of the storage and output dtypes' names.
_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 "float64": torch.float64}


class _DeviceGather:
    """``gather="device"``: the arrays of a plan's keys on `device`, resident or streamed (`layout`), and each
    batch formed there from its start rows."""

    def __init__(self, src, plan, device, budget: int | None, storage_dtype):
        # The core's host half: it checks the storage dtype and refuses a source that transforms its rows.
        self.host_rows = _core.DeviceRows(plan._core, storage_name(src, storage_dtype))
        self.plan, self.device, self.window, self.pad = plan, device, src.window, src.bounds == "pad"
        self.x_shape, self.y_shape = tuple(src.x_shape), tuple(src.y_shape)
        self.out_dtype = _TORCH_DTYPES[np.dtype(src.dtype).name]
        self.storage = _TORCH_DTYPES[self.host_rows.storage_dtype]
        batch_bytes = plan.batch_size * (math.prod(self.x_shape) + math.prod(self.y_shape)) * self.out_dtype.itemsize
        if budget is None:
            budget = default_budget(_free_bytes(device), str(device))
        self.layout = device_layout(self.host_rows, plan, batch_bytes, budget, str(device))
        self.copies = torch.cuda.Stream(device) if device.type == "cuda" else None
        if not self.layout.streams:
            self.factors, self.labels = (self._upload(self.host_rows.read_resident(label)) for label in (False, True))

    def _upload(self, rows: np.ndarray):
        """Host rows (the core's, in the storage dtype; bfloat16 as its bits, uint16) as a tensor on the device."""
        host = torch.from_numpy(rows)
        return self._sent(host.view(torch.bfloat16) if self.storage == torch.bfloat16 else host)

    def _sent(self, host):
        """`host` (ordinary memory) on the device. On a GPU it is copied on a stream of the dataset's own, so that
        the copy does not wait for the work queued on the current stream (a copy from ordinary memory returns
        once it is done), and the current stream waits for it."""
        if self.copies is None:
            return host.to(self.device)
        with torch.cuda.stream(self.copies):
            sent = host.to(self.device, non_blocking=True)
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.copies)
        sent.record_stream(current)  # allocated on the copy stream, used on the current one
        return sent

    def batches(self, epoch: int, start: int):
        """``(b, x, y)`` for batches `start`.. of epoch `epoch`, formed on the device."""
        if not self.layout.streams:
            for b in range(start, len(self.plan)):
                yield (b, *self._form(self.factors, self.labels, self.host_rows.rows(epoch, b)))
            return
        for g, (first, end, _, _) in enumerate(self.host_rows.groups(epoch).tolist()):
            if end <= start:
                continue  # before the pass's first batch: not read
            factors, labels, *rows, ends = self.host_rows.group(epoch, g)
            factors, labels = self._upload(factors), self._upload(labels)
            begins = [0, *ends[:-1].tolist()]  # batch b of the group is samples [begins[b], ends[b]) of `rows`
            for b, (begin, stop) in enumerate(zip(begins, ends.tolist()), first):
                if b >= start:
                    yield (b, *self._form(factors, labels, [r[begin:stop] for r in rows]))

    def _form(self, factors, labels, rows):
        """The batch of start rows `rows` (start, first valid window row, end of them, label row) from `factors`
        and `labels` (their last row zeros), on the device: one gather each."""
        start, lo, hi, y_row = self._sent(torch.from_numpy(np.stack(rows))).unbind(0)
        j = torch.arange(self.window, device=self.device)
        x_rows = start[:, None] + j[None, :]
        if self.pad:
            valid = (j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None])
            x_rows = torch.where(valid, x_rows, torch.full_like(x_rows, factors.shape[0] - 1))
        n = len(start)
        return (factors[x_rows].to(self.out_dtype).reshape(n, *self.x_shape),
                labels[y_row].to(self.out_dtype).reshape(n, *self.y_shape))


def _free_bytes(device) -> int | None:
    """Bytes `device` can still hold: on a GPU what the CUDA driver has free plus what PyTorch's caching allocator
    holds unused; on the CPU the memory available (None: unknown)."""
    if device.type == "cpu":
        return available_memory()
    free, _total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


class WindowDataset(IterableDataset):
    """An ``IterableDataset`` of ``(x, y)`` tensor batches from `src`, one epoch per ``iter()``, for shard
    `shard_index` of `num_shards` (``rank`` of ``world_size``).

    Parameters
    ----------
    src : WindowSource
    batch_size : int
        The per-rank batch size.
    shuffle : bool or "blocks"
        The order of each epoch, as `WindowSource.plan`'s.
    seed : int
        Seed of the order: the same on every rank (each rank reads its own part of the same permutation).
    epoch : int
        The epoch of the first pass.
    num_shards, shard_index : int, optional
        This process's shard of every epoch, as for `WindowSource.plan`; default: ``torch.distributed``'s world
        size and rank when it is initialised, else 1 and 0. The shards are disjoint and together cover each
        epoch exactly once.
    shard_by : {"samples", "keys"}
        How the shards split an epoch (`WindowSource.plan`): every n-th sample, or whole keys balanced by sample
        count (each rank reads only its own keys' files).
    rank, world_size : int, optional
        ``torch.distributed``'s names for `shard_index` and `num_shards` (give one pair or the other).
    drop_remainder : bool
        Drop a last, smaller batch.
    memory_budget : int
        With ``shuffle="blocks"``: bytes of array data held at once (see `WindowSource.plan`; the same default).
    prefetch : int
        Batches gathered ahead of the one the loop takes.
    device : str or torch.device, optional
        A CUDA device to deliver the batches to: they are gathered into page-locked (pinned) buffers
        (`Plan.batches` with ``pin_memory=True``) and copied to the device on a CUDA stream of their own, so the
        copy of one batch runs while the GPU computes on the one before; the current stream waits for each
        copy, and a buffer is gathered into again only after its copy is done. Default: CPU tensors that share
        npyfeed's buffers. With ``gather="device"``: where the batches are formed (a CUDA device, or ``"cpu"``).
    gather : {"host", "device"}
        ``"host"`` (the default): npyfeed's C++ gather forms each batch in host memory. ``"device"``: the arrays
        of the plan's keys are uploaded to `device` once (the shard's keys under ``shard_by="keys"``), each step
        sends only start rows (four int64 per sample) and the batch is formed there with one gather of factor rows
        and one of label rows: the same batches, orders, shards and positions as ``"host"``, ``bounds="pad"``
        reading zero rows; not for a source that transforms its rows (``features=``, ``normalize=``, ...). Over
        `device_memory_budget`, ``shuffle="blocks"`` streams: each block uploaded once per epoch when its first
        batch is asked for (other orders raise ``ValueError`` saying what fits).
    device_memory_budget : int, optional
        With ``gather="device"``: the most bytes the device may hold for this dataset (the arrays, or two blocks,
        and 4 batches). Default: 80% of the device's free memory (on a GPU, the driver's free memory plus what
        PyTorch's caching allocator holds unused; on the CPU, the memory available).
    storage_dtype : {"float16", "bfloat16", "float32", "float64"}, optional
        With ``gather="device"``: the type the arrays are held in on the device (default ``src.dtype``); the
        batches are converted to ``src.dtype`` when formed.

    Notes
    -----
    ``len(ds)`` is the number of batches per epoch. Without `device`, the tensors of a batch share its buffer
    (64-byte aligned, owned by npyfeed, reused only when no tensor or array refers to it any more); a copy of
    such a batch to a GPU reads ordinary memory (measured on an H200: 10 GB/s, against 52 GB/s page-locked),
    and ``pin_memory=True`` in the ``DataLoader`` copies each batch once more on the host, into pinned memory.
    `device` avoids both.

    A pass waiting for its batch when another thread closes it raises `npyfeed.ClosedError` (as
    `BatchIterator` does); the position stays at the batch it waited for.

    Raises
    ------
    ValueError
        Bad arguments (as `WindowSource.plan`); both `shard_index`/`num_shards` and `rank`/`world_size`.
    RuntimeError
        Iterated in a ``DataLoader`` worker process (``num_workers > 0``), or pickled: see `__iter__`.
    ValueError
        Iterated by a ``DataLoader`` without ``batch_size=None``: see `__iter__`.
    """

    def __init__(self, src, batch_size: int, *, shuffle: bool | str = False, seed: int = 0, epoch: int = 0,
                 num_shards: int | None = None, shard_index: int | None = None, shard_by: str = "samples",
                 rank: int | None = None, world_size: int | None = None, drop_remainder: bool = False,
                 memory_budget: int = DEFAULT_MEMORY_BUDGET, prefetch: int = 2, device=None, gather: str = "host",
                 device_memory_budget: int | None = None, storage_dtype=None):
        if (num_shards is not None or shard_index is not None) and (rank is not None or world_size is not None):
            raise ValueError("npyfeed.torch.WindowDataset: give num_shards=/shard_index= or their torch.distributed "
                             "names world_size=/rank=, not both")
        num_shards = world_size if num_shards is None else num_shards
        shard_index = rank if shard_index is None else shard_index
        default_rank, default_world = _distributed() if shard_index is None or num_shards is None else (0, 1)
        num_shards = default_world if num_shards is None else num_shards
        shard_index = default_rank if shard_index is None else shard_index
        self._plan = src.plan(batch_size, shuffle=shuffle, seed=seed, num_shards=num_shards, shard_index=shard_index,
                              shard_by=shard_by, drop_remainder=drop_remainder, memory_budget=memory_budget,
                              prefetch=prefetch)
        self._cursor = EpochCursor(len(self._plan), epoch)
        _stats.register(self, self._plan)
        device_memory_budget = checked_arguments(gather, device_memory_budget, storage_dtype)
        self._on_device = None
        if gather == "host":
            self._device = _cuda_device(device)
        else:
            self._device = _gather_device(device)
            self._on_device = _DeviceGather(src, self._plan, self._device, device_memory_budget, storage_dtype)

    def stats(self) -> dict:
        """Live statistics of this dataset's plan (`npyfeed.Plan.stats`)."""
        return self._plan.stats()

    @property
    def plan(self):
        """The `Plan` the batches come from (``len(ds.plan) == len(ds)``)."""
        return self._plan

    @property
    def shard_index(self) -> int:
        """This dataset's shard of every epoch (`rank`)."""
        return self._plan.shard_index

    @property
    def num_shards(self) -> int:
        """The number of shards of every epoch (`world_size`)."""
        return self._plan.num_shards

    @property
    def rank(self) -> int:
        """This dataset's shard of every epoch (`shard_index`)."""
        return self._plan.shard_index

    @property
    def world_size(self) -> int:
        """The number of shards of every epoch (`num_shards`)."""
        return self._plan.num_shards

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._cursor.position()[0]

    def __len__(self) -> int:
        return len(self._plan)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` read epoch `epoch` from its first batch (``DistributedSampler.set_epoch``)."""
        self._cursor.set_epoch(epoch)

    def state_dict(self) -> dict:
        """The position of the next batch, ``{"epoch": int, "batch": int}`` (plain ints: torchdata's
        ``StatefulDataLoader`` stores it as the dataset's state, and `load_state_dict` takes it back)."""
        epoch, batch = self._cursor.position()
        return {"epoch": epoch, "batch": batch}

    def load_state_dict(self, state: dict) -> None:
        """Continue at the position `state_dict` gave: the next ``iter()`` yields that batch first.

        Raises ``ValueError`` for a state that is not one (a missing key, a batch outside the epoch).
        """
        try:
            epoch, batch = state["epoch"], state["batch"]
        except (TypeError, KeyError):
            raise ValueError(f"npyfeed.torch.WindowDataset: not a state_dict() of it: {state!r}") from None
        self._cursor.restore(epoch, batch)  # batch == len(self): saved after an epoch's last batch

    def __iter__(self):
        """Yield the rest of the current epoch, from the current position on, as ``(x, y)`` tensors.

        Raises ``RuntimeError`` in a ``DataLoader`` worker process: use ``num_workers=0`` (npyfeed's threads
        already gather ahead; workers would copy every batch through shared memory). Raises ``ValueError`` when a
        ``DataLoader`` that batches the elements itself starts the pass (a ``batch_size`` other than ``None``,
        DataLoader's default being 1): it would stack whole batches into batches of batches,
        ``(1, batch_size, W, F)`` for the default; use ``DataLoader(ds, batch_size=None)``.
        """
        if get_worker_info() is not None:
            raise RuntimeError(_NO_WORKERS)
        if _collated_by_a_loader(self):
            raise ValueError("npyfeed.torch.WindowDataset yields whole batches: use DataLoader(ds, batch_size=None). "
                             "This DataLoader batches the elements itself (its batch_size, 1 by default), which "
                             "would stack them into batches of batches: x of shape "
                             f"(1, {self._plan.batch_size}, W, F) with batch_size=1")
        return self._epoch_batches()

    def _epoch_batches(self):
        # The position is read at the first next(), so a load_state_dict() made after iter() still counts.
        epoch, start = self._cursor.next_pass()
        if self._on_device is not None:
            for b, x, y in self._on_device.batches(epoch, start):
                self._cursor.served(b, epoch)
                yield x, y
            return
        if self._device is not None:
            yield from self._device_batches(epoch, start)
            return
        with self._plan.batches(epoch, start_batch=start) as batches:
            for b, (x, y) in enumerate(batches, start):
                # Before the yield: the state a checkpoint takes after this batch is the next one.
                self._cursor.served(b, epoch)
                yield torch.from_numpy(x), torch.from_numpy(y)

    def _device_batches(self, epoch: int, start: int):
        """The batches copied to `self._device` from page-locked buffers on a stream of their own."""
        device = self._device
        copies = torch.cuda.Stream(device)
        in_flight = collections.deque()  # (host batch, event after its copy): its buffer kept until the copy is done
        limit = self._plan.prefetch + 1
        with self._plan.batches(epoch, start_batch=start, pin_memory=True, pin_memory_device=device.index) as batches:
            try:
                for b, (x, y) in enumerate(batches, start):
                    with torch.cuda.stream(copies):
                        xd = torch.from_numpy(x).to(device, non_blocking=True)
                        yd = torch.from_numpy(y).to(device, non_blocking=True)
                        copied = torch.cuda.Event()
                        copied.record(copies)
                    in_flight.append(((x, y), copied))
                    while in_flight and (len(in_flight) > limit or in_flight[0][1].query()):
                        in_flight.popleft()[1].synchronize()
                    current = torch.cuda.current_stream(device)
                    current.wait_event(copied)
                    xd.record_stream(current)  # allocated on the copy stream, used on this one
                    yd.record_stream(current)
                    self._cursor.served(b, epoch)
                    yield xd, yd
            finally:
                copies.synchronize()  # the copies read npyfeed's buffers: done before they can be gathered into
                in_flight.clear()

    def __reduce__(self):
        raise RuntimeError(_NO_WORKERS)

    def __repr__(self) -> str:
        return f"npyfeed.torch.WindowDataset(next {self._cursor!r}, {self._plan!r})"
