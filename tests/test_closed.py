"""One "closed" outcome: a read waiting for its batch when another thread closes what it waits on raises
``npyfeed.ClosedError`` (a RuntimeError, never the KeyboardInterrupt of Ctrl-C) on every path: the numpy iterator
(``BatchIterator.close``), ``Plan.take`` (``Plan.close``), the Keras adapter (its items are ``Plan.take``) and the
PyTorch adapter (its passes are the numpy iterator); a read that starts after the close finds an iterator
exhausted, and ``Plan.take`` starts a new stream.

A read is "waiting" only while its gather runs (and ``Plan.take`` looks for a close every 5 ms of its wait), so
the batches here are slow to gather (315 MB, converted from float64, NaNs replaced and standardised, on one
thread: 30 ms or more) and the close comes from another thread a few ms after the read began, and again every
20 ms until the read ends; each test tries until one close lands during a wait, and every try must end in a batch,
``ClosedError`` or the end of the iteration."""

from __future__ import annotations

import importlib.metadata
import threading
import time

import npyfeed
import numpy as np
import pytest

TRIES = 20
BATCH = 384  # 315 MB per batch: a gather of one thread (30 ms or more) outlasts take()'s 5 ms close check


@pytest.fixture(scope="module")
def src():
    rng = np.random.default_rng(3)
    factors = {f"k{i}": rng.standard_normal((300, 2048)) for i in range(4)}
    labels = {k: rng.standard_normal((300, 2)) for k in factors}
    index = [(int(f), int(f), k) for k in factors for f in range(99, 300)]
    return npyfeed.WindowSource.from_arrays(index, factors, labels, 100, threads=1, nan=0.0,
                                            normalize=(np.zeros(2048), np.full(2048, 2.0)))


def _close_while_reading(read, close) -> str:
    """Runs `read` in another thread and calls `close` a few ms after it began; what the read ended with."""
    outcome = {}
    began = threading.Event()

    def reader():
        began.set()
        try:
            read()
            outcome["end"] = "batch"
        except npyfeed.ClosedError as e:
            outcome["end"] = "closed"
            outcome["message"] = str(e)
        except StopIteration:
            outcome["end"] = "stop"
        except BaseException as e:  # noqa: BLE001 - a KeyboardInterrupt here is the defect under test
            outcome["end"] = repr(e)

    thread = threading.Thread(target=reader)
    thread.start()
    began.wait()
    time.sleep(0.003)
    close()
    # A close that came before the read began waiting (a quiet machine, a fast gather) is not the case under test:
    # close again until the read ends, so that one lands while it waits.
    deadline = time.monotonic() + 30
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.02)
        if thread.is_alive():
            close()
    assert not thread.is_alive()
    return outcome["end"], outcome.get("message", "")


def _tries(make):
    """`make()` gives (read, close) for a fresh try; the outcomes of the tries, up to the first ClosedError."""
    ends = []
    for _ in range(TRIES):
        end, message = _close_while_reading(*make())
        ends.append(end)
        if end == "closed":
            return ends, message
    return ends, ""


def test_closed_error_is_a_runtime_error():
    assert issubclass(npyfeed.ClosedError, RuntimeError) and not issubclass(npyfeed.ClosedError, KeyboardInterrupt)
    assert "ClosedError" in npyfeed.__all__ and npyfeed.ClosedError.__doc__


def test_numpy_iterator(src):
    iterators = []

    def make():
        it = src.batches(BATCH, shuffle=True, prefetch=1)
        iterators.append(it)
        return (lambda: next(it)), it.close

    ends, message = _tries(make)
    assert set(ends) <= {"batch", "closed", "stop"}, ends
    assert ends[-1] == "closed", ends
    assert "BatchIterator.close()" in message
    assert next(iterators[-1], None) is None  # a read after the close: exhausted


def test_plan_take(src):
    plan = src.plan(BATCH, shuffle=True, prefetch=1)
    epochs = iter(range(TRIES))

    def make():
        epoch = next(epochs)  # a new position each try: take starts a stream there and waits for its gather
        return (lambda: plan.take(epoch, 0)), plan.close

    ends, message = _tries(make)
    assert set(ends) <= {"batch", "closed"}, ends
    assert ends[-1] == "closed", ends
    assert "Plan.close()" in message
    np.testing.assert_array_equal(plan.take(0, 1)[0], src.batches(BATCH, shuffle=True, epoch=0,
                                                                   start_batch=1).__next__()[0])


def _keras3() -> bool:
    try:
        return int(importlib.metadata.version("keras").split(".")[0]) >= 3
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not _keras3(), reason="npyfeed.keras needs Keras 3")
def test_keras_adapter(src):
    import npyfeed.keras as nfk

    datasets = []

    def make():
        ds = nfk.PyDataset(src, BATCH, shuffle=True, epoch=len(datasets))
        datasets.append(ds)
        return (lambda: ds[0]), ds.plan.close

    ends, message = _tries(make)
    assert set(ends) <= {"batch", "closed"}, ends
    assert ends[-1] == "closed", ends
    assert "Plan.close()" in message


def test_torch_adapter(src, monkeypatch):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    import npyfeed.torch as nft

    datasets = []

    def make():
        ds = nft.WindowDataset(src, BATCH, shuffle=True, prefetch=1)
        iterators = []
        batches = ds.plan.batches

        def recording(*args, **kwargs):  # the pass's numpy iterator, to close it from another thread
            iterators.append(batches(*args, **kwargs))
            return iterators[-1]

        monkeypatch.setattr(ds.plan, "batches", recording)
        passes = iter(ds)
        datasets.append(ds)

        def close():
            while not iterators:
                time.sleep(0.001)
            iterators[0].close()

        return (lambda: next(passes)), close

    ends, message = _tries(make)
    assert set(ends) <= {"batch", "closed", "stop"}, ends
    assert ends[-1] == "closed", ends
    assert "BatchIterator.close()" in message
    assert datasets[-1].state_dict() == {"epoch": 0, "batch": 0}  # the batch it waited for is read next
