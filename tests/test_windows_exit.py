"""Iterators and the interpreter: close, with, break, errors in the read-ahead, interpreter exit with gathers in
flight, the GIL released while gathering, close from another thread.

The numpy reference and the data sets: windows_data.py."""


from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import time

import npyfeed
import numpy as np
import pytest
from windows_data import DataSet, assert_batch, check_epoch, many_keys_dataset, open_source, reference, write_dataset

# ----------------------------------------------------------------------------------------------------------
# Iterators: close, with, break, interpreter exit


def test_close_mid_epoch(ordered):
    src = open_source(ordered, "read")
    it = src.batches(4, prefetch=4)
    first = next(it)
    assert len(it) == 25
    it.close()
    it.close()  # idempotent
    with pytest.raises(StopIteration):
        next(it)
    assert list(it) == [] and len(it) == 0
    assert_batch(first, reference(ordered, ordered.entries[:4], "float32"))
    check_epoch(src, ordered, "float32", 4)  # the source is fine


def test_with_block_closes(ordered):
    src = open_source(ordered, "mmap")
    with src.batches(4, prefetch=3, shuffle=True) as it:
        batch = next(it)
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    order = src.epoch_order(0, shuffle=True)
    assert_batch(batch, reference(ordered, [ordered.entries[i] for i in order[:4]], "float32"))
    with pytest.raises(RuntimeError):
        with src.batches(4) as it:
            next(it)
            raise RuntimeError("user error inside the block")
    assert list(it) == []


@pytest.mark.parametrize("mode", ["read", "arrays"])
def test_break_then_delete(ordered, mode):
    src = open_source(ordered, mode)
    held = []
    for _ in range(5):
        for b, batch in enumerate(src.batches(2, prefetch=6, shuffle=True)):
            held.append(batch)
            if b == 2:
                break  # the abandoned iterator goes at once, with gathers possibly still in flight
    del src
    gc.collect()
    order = npyfeed.WindowSource.from_arrays(ordered.index, ordered.factors, ordered.labels, 4).epoch_order(
        0, shuffle=True)
    for i, batch in enumerate(held):
        b = i % 3
        assert_batch(batch, reference(ordered, [ordered.entries[j] for j in order[2 * b:2 * b + 2]], "float32"))


def test_errors_in_read_ahead_reach_the_caller(tmp_path):
    ds = many_keys_dataset(tmp_path, 10)
    src = open_source(ds, "read")
    it = src.batches(1, prefetch=4)
    assert_batch(next(it), reference(ds, ds.entries[:1], "float32"))  # batches 1-4 are in flight now
    with open(ds.factor_dir / "key08.npy", "r+b") as fh:
        fh.truncate(100)
    for b in range(1, 8):
        assert_batch(next(it), reference(ds, ds.entries[b:b + 1], "float32"))
    with pytest.raises(npyfeed.NpyFormatError, match="key08.npy"):
        next(it)
    it.close()


_EXIT_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import npyfeed

    how, root = sys.argv[1], sys.argv[2]
    if how.startswith("arrays"):
        load = lambda d: {k: np.load(f"{root}/{d}/{k}.npy") for k in ("k0", "k1", "k2", "k3")}
        src = npyfeed.WindowSource.from_arrays(f"{root}/index.txt", load("factor"), load("label"), 50)
    else:
        src = npyfeed.WindowSource(f"{root}/index.txt", f"{root}/factor", f"{root}/label", 50, mode="read")
    it = src.batches(64, prefetch=4, shuffle=True)
    for b, (x, y) in enumerate(it):
        if b == 1:
            print("mid-epoch", flush=True)
            if how.endswith("sys.exit"):
                sys.exit(0)
            if how.endswith("raise"):
                raise SystemExit
            break
    # "end": the script ends with the iterator alive and gathers in flight
""")


@pytest.fixture(scope="module")
def exit_dataset(tmp_path_factory) -> DataSet:
    rng = np.random.default_rng(71)
    factors = {f"k{k}": rng.standard_normal((3000, 64), dtype=np.float32) for k in range(4)}
    labels = {k: rng.standard_normal((3000, 2), dtype=np.float32) for k in factors}
    entries = [(int(rng.integers(49, 3000)), int(rng.integers(0, 3000)), f"k{int(rng.integers(0, 4))}")
               for _ in range(64 * 40)]
    return write_dataset(tmp_path_factory.mktemp("exit"), factors, labels, entries, 50)


@pytest.mark.parametrize("how", ["end", "sys.exit", "raise", "arrays-end", "arrays-sys.exit"])
def test_interpreter_exit_mid_epoch(exit_dataset, how):
    proc = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, how, str(exit_dataset.root)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "mid-epoch" in proc.stdout
    assert "Fatal Python error" not in proc.stderr and "terminate" not in proc.stderr


_DAEMON_SCRIPT = textwrap.dedent("""
    import sys, threading
    import npyfeed

    root = sys.argv[1]
    src = npyfeed.WindowSource(f"{root}/index.txt", f"{root}/factor", f"{root}/label", 50, mode="mmap")
    started = threading.Event()

    def feed():  # like a framework's input thread: still gathering when the interpreter exits
        while True:
            for _ in src.batches(64, prefetch=4, shuffle=True):
                started.set()

    threading.Thread(target=feed, daemon=True).start()
    started.wait()
    print("exiting", flush=True)
