"""The plan of an epoch: which samples batch ``b`` of epoch ``e`` holds, and the batch itself, by position.

`WindowSource.plan` makes one; `WindowSource.batches`, `WindowSource.epoch_order`, `WindowSource.num_batches`
and `npyfeed.tf.dataset` all go through it, so every consumer sees the same batches for the same arguments.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from . import _checks
from . import stats as _stats

__all__ = ["Plan", "BatchIterator", "DEFAULT_MEMORY_BUDGET"]

#: ``shuffle="blocks"``'s default memory budget: a constant (not a share of this machine's memory), since the
#: budget decides the order and an epoch must be the same on every machine.
DEFAULT_MEMORY_BUDGET = 2 << 30


def shuffle_kind(shuffle) -> str:
    """The core's name of an order: ``False`` -> "none", ``True`` -> "global", ``"blocks"``."""
    if isinstance(shuffle, str):
        if shuffle != "blocks":
            raise ValueError(f"shuffle must be True, False or 'blocks', got {shuffle!r}")
        return "blocks"
    return "global" if shuffle else "none"


class Plan:
    """Batch ``b`` of epoch ``e`` of one shard of a `WindowSource`, by position (made by `WindowSource.plan`).

    A plan holds no per-epoch state: every answer is a function of ``(epoch, b)`` and the arguments it was made
    with, the same on any machine. ``len(plan)`` is the number of batches per epoch.

    Thread safety: every method may be called from several threads at once. `take` serves one call at a time.
    """

    def __init__(self, source, core, *, batch_size: int, shuffle, seed: int, num_shards: int, shard_index: int,
                 drop_remainder: bool, memory_budget: int | None, prefetch: int, shard_by: str = "samples"):
        self._source = source
        self._core = core
        _stats.register(self, core.stats)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_shards = num_shards
        self.shard_index = shard_index
        self.drop_remainder = drop_remainder
        self.memory_budget = memory_budget
        self.prefetch = prefetch
        self.shard_by = shard_by

    @property
    def source(self):
        """The `WindowSource` this plan reads."""
        return self._source

    def __len__(self) -> int:
        return len(self._core)

    @property
    def num_samples(self) -> int:
        """Samples of this shard per epoch (with `drop_remainder`, also those of the dropped last batch)."""
        return self._core.shard_size

    def ids(self, epoch: int, batch: int) -> np.ndarray:
        """The sample ids of batch `batch` of epoch `epoch` (int64, ``batch_size`` of them, fewer in a last
        smaller batch), without any IO: what ``take(epoch, batch)`` gathers.

        Raises ``IndexError`` unless ``0 <= batch < len(self)``.
        """
        return self._core.ids(_checks.epoch(epoch), self._batch(batch))

    def take(self, epoch: int, batch: int) -> tuple:
        """Batch `batch` of epoch `epoch` as ``(x, y)`` numpy arrays, equal to ``source.get(plan.ids(epoch, batch))``.

        Asked for the batch after the one it gave last, it takes it from a stream that keeps the next
        ``prefetch`` batches in flight (the pool never waits for the caller); any other position starts a new
        stream there (under ``shuffle="blocks"``: reading that batch's blocks again). The GIL is released while it
        waits; Ctrl-C interrupts a wait in the main thread.

        Raises ``IndexError`` unless ``0 <= batch < len(self)``; a failed read or gather raises as the gather does.
        """
        batch = self._batch(batch)
        taken = self._core.take(_checks.epoch(epoch), batch)
        if batch == len(self) - 1:  # an epoch's last batch: a new O_DIRECT refusal warns, as at an iterator's end
            self._source._warnings.direct_fallback(self._source)
        return taken

    def order(self, epoch: int) -> np.ndarray:
        """All sample ids of epoch `epoch` in batch order (`WindowSource.epoch_order` gives the same)."""
        return self._core.order(_checks.epoch(epoch))

    def batches(self, epoch: int = 0, *, start_batch: int = 0, prefetch: int | None = None,
                pin_memory: bool = False, pin_memory_device: int | None = None) -> BatchIterator:
        """Iterate over epoch `epoch` from batch `start_batch` on, gathering `prefetch` batches ahead in C++
        (default: the plan's).

        With `pin_memory`, the batches are gathered into page-locked (pinned) memory, registered once with the
        CUDA runtime the process has loaded (PyTorch's, TensorFlow's, CuPy's; ``NPYFEED_CUDA_RUNTIME`` names
        another libcudart) for CUDA device `pin_memory_device` (default: the calling thread's current one) and
        recycled registered: a copy of a batch to that GPU then reads it by DMA, several times faster than from
        ordinary memory, with no copy into a staging buffer (docs/frameworks.md). A batch's memory is gathered
        into again once no array refers to it: an asynchronous copy (``non_blocking=True``) must be complete
        before the batch is let go, which ``npyfeed.torch.WindowDataset(device=...)`` sees to. Raises
        ``RuntimeError`` when no CUDA runtime can be found or it refuses to register a buffer.
        """
        epoch = _checks.epoch(epoch)
        total = len(self)
        start_batch = _checks.integer(start_batch, "start_batch", 0, total + 1, what=f"in [0, {total}]")
        prefetch = self.prefetch if prefetch is None else _checks.positive(prefetch, "prefetch")
        pin_device = None
        if pin_memory:
            pin_device = -1 if pin_memory_device is None else _checks.non_negative(pin_memory_device,
                                                                                   "pin_memory_device")
        elif pin_memory_device is not None:
            raise ValueError("pin_memory_device is for pin_memory=True")
        stream = self._core.stream(epoch, start_batch, prefetch, pin_device)
        return BatchIterator(self._source, stream, total - start_batch, self._core.stats)

    def stats(self) -> dict:
        """Live statistics of this plan: what `take` and its iterators served, how long the consumer waited for
        it against the CPU time the gathers took, read-ahead, blocks read (a dict of `npyfeed.stats.FIELDS`;
        also counted into `WindowSource.stats`)."""
        return _stats.as_dict(self._core.stats.counts())

    def close(self) -> None:
        """Cancel `take`'s read-ahead and wait for its gathers (GIL released). Idempotent; `take` still works."""
        self._core.close()

    def _batch(self, batch) -> int:
        return _checks.non_negative(batch, "batch")

    def __repr__(self) -> str:
        return (f"Plan({len(self)} batches of {self.batch_size}, shuffle={self.shuffle!r}, seed={self.seed}, "
                f"shard {self.shard_index} of {self.num_shards} by {self.shard_by}, "
                f"drop_remainder={self.drop_remainder})")


class BatchIterator(Iterator):
    """Iterator over ``(x, y)`` batches; ``close()`` (or leaving a ``with`` block) cancels the read-ahead."""

    def __init__(self, source, stream, remaining: int, stats):
        self._source = source
        self._stream = stream
        self._remaining = remaining
        self._stats = stats  # the plan's
        _stats.register(self, stats)

    def stats(self) -> dict:
        """Live statistics of the plan this iterator reads (`Plan.stats`): its batches and every other
        iterator's or `take`'s of the same plan."""
        return _stats.as_dict(self._stats.counts())

    def __iter__(self):
        return self

    def __next__(self) -> tuple:
        if self._stream is None:
            raise StopIteration
        try:
            batch = self._stream.__next__()
        except StopIteration:
            self.close()
            self._source._warnings.direct_fallback(self._source)
            raise
        self._remaining -= 1
        return batch

    def __len__(self) -> int:
        return max(self._remaining, 0)

    def close(self) -> None:
        """Cancel the read-ahead and wait for gathers in flight (GIL released). Idempotent."""
        stream, self._stream = self._stream, None
        self._remaining = 0  # len() agrees with what iterating yields: nothing more
        if stream is not None:
            stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
