"""Loads and the rest of the process: the GIL is released, fork works, many Python threads at once,
Ctrl-C interrupts a long load (and how soon), and the interpreter can exit with loads in flight."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import npyfeed
import numpy as np
import pytest
from npyfeed.bench.measure import evict

MiB = 1 << 20
FILES = 8
ITEMS = 6_553_600  # float32: 25 MiB a file, 200 MiB in all


def _expected(i: int) -> np.ndarray:
    return np.arange(ITEMS, dtype="<f4") + np.float32(i)


@pytest.fixture(scope="module")
def big_dataset(tmp_path_factory, write_npy):
    """Eight 25 MiB files (each split into chunks), synced so their pages can be evicted."""
    directory = tmp_path_factory.mktemp("big")
    paths = []
    for i in range(FILES):
        path = write_npy(directory / f"{i}.npy", _expected(i))
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        paths.append(str(path))
    return paths


def _check(arrays) -> None:
    assert len(arrays) == FILES
    for i, array in enumerate(arrays):
        assert array.dtype == np.dtype("<f4") and array.shape == (ITEMS,)
        assert np.array_equal(array, _expected(i)), i


# ----------------------------------------------------------------------------------------------------------
# The GIL is released while a load runs


@pytest.mark.parametrize("mode", ["read", "direct", "mmap"])
def test_other_python_threads_run_during_a_load(big_dataset, mode):
    npyfeed.load(big_dataset[0], mode=mode)  # warm-up: the first load imports numpy.lib.format (file IO)
    evict(big_dataset)  # the next read goes to the disk (best effort)
    counter = 0
    started = threading.Event()
    stop = threading.Event()

    def spin():
        nonlocal counter
        started.set()
        while not stop.is_set():
            counter += 1
            if counter % 1000 == 0:
                time.sleep(1e-4)  # hands the GIL to the main thread when it wants it

    # With a switch interval far longer than the test, the main thread is never forced to give up the GIL:
    # the counter moves only where the main thread releases it itself. Between `before` and `after` that is
    # only inside the load (a load holding the GIL leaves the counter exactly where it was).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    thread = threading.Thread(target=spin)
    try:
        thread.start()
        started.wait()
        before = counter
        arrays = npyfeed.load_many(big_dataset, mode=mode, threads=2, populate=True)
        during = counter - before
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert during > 1000
    _check(arrays)


# ----------------------------------------------------------------------------------------------------------
# fork


_FORK_WARNING = "ignore:This process .* is multi-threaded, use of fork\\(\\) may lead to deadlocks:DeprecationWarning"


def _in_child(check) -> int:
    """Runs `check()` in a forked child; returns the child's exit status (0: it returned True)."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            code = 0 if check() else 2
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    # A hang guard, not a timing assertion: a deadlocked child fails the test instead of hanging it.
    for _ in range(1200):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung (deadlock after fork?)")


@pytest.mark.filterwarnings(_FORK_WARNING)
@pytest.mark.parametrize("mode", ["read", "direct", "mmap"])
def test_load_in_parent_then_in_forked_child(big_dataset, mode):
    paths = big_dataset[:3]
    # The parent's pool is running (threads=3 starts at least three workers) before the fork.
    parent = npyfeed.load_many(paths, mode=mode, threads=3, populate=True)

    def child():
        # The parent's arrays are still valid in the child (inherited buffers and mappings) ...
        inherited = all(np.array_equal(a, _expected(i)) for i, a in enumerate(parent))
        # ... and the child's own loads run on a fresh pool, again with several threads.
        mine = npyfeed.load_many(paths, mode=mode, threads=3, populate=True)
        return inherited and all(np.array_equal(a, _expected(i)) for i, a in enumerate(mine))

    assert _in_child(child) == 0
    # And the parent's pool still works after the fork.
    again = npyfeed.load_many(paths, mode=mode, threads=3)
    assert all(np.array_equal(a, _expected(i)) for i, a in enumerate(again))


_FORK_FIRST = textwrap.dedent("""
    import os, sys
    import numpy as np
    import npyfeed

    path = sys.argv[1]
    expected = np.load(path)
    pid = os.fork()  # before any load: no pool anywhere yet
    if pid == 0:
        os._exit(0 if np.array_equal(npyfeed.load(path, threads=3), expected) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    assert np.array_equal(npyfeed.load(path, threads=3), expected)
    print("ok")
""")