""")


def test_interpreter_exit_with_a_daemon_thread_gathering(exit_dataset):
    for _ in range(3):  # the thread is inside a gather at exit nearly always; three tries make it certain
        proc = subprocess.run([sys.executable, "-c", _DAEMON_SCRIPT, str(exit_dataset.root)],
                              capture_output=True, text=True, timeout=60)
        assert "exiting" in proc.stdout
        assert proc.returncode == 0, proc.stderr
        assert "Fatal Python error" not in proc.stderr and "terminate" not in proc.stderr


# ----------------------------------------------------------------------------------------------------------
# The GIL


@pytest.fixture(scope="module")
def large_dataset(tmp_path_factory) -> DataSet:
    """8 files of (2400, 256) float32, 2048 samples of W=100: batches of 256 are 26 MB."""
    rng = np.random.default_rng(81)
    factors = {f"g{k}": rng.standard_normal((2400, 256), dtype=np.float32) for k in range(8)}
    labels = {k: rng.standard_normal((2400, 4), dtype=np.float32) for k in factors}
    entries = [(int(rng.integers(99, 2400)), int(rng.integers(0, 2400)), f"g{int(rng.integers(0, 8))}")
               for _ in range(256 * 8)]
    return write_dataset(tmp_path_factory.mktemp("large"), factors, labels, entries, 100)


@pytest.mark.parametrize("mode", ["mmap", "read"])
def test_gil_released_during_gathers(large_dataset, mode):
    """Another Python thread keeps counting while the main thread gathers large batches.

    The counting thread gives up the GIL after every 50 counts (a short sleep: one "cycle"), so the main thread
    gets it back at once when it needs it; with a huge switch interval the interpreter never takes the GIL from
    a thread by force. The counting thread can therefore run only while the main thread has released the GIL
    itself: were a gather done with the GIL held, the count would advance by at most one cycle per place where
    the GIL is let go (about three per call), not by many cycles per call.
    """
    src = open_source(large_dataset, mode, threads=1)  # leave the other core to the counting thread
    state = {"stop": False, "cycles": 0}
    started = threading.Event()

    def count():
        started.set()
        n = 0
        while not state["stop"]:
            n += 1
            if n % 50 == 0:
                state["cycles"] += 1
                time.sleep(1e-5)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    thread = threading.Thread(target=count)
    try:
        thread.start()
        started.wait()
        before = state["cycles"]
        calls = 0
        for _ in src.batches(512, prefetch=1):  # 52 MB per batch
            calls += 1
        x, y = src.get(np.arange(1024))  # 105 MB in one gather
        calls += 1
        after = state["cycles"]
    finally:
        state["stop"] = True
        thread.join()
        sys.setswitchinterval(old)
    assert calls == 5
    assert x.shape == (1024, 100, 256) and y.shape == (1024, 4)
    assert after - before >= 10 * calls, (after - before, calls)
    assert_batch((np.ascontiguousarray(x[::97]), y[::97].copy()), reference(large_dataset, large_dataset.entries[:1024:97], "float32"))


def test_close_from_another_thread_while_next_waits(tmp_path):
    # close() may come from another thread while next() waits for a gather: the waiting next() then raises
    # npyfeed.ClosedError (a next() after the close finds the iterator exhausted) instead of racing on the
    # read-ahead queue. (tests/test_closed.py makes sure a close lands during a wait, on every path.)
    import threading

    rng = np.random.default_rng(7)
    factors = {f"k{i}": rng.standard_normal((400, 64), dtype=np.float32) for i in range(4)}
    labels = {k: rng.standard_normal((400, 2), dtype=np.float32) for k in factors}
    index = [(int(f), int(f), k) for k in factors for f in range(49, 400)]
    src = npyfeed.WindowSource.from_arrays(index, factors, labels, 50)
    for _ in range(20):
        it = src.batches(64, prefetch=4, shuffle=True)
        first = next(it)
        closer = threading.Thread(target=it.close)
        got = []
        closer.start()
        try:
            for batch in it:
                got.append(batch)
        except npyfeed.ClosedError:
            pass
        finally:
            closer.join()
        assert first[0].shape == (64, 50, 64)
        assert len(got) <= src.num_batches(64) - 1
        assert all(x.shape[1:] == (50, 64) and np.isfinite(x).all() for x, _ in got)
        assert next(it, None) is None
