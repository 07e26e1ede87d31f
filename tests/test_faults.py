"""Fault injection through the public API (`npyfeed.load`, `npyfeed.load_many`).

Read faults come from an LD_PRELOAD shim (tests/faults/shim.c, compiled here with cc) that makes chosen
`pread` calls on chosen files fail with EIO or EINTR, return short, return 0 early (a file that ends
sooner than it did when it was opened), or pause until the test has deleted or replaced the file. Loads
under the shim run in a subprocess that prints its outcome as JSON; the subprocess timeout only turns a
hang into a failure. Also: thousands of files under a low `ulimit -n`, and one bad file among many big
ones. (KeyboardInterrupt during a load is tested in test_concurrency.py.)
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import npyfeed
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD, /proc and O_DIRECT are Linux")

MODES = ["read", "direct", "mmap"]
SHIM_SOURCE = Path(__file__).parent / "faults" / "shim.c"
HANG_GUARD_S = 300  # a subprocess still running after this is a hang, not a slow machine

# Loads `paths` and prints what happened; compares with the reference copies in `refs` (their names do
# not match the shim's pattern, so reading them is never faulted).
CHILD = textwrap.dedent(
    """
    import json, os, sys, threading
    import numpy as np
    import npyfeed

    args = json.loads(sys.argv[1])

    def outcome():
        try:
            arrays = npyfeed.load_many(args["paths"], mode=args["mode"], threads=args["threads"],
                                       populate=args.get("populate", False))
        except Exception as e:
            return {"ok": False, "type": type(e).__name__, "oserror": isinstance(e, OSError),
                    "format_error": isinstance(e, npyfeed.NpyFormatError), "errno": getattr(e, "errno", None),
                    "filename": getattr(e, "filename", None), "path": getattr(e, "path", None),
                    "offset": getattr(e, "offset", None),
                    "message": str(e)}
        equal = []
        for a, ref in zip(arrays, args["refs"]):
            r = np.load(ref)
            equal.append(a.dtype == r.dtype and a.shape == r.shape and a.tobytes() == r.tobytes())
        return {"ok": True, "equal": equal}

    change = args.get("change")  # while the load is held by the shim: "replace", "delete" or "truncate" the file
    if change is None:
        result = outcome()
    else:
        box = {}
        loader = threading.Thread(target=lambda: box.update(outcome()))
        loader.start()
        marker = os.environ["NPYFEED_FAULT_PAUSE_FILE"]
        while not os.path.exists(marker) and loader.is_alive():
            loader.join(0.001)
        if os.path.exists(marker):
            if change == "replace":
                os.replace(args["replacement"], args["paths"][0])
            elif change == "truncate":
                os.truncate(args["paths"][0], 1000)
            else:
                os.remove(args["paths"][0])
            box["changed"] = True
            os.remove(marker)
        loader.join()
        result = box
    print("RESULT " + json.dumps(result))
    """
)


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the LD_PRELOAD fault shim")
    out = tmp_path_factory.mktemp("shim") / "shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM_SOURCE), "-ldl"], check=True)
    return out


def run_child(shim: Path, args: dict, tmp_path: Path, **fault) -> tuple:
    """Runs CHILD under the shim with NPYFEED_FAULT_<KEY>=value for each keyword.

    Returns its outcome and how many reads the shim faulted. A failed outcome also holds the shim's
    ``fault_offset``: the file offset of the last read it faulted.
    """
    env = dict(os.environ)
    env["LD_PRELOAD"] = str(shim)
    for key, value in fault.items():
        env["NPYFEED_FAULT_" + key.upper()] = str(value)
    env.setdefault("NPYFEED_FAULT_PAUSE_FILE", str(tmp_path / "paused"))
    report = tmp_path / "shim-report"
    env["NPYFEED_FAULT_REPORT"] = str(report)
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 0, f"child died ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout + proc.stderr
    result = json.loads(lines[-1][len("RESULT "):])
    shim_stats = dict(item.split("=") for item in report.read_text().split())
    if not result.get("ok", True):
        result["fault_offset"] = int(shim_stats["fault_offset"])
    return result, int(shim_stats["faults"])


def write_pair(tmp_path: Path, name: str, array: np.ndarray) -> tuple[str, str]:
    """The file under test ("victim-...") and a reference copy the shim leaves alone."""
    victim = tmp_path / f"victim-{name}.npy"
    ref = tmp_path / f"ref-{name}.npy"
    np.save(victim, array)
    np.save(ref, array)
    return str(victim), str(ref)


# Small: read whole in the header phase. Big: 40 MiB, split into chunks read by several threads.
SIZES = {"small": 1000, "big": 5 * 2**20}


def sample(size: str) -> np.ndarray:
    return np.arange(SIZES[size], dtype=np.float64) * 0.5


def load_args(victim: str, ref: str, mode: str, threads: int = 4) -> dict:
    return {"paths": [victim], "refs": [ref], "mode": mode, "threads": threads}


# ---------------------------------------------------------------------------------------------- (a) pread faults


# How many reads a load makes, and which of them fetch the header or the data, is the loader's business
# (a small file may be read whole in one read, a big one in a header read and chunks). So each fault is
# injected at the 1st, 2nd, ... read in turn, until a load makes no such read, and every load that met
# the fault must fail the same way.
MAX_NTH = 4


def each_read(shim, args, tmp_path, **fault):
    """Outcomes of loads with the fault at read 1, 2, ... (those that met it), up to MAX_NTH."""
    outcomes = []
    for nth in range(1, MAX_NTH + 1):
        r, faults = run_child(shim, args, tmp_path, nth=nth, **fault)
        if faults == 0:
            assert r == {"ok": True, "equal": [True]}, r  # fewer reads than that: a clean load
            break
        outcomes.append((nth, r))
    assert outcomes, "no read was faulted"
    return outcomes


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_eio_is_oserror_naming_the_file(shim, tmp_path, mode, size):
    victim, ref = write_pair(tmp_path, size, sample(size))
    for nth, r in each_read(shim, load_args(victim, ref, mode), tmp_path, path="victim", mode="eio"):
        assert not r["ok"] and r["oserror"], (nth, r)
        assert r["errno"] == errno.EIO and r["filename"] == victim, (nth, r)
        # The byte offset of the failed read, as an attribute and in the message.
        assert r["offset"] == r["fault_offset"] >= 0, (nth, r)
        assert f"at byte {r['offset']}:" in r["message"], (nth, r)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_eintr_is_retried(shim, tmp_path, mode, size):
    victim, ref = write_pair(tmp_path, size, sample(size))
    # Every pread of the file fails with EINTR once, and succeeds when retried.
    r, faults = run_child(shim, load_args(victim, ref, mode), tmp_path, path="victim", mode="eintr", count=0, every=2)
    assert faults > 0
    assert r == {"ok": True, "equal": [True]}


@pytest.mark.parametrize(("size", "short"), [("small", 0), ("small", 1000), ("small", 4096 + 7), ("big", 0),
                                             ("big", 4096 + 7)])
@pytest.mark.parametrize("mode", MODES)
def test_short_reads_still_give_the_right_data(shim, tmp_path, mode, size, short):
    victim, ref = write_pair(tmp_path, size, sample(size))
    # Every read returns at most `short` bytes (0: half of what was asked), header and data alike.
    r, faults = run_child(shim, load_args(victim, ref, mode), tmp_path, path="victim", mode="short", count=0,
                          short=short)
    assert faults > 0
    assert r == {"ok": True, "equal": [True]}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_reads_hitting_end_of_file_early_are_npy_format_error(shim, tmp_path, mode, size):
    # From the n-th read on, every read returns 0: as if the file was truncated after it was opened (its
    # size as fstat saw it no longer holds).
    victim, ref = write_pair(tmp_path, size, sample(size))
    for nth, r in each_read(shim, load_args(victim, ref, mode), tmp_path, path="victim", mode="eof", count=0):
        assert not r["ok"] and r["format_error"], (nth, r)
        assert victim in r["message"], (nth, r)


# ---------------------------------------------------------------------- (b) deleted or replaced during a load


@pytest.mark.parametrize("change", ["replace", "delete"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_file_deleted_or_replaced_while_loading(shim, tmp_path, mode, size, change):
    old = sample(size)
    victim, ref = write_pair(tmp_path, size, old)
    replacement = tmp_path / "replacement.npy"
    np.save(replacement, -old)
    args = load_args(victim, ref, mode, threads=2)
    args.update(change=change, replacement=str(replacement))
    # The file's first read pauses (with every later one) until the child's main thread has deleted or
    # replaced the file; then the load goes on.
    r, _ = run_child(shim, args, tmp_path, path="victim", mode="pause", nth=1, count=0)
    assert r.pop("changed", False), r
    if r["ok"]:
        assert r["equal"] == [True], "the load returned data that is not the old file's"
    else:
        # A descriptor opened after the change sees another file (ESTALE) or none (ENOENT).
        assert r["oserror"] and r["filename"] == victim, r
        assert r["errno"] == (errno.ESTALE if change == "replace" else errno.ENOENT), r
    if mode == "mmap":
        # The descriptor opened before the change maps the old file: its data, unchanged.
        assert r["ok"], r
    if mode != "mmap" and size == "big":
        # Chunks are opened after the change: never a mix of two files.
        assert not r["ok"], r


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_file_truncated_in_place_while_loading(shim, tmp_path, mode, size):
    # np.save over the file while it loads: the first read (the header's) pauses until the file has been
    # truncated to 1000 bytes. With mode="mmap" and populate=True the mapping, sized when the file was
    # opened, then has pages past the file's end: populating them is an NpyFormatError naming the file,
    # never SIGBUS (the child would die). The other modes read short (the same error), or open the file again
    # for a chunk and find it changed (FileChangedError: truncated, naming it).
    victim, ref = write_pair(tmp_path, size, sample(size))
    args = load_args(victim, ref, mode, threads=2)
    args.update(change="truncate", populate=True)
    r, _ = run_child(shim, args, tmp_path, path="victim", mode="pause", nth=1, count=0)
    assert r.pop("changed", False), r
    assert not r["ok"], r
    if r["format_error"]:
        assert r["path"] == victim and victim in r["message"], r
    else:
        assert mode != "mmap" and r["type"] == "FileChangedError" and r["errno"] == errno.ESTALE, r
        assert r["filename"] == victim and "truncated" in r["message"], r
    if mode == "mmap":
        assert "shrank" in r["message"], r


# ------------------------------------------------------------------------ (c) thousands of files, few fds

LOW_FD_CHILD = textwrap.dedent(
    """
    import json, os, resource, sys
    import numpy as np
    import npyfeed

    directory, count, mode, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    paths = [os.path.join(directory, f"many-{i}.npy") for i in range(count)]
    before = len(os.listdir("/proc/self/fd"))
    arrays = npyfeed.load_many(paths, mode=mode, threads=threads)
    bad = [i for i, a in enumerate(arrays) if not np.array_equal(a, np.arange(i % 50, dtype=np.int32) + i)]
    del arrays
    after = len(os.listdir("/proc/self/fd"))
    print("RESULT " + json.dumps({"bad": bad, "fds_before": before, "fds_after": after}))
    """
)


@pytest.fixture(scope="module")
def many_files(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("many")
    for i in range(3000):
        np.save(directory / f"many-{i}.npy", np.arange(i % 50, dtype=np.int32) + i)
    return directory


@pytest.mark.parametrize("mode", MODES)
def test_thousands_of_files_under_a_low_fd_limit(shim, many_files, tmp_path, mode):
    threads = 8
    report = tmp_path / "report"
    env = dict(os.environ, LD_PRELOAD=str(shim), NPYFEED_FAULT_PATH="many-", NPYFEED_FAULT_MODE="none",
               NPYFEED_FAULT_REPORT=str(report))
    proc = subprocess.run([sys.executable, "-c", LOW_FD_CHILD, str(many_files), "3000", mode, str(threads)], env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert result["bad"] == []
    assert result["fds_after"] == result["fds_before"]  # nothing leaked
    stats = dict(item.split("=") for item in report.read_text().split())
    # Each worker holds the file it reads; direct mode briefly holds a buffered and an O_DIRECT descriptor.
    most = threads * (2 if mode == "direct" else 1)
    assert 1 <= int(stats["max_open"]) <= most, stats


# ---------------------------------------------------------------- (d) one failure among many big reads


@pytest.fixture(scope="module")
def big_files(tmp_path_factory) -> list:
    # 12 MiB each: read whole by one worker each in the header phase (under 2 chunks of 8 MiB), so a
    # failing file fails while the other workers are in the middle of theirs.
    directory = tmp_path_factory.mktemp("big")
    paths = []
    for i in range(8):
        path = directory / f"big-{i}.npy"
        np.save(path, np.full(3 * 2**20, i, dtype=np.float32))
        paths.append(str(path))
    return paths


def proc_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fault", ["bad_header", "truncated"])
def test_one_bad_file_among_big_ones(big_files, tmp_path, mode, fault):
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros(3 * 2**20, dtype=np.float32))
    if fault == "bad_header":
        with open(bad, "r+b") as f:
            f.seek(20)
            f.write(b"@")  # inside the header dict
    else:
        os.truncate(bad, bad.stat().st_size - 4096)
    paths = big_files[:4] + [str(bad)] + big_files[4:]
    fds = proc_fds()
    with pytest.raises(npyfeed.NpyFormatError) as info:
        npyfeed.load_many(paths, mode=mode, threads=4)
    assert str(bad) in str(info.value)
    assert proc_fds() == fds
    # The pool is still healthy afterwards.
    arrays = npyfeed.load_many(big_files, mode=mode, threads=4)
    assert [int(a[-1]) for a in arrays] == list(range(8))


@pytest.mark.parametrize("mode", ["read", "direct"])
def test_eio_in_one_chunk_among_big_files(shim, tmp_path, mode):
    # Five 40 MiB files read in chunks by 4 threads; the 3rd data read of one of them fails.
    paths, refs = [], []
    for i in range(5):
        name = f"victim-{i}" if i == 2 else f"other-{i}"
        path, ref = tmp_path / f"{name}.npy", tmp_path / f"ref-{i}.npy"
        np.save(path, np.full(5 * 2**20, i, dtype=np.float64))
        ref.symlink_to(path)
        paths.append(str(path))
        refs.append(str(ref))
    r, faults = run_child(shim, {"paths": paths, "refs": refs, "mode": mode, "threads": 4}, tmp_path,
                          path="victim-", mode="eio", nth=3)
    assert faults == 1
    assert not r["ok"] and r["errno"] == errno.EIO and r["filename"] == paths[2], r
    # The error names the offset of the read that failed. The chunks' reads race, so which one is 3rd varies:
    # with O_DIRECT the first data chunk is read from offset 0 (the data at byte 128, aligned down).
    assert r["offset"] == r["fault_offset"] and f"at byte {r['offset']}" in r["message"], r
    assert r["fault_offset"] > 0 or mode == "direct", r


def test_errors_before_any_read_keep_errno_and_filename(tmp_path):
    # Opening fails before any read: the usual OSError subclasses, with no offset to report.
    missing = tmp_path / "missing.npy"
    for call in (npyfeed.read_header, npyfeed.load, lambda p: npyfeed.load_many([p], mode="direct")):
        with pytest.raises(FileNotFoundError) as info:
            call(missing)
        assert info.value.errno == errno.ENOENT and info.value.filename == str(missing)
        assert info.value.offset is None and "at byte" not in str(info.value)
    with pytest.raises(IsADirectoryError) as info:
        npyfeed.load(tmp_path)
    assert info.value.filename == str(tmp_path) and info.value.offset is None