def test_fork_before_the_first_load(tmp_path, write_npy):
    # In a fresh interpreter, so that no pool exists at the fork: the child starts its own, then the parent.
    path = write_npy(tmp_path / "a.npy", np.arange(5 * MiB, dtype="<u4"))
    proc = subprocess.run([sys.executable, "-c", _FORK_FIRST, str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n"


@pytest.mark.filterwarnings(_FORK_WARNING)
def test_fork_while_another_thread_loads(big_dataset):
    # A background thread keeps the pool busy; forks land at arbitrary points of its loads. The child
    # must not inherit a pool lock held by a thread that does not exist there.
    stop = threading.Event()
    errors = []

    def background():
        try:
            while not stop.is_set():
                _check(npyfeed.load_many(big_dataset, mode="read", threads=2))
        except BaseException as e:  # reported below
            errors.append(e)

    thread = threading.Thread(target=background)
    thread.start()
    try:
        for _ in range(4):
            status = _in_child(lambda: np.array_equal(npyfeed.load(big_dataset[1], threads=2), _expected(1)))
            assert status == 0
    finally:
        stop.set()
        thread.join()
    assert errors == []


# ----------------------------------------------------------------------------------------------------------
# Many Python threads at once


def test_many_python_threads(tmp_path, write_npy):
    dtypes = ["<f8", ">i4", "<u2", "?", "<c8", ">f2", "S3", "<i8"]
    files = []
    for i in range(16):
        n = [10, 1000, 300_000, 3 * MiB][i % 4]  # up to 24 MiB: the chunked path too
        array = (np.arange(n) % 97 + i).astype(dtypes[i % len(dtypes)])
        files.append((write_npy(tmp_path / f"{i}.npy", array), array))
    shared_path, shared = files[3]  # every thread also loads this one
    missing = tmp_path / "missing.npy"
    modes = ["read", "mmap", "direct", "auto"]

    def work(t: int):
        results = []
        for k in range(12):
            if k == 7 and t % 3 == 0:  # some calls fail; the failure belongs to that call alone
                try:
                    npyfeed.load_many([files[0][0], missing], mode=modes[t % 4], threads=2)
                except FileNotFoundError as e:
                    results.append(("error", e.filename))
                continue
            path, expected = files[(t * 5 + k) % len(files)]
            results.append((npyfeed.load(path, mode=modes[(t + k) % 4], threads=2), expected))
            results.append((npyfeed.load(shared_path, mode=modes[k % 4], threads=3), shared))
        return results

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(work, range(8)))
    errors = 0
    for results in outcomes:
        for actual, expected in results:
            if isinstance(actual, str):
                assert expected == str(missing)
                errors += 1
                continue
            assert actual.dtype == expected.dtype and actual.shape == expected.shape
            assert np.array_equal(actual, expected)
    assert errors == 3  # threads 0, 3 and 6


# ----------------------------------------------------------------------------------------------------------
# Ctrl-C and interpreter exit (in a subprocess: the signal and the exit are the process's own)


_INTERRUPT = textwrap.dedent("""
    import os, signal, sys, threading, traceback
    import numpy as np
    import npyfeed

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job of a shell starts with SIGINT ignored

    paths = sys.argv[1:]
    first = np.load(paths[0])
    interrupt = None
    for attempt in range(20):
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            while True:  # never ends by itself: only the interrupt stops it
                npyfeed.load_many(paths, mode="read", threads=1)
        except KeyboardInterrupt as e:
            timer.join()
            line = traceback.extract_tb(e.__traceback__)[-1].line or ""
            if "_core.load_many" in line:  # raised inside the C++ load, which is what is tested
                interrupt = e
                break
            print("interrupted outside the C++ load, again:", line, file=sys.stderr)
    if interrupt is None:
        sys.exit("never interrupted inside the C++ load")
    # The pool is not wedged by the cancelled job.
    assert np.array_equal(npyfeed.load_many(paths[:2], mode="read", threads=2)[0], first)
    print("pool ok after interrupt", flush=True)
    raise interrupt
""")


def test_ctrl_c_interrupts_a_long_load(big_dataset):
    proc = subprocess.run([sys.executable, "-c", _INTERRUPT, *big_dataset], capture_output=True, text=True,
                          timeout=60)
    assert "pool ok after interrupt" in proc.stdout, proc.stderr
    assert proc.returncode == -signal.SIGINT, proc.stderr  # died of the re-raised KeyboardInterrupt
    assert "KeyboardInterrupt" in proc.stderr
    assert "Fatal Python error" not in proc.stderr


# One load of many small files that would take about LONG_LOAD_S; SIGINT comes from a timer thread once the
# load is under way. Prints the latency from the signal to the KeyboardInterrupt, as JSON.
_INTERRUPT_LATENCY = textwrap.dedent("""
    import json, os, signal, sys, threading, time, traceback
    import npyfeed

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job of a shell starts with SIGINT ignored

    path, long_load_s = sys.argv[1], float(sys.argv[2])
    start = time.perf_counter()
    npyfeed.load_many([path] * 20000, threads=1)
    files = int(20000 * long_load_s / (time.perf_counter() - start))  # files that take long_load_s to load here
    paths = [path] * files
    for delay in (1.0, 1.5, 2.0):  # until the signal lands inside the C++ job (not in the argument conversion)
        sent = []
        timer = threading.Timer(delay, lambda: (sent.append(time.perf_counter()), os.kill(os.getpid(), signal.SIGINT)))
        began = time.perf_counter()
        timer.start()
        try:
            npyfeed.load_many(paths, mode="read", threads=1)
            sys.exit(f"a load of {files} files finished in {time.perf_counter() - began:.1f} s, before the interrupt")
        except KeyboardInterrupt as e:
            caught = time.perf_counter()
            timer.join()
            line = traceback.extract_tb(e.__traceback__)[-1].line or ""
        if "_core.load_many" in line:
            print(json.dumps({"latency_s": caught - sent[0], "files": files, "signal_after_s": sent[0] - began}))
            break
        print("interrupted outside the C++ load, again:", line, file=sys.stderr)
    else:
        sys.exit("never interrupted inside the C++ load")
""")

LONG_LOAD_S = 5.0
INTERRUPT_BOUND_S = 1.0  # the README says about 50 ms: a generous bound, and far below a load left to finish


def test_ctrl_c_latency(tmp_path, write_npy):
    path = write_npy(tmp_path / "small.npy", np.arange(16.0))
    proc = subprocess.run([sys.executable, "-c", _INTERRUPT_LATENCY, str(path), str(LONG_LOAD_S)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    print(result)
    assert result["latency_s"] < INTERRUPT_BOUND_S, result


# Short loads (a few ms) with SIGINT at delays that sweep the load: where does the KeyboardInterrupt surface?
_INTERRUPT_SHORT_LOADS = textwrap.dedent("""
    import collections, os, signal, sys, threading, time
    import npyfeed

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job of a shell starts with SIGINT ignored

    path = sys.argv[1]
    start = time.perf_counter()
    for _ in range(5):
        npyfeed.load_many([path], threads=2)
    duration = (time.perf_counter() - start) / 5
    outcomes = collections.Counter()
    for attempt in range(40):
        timer = threading.Timer(duration * (attempt + 1) / 30, os.kill, (os.getpid(), signal.SIGINT))
        try:
            timer.start()
            npyfeed.load_many([path], threads=2)
            timer.join()
            time.sleep(0.01)  # a signal that came after the load is handled here
            outcomes["no interrupt"] += 1
        except KeyboardInterrupt:
            outcomes["KeyboardInterrupt"] += 1
        except Exception as e:
            outcomes[f"{type(e).__name__}: {e}"] += 1
        timer.join()
    print(dict(outcomes))
""")


class _NotKeyboardInterrupt(AssertionError):
    pass


def test_ctrl_c_during_a_short_load_is_a_keyboard_interrupt(tmp_path, write_npy):
    path = write_npy(tmp_path / "mid.npy", np.arange(3 * MiB, dtype="<f8"))  # 24 MiB: a few ms
    proc = subprocess.run([sys.executable, "-c", _INTERRUPT_SHORT_LOADS, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outcomes = ast.literal_eval(proc.stdout.splitlines()[-1])
    assert outcomes.get("KeyboardInterrupt", 0) > 0, outcomes  # the sweep does interrupt loads
    if set(outcomes) - {"KeyboardInterrupt", "no interrupt"}:
        raise _NotKeyboardInterrupt(outcomes)


_EXIT = textwrap.dedent("""
    import sys, threading
    import npyfeed

    mode, when, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
    started = threading.Event()

    def work():
        while True:
            started.set()
            npyfeed.load_many(paths, mode=mode, threads=2, populate=True)

    threading.Thread(target=work, daemon=True).start()
    if when == "mid-load":
        started.wait()
    print("exiting", flush=True)
""")


# A daemon thread waiting in C++ when the interpreter exits: CPython < 3.14 ends it with pthread_exit when
# it asks for the GIL back, and that unwind must not cross a noexcept frame (module.cpp's without_gil).
@pytest.mark.parametrize("when", ["immediately", "mid-load"])
@pytest.mark.parametrize("mode", ["read", "direct", "mmap"])
def test_interpreter_exit_with_loads_in_flight(big_dataset, mode, when):
    proc = subprocess.run([sys.executable, "-c", _EXIT, mode, when, *big_dataset], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout == "exiting\n"
    assert "Fatal Python error" not in proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
