"""Files truncated in place under a live mapping (issue 8, item 3): the SIGBUS guard (csrc fault_guard).

``np.save`` over a file that a training job has mapped truncates it in place; touching a lost page raises
SIGBUS. Each scenario runs in a subprocess (a failure kills it) that prints its outcome as JSON: a gather
from a shrunk file (``get``, the ``batches`` iterator, ``npyfeed.tf.dataset``) raises an ``NpyFormatError``
naming the file, other keys keep working and nothing leaks; a fault outside npyfeed's copy loops still
kills the process with SIGBUS (with or without faulthandler). Also the safe update recipe (rename a new
file over the old one), in process. Truncation between a load's header read and its populate is in
test_faults.py (it needs the fault shim to stop the load there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import npyfeed
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGBUS on truncated mappings is Linux")

HANG_GUARD_S = 300  # a subprocess still running after this is a hang, not a slow machine
ROWS, COLS, WINDOW = 50_000, 4, 3
KEYS = ("a", "b")
SAMPLES_PER_KEY = 2000  # feature rows 10, 30, ..: the windows span the whole file

# The data set: key k's factor row r holds r * 10 + column (+ 1e6 for key "b"); label row r holds r.
SETUP = textwrap.dedent(
    """
    import gc, json, os, sys
    import numpy as np
    import npyfeed

    args = json.loads(sys.argv[1])
    d = args["dir"]

    def source(**kw):
        return npyfeed.WindowSource(os.path.join(d, "index.txt"), os.path.join(d, "factors"),
                                    os.path.join(d, "labels"), args["window"], **kw)

    def error_of(fn):
        try:
            fn()
        except Exception as e:
            return {"type": type(e).__name__, "format_error": isinstance(e, npyfeed.NpyFormatError),
                    "path": getattr(e, "path", None), "message": str(e)}
        return None

    def fds():
        return len(os.listdir("/proc/self/fd"))

    def mappings(path):
        with open("/proc/self/maps") as f:
            return sum(path in line for line in f)

    def rss_anon_kb():
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("RssAnon")).split()[1])

    def report(**out):
        print("RESULT " + json.dumps(out), flush=True)
    """
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("windows")
    (d / "factors").mkdir()
    (d / "labels").mkdir()
    lines = []
    for k, key in enumerate(KEYS):
        factor = np.arange(ROWS)[:, None] * 10.0 + np.arange(COLS)[None, :] + k * 1e6
        np.save(d / "factors" / f"{key}.npy", factor.astype(np.float32))
        np.save(d / "labels" / f"{key}.npy", np.arange(ROWS, dtype=np.float32))
        rows = np.linspace(WINDOW, ROWS - 1, SAMPLES_PER_KEY).astype(int)
        lines += [f"{r},{r},{key}" for r in rows]
    (d / "index.txt").write_text("\n".join(lines) + "\n")
    return d


def fresh_copy(dataset, tmp_path):
    """A private copy of the data set (the child truncates its files)."""
    d = tmp_path / "data"
    for sub in ("factors", "labels"):
        (d / sub).mkdir(parents=True)
        for key in KEYS:
            (d / sub / f"{key}.npy").write_bytes((dataset / sub / f"{key}.npy").read_bytes())
    (d / "index.txt").write_text((dataset / "index.txt").read_text())
    return d


def run_child(body: str, args: dict, *, faulthandler: bool = False, expect_rc: int = 0) -> dict:
    cmd = [sys.executable]
    if faulthandler:
        cmd += ["-X", "faulthandler"]
    cmd += ["-c", SETUP + textwrap.dedent(body), json.dumps(dict(args, window=WINDOW))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == expect_rc, f"child ended with {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-5000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(lines[-1][len("RESULT "):]) if lines else {}
    result["stderr"] = proc.stderr
    return result


def assert_names(error: dict, path) -> None:
    assert error is not None, "no exception: the gather read lost pages"
    assert error["type"] == "NpyFormatError" and error["format_error"], error
    assert error["path"] == str(path), error
    assert str(path) in error["message"] and "shrank" in error["message"], error



# Checked in the child: the first `n` samples of key "b" (ids SAMPLES_PER_KEY..) gathered right.
CHECK_KEY_B = """
    def key_b_ok(src):
        ids = np.arange(len(src) // 2, len(src))
        x, y = src.get(ids)
        rows = y.astype(np.int64)  # label row == feature row
        want = (rows[:, None, None] - np.arange(args["window"] - 1, -1, -1)[None, :, None]) * 10.0 \\
            + np.arange(x.shape[2])[None, None, :] + 1e6
        return bool(np.array_equal(x, want.astype(np.float32)))
"""


@pytest.mark.parametrize("which", ["factors", "labels"])
@pytest.mark.parametrize("faulthandler", [False, True], ids=["plain", "faulthandler"])
def test_get_from_a_truncated_file_names_it(dataset, tmp_path, which, faulthandler):
    d = fresh_copy(dataset, tmp_path)
    victim = d / which / "a.npy"
    body = CHECK_KEY_B + """
    src = source()
    before_ok = key_b_ok(src)
    os.truncate(args["victim"], 1000)
    first = error_of(lambda: src.get(np.arange(len(src) // 2)))
    again = error_of(lambda: src.get(np.arange(len(src) // 2)))  # the same key fails the same way again
    report(before_ok=before_ok, first=first, again=again, after_ok=key_b_ok(src))
    """
    r = run_child(body, {"dir": str(d), "victim": str(victim)}, faulthandler=faulthandler)
    assert r["before_ok"] and r["after_ok"], r
    assert_names(r["first"], victim)
    assert_names(r["again"], victim)
    assert "Fatal Python error" not in r["stderr"]


def test_batches_from_a_truncated_file_name_it(dataset, tmp_path):
    d = fresh_copy(dataset, tmp_path)
    victim = d / "factors" / "a.npy"
    body = CHECK_KEY_B + """
    src = source()
    it = src.batches(256, shuffle=True, seed=1)
    first = next(it)[0].copy()
    os.truncate(args["victim"], 1000)
    seen, error = 1, None
    try:
        for x, y in it:
            seen += 1
    except Exception as e:
        error = {"type": type(e).__name__, "format_error": isinstance(e, npyfeed.NpyFormatError),
                 "path": getattr(e, "path", None), "message": str(e)}
    it.close()
    # The first batch (owned memory) is intact; a new epoch over key "b" alone still works.
    report(error=error, seen=seen, first_finite=bool(np.isfinite(first).all()), after_ok=key_b_ok(src))
    """
    r = run_child(body, {"dir": str(d), "victim": str(victim)})
    assert_names(r["error"], victim)
    assert r["first_finite"] and r["after_ok"], r


def test_tf_dataset_from_a_truncated_file_names_it(dataset, tmp_path):
    pytest.importorskip("tensorflow")
    d = fresh_copy(dataset, tmp_path)
    victim = d / "factors" / "a.npy"
    body = CHECK_KEY_B + """
    import tensorflow as tf
    import npyfeed.tf
    src = source()
    ds = npyfeed.tf.dataset(src, 256, prefetch=1)
    it = iter(ds)
    next(it)  # past the epoch's start, whose check would refuse the truncated file before any gather read it
    os.truncate(args["victim"], 1000)
    error = None
    try:
        for x, y in it:
            pass
    except Exception as e:
        error = {"type": type(e).__name__, "message": str(e)}
    report(error=error, after_ok=key_b_ok(src))
    """
    r = run_child(body, {"dir": str(d), "victim": str(victim)})
    assert r["error"] is not None, "no exception: the gather read lost pages"
    assert str(victim) in r["error"]["message"] and "NpyFormatError" in r["error"]["message"], r["error"]
    assert "shrank" in r["error"]["message"]
    assert r["after_ok"]


def test_failed_gathers_leak_nothing(dataset, tmp_path):
    d = fresh_copy(dataset, tmp_path)
    victim = d / "factors" / "a.npy"
    body = """
    src = source(threads=2)
    ids = np.arange(len(src) // 2)
    for _ in range(20):  # warm up: the pool, batch buffers, numpy
        src.get(ids)
    os.truncate(args["victim"], 1000)
    error_of(lambda: src.get(ids))
    fds0, maps0, rss0 = fds(), mappings(args["victim"]), rss_anon_kb()
    errors = sum(error_of(lambda: src.get(ids)) is not None for _ in range(300))
    errors += error_of(lambda: list(src.batches(512))) is not None  # refused at the epoch's start
    fds1, maps1, rss1 = fds(), mappings(args["victim"]), rss_anon_kb()
    del src
    gc.collect()
    report(errors=errors, fds=[fds0, fds1, fds()], maps=[maps0, maps1, mappings(args["victim"])],
           rss_growth_kb=rss1 - rss0)
    """
    r = run_child(body, {"dir": str(d), "victim": str(victim)})
    assert r["errors"] == 301
    assert r["fds"][0] == r["fds"][1] >= r["fds"][2]
    assert r["maps"] == [1, 1, 0]  # the mapping is kept while the source lives, and released with it
    # 300 failed batches of 2000 windows: a leaked batch each would be ~300 * 2000 * 48 B = 29 MB.
    assert r["rss_growth_kb"] < 8 * 1024, r


FOREIGN_FAULT = """
    src = source()
    src.get(np.arange(10))  # npyfeed's handler is installed by now
    if args["faulthandler_after"]:
        import faulthandler
        faulthandler.enable()
    array = npyfeed.load(os.path.join(d, "factors", "b.npy"), mode="mmap")
    os.truncate(os.path.join(d, "factors", "b.npy"), 1000)
    print("touching", flush=True)
    print(float(array.sum()))  # numpy's loop, not npyfeed's: np.memmap's limitation
    report(survived=True)
"""


@pytest.mark.parametrize("faulthandler", ["off", "before", "after"])
def test_a_fault_outside_npyfeed_still_kills_with_sigbus(dataset, tmp_path, faulthandler):
    d = fresh_copy(dataset, tmp_path)
    r = run_child(FOREIGN_FAULT, {"dir": str(d), "faulthandler_after": faulthandler == "after"},
                  faulthandler=faulthandler == "before", expect_rc=-signal.SIGBUS)
    assert r == {"stderr": r["stderr"]}  # no RESULT line: it died at the touch
    if faulthandler != "off":
        assert "Fatal Python error: Bus error" in r["stderr"], r["stderr"]


def test_kill_sigbus_is_not_swallowed(dataset, tmp_path):
    d = fresh_copy(dataset, tmp_path)
    body = """
    src = source()
    src.get(np.arange(10))
    os.kill(os.getpid(), __import__("signal").SIGBUS)
    report(survived=True)
    """
    run_child(body, {"dir": str(d)}, expect_rc=-signal.SIGBUS)


def test_faulthandler_enabled_after_npyfeed_still_recovers(dataset, tmp_path):
    # faulthandler's handler then runs first: it prints a traceback and passes the signal on to npyfeed's,
    # which recovers (the README says so). The process lives on.
    d = fresh_copy(dataset, tmp_path)
    victim = d / "factors" / "a.npy"
    body = CHECK_KEY_B + """
    src = source()
    src.get(np.arange(10))
    import faulthandler
    faulthandler.enable()
    os.truncate(args["victim"], 1000)
    report(error=error_of(lambda: src.get(np.arange(len(src) // 2))), after_ok=key_b_ok(src))
    """
    r = run_child(body, {"dir": str(d), "victim": str(victim)})
    assert_names(r["error"], victim)
    assert r["after_ok"]


@pytest.mark.parametrize("mode", ["mmap", "read", "direct"])
def test_rename_over_a_live_source_never_serves_the_new_data(dataset, tmp_path, mode):
    # Write the new file beside the old one, then os.rename over it: a live source's reads keep the file it
    # opened (mapping or descriptor), its next epoch refuses the new one, and a new source reads the new file.
    d = fresh_copy(dataset, tmp_path)
    src = npyfeed.WindowSource(d / "index.txt", d / "factors", d / "labels", WINDOW, mode=mode)
    ids = np.arange(len(src))
    x0, y0 = src.get(ids)
    for key in KEYS:
        new = d / "factors" / f"{key}.new.npy"
        np.save(new, np.full((ROWS, COLS), -1.0, dtype=np.float32))
        os.rename(new, d / "factors" / f"{key}.npy")
    x1, y1 = src.get(ids)
    np.testing.assert_array_equal(x1, x0)
    np.testing.assert_array_equal(y1, y0)
    with pytest.raises(npyfeed.FileChangedError, match="replaced by another file"):
        src.batches(1000)
    fresh = npyfeed.WindowSource(d / "index.txt", d / "factors", d / "labels", WINDOW, mode=mode)
    assert (fresh.get(ids)[0] == -1.0).all()
