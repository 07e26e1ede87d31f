"""Window reads through io_uring against the forced fallback (``NPYFEED_IO_URING=0``), modes "read" and "direct".

Every batch equals numpy slicing of ``np.load``'ed arrays on both paths: float32 and float64 sources and
outputs, windows merged into runs and read alone, Fortran order (never queued), ``bounds="pad"``, files whose
data ends at an unaligned offset (the last window's O_DIRECT block is short). The variable is read when a file
is opened, so one process tests both. With the fallback forced, the pread loop's EINTR and short reads come
from the LD_PRELOAD shim of test_faults.py (io_uring's reads pass no libc call, so its short reads, EINTR and
EAGAIN are injected in C++: tests/cpp/test_read_queue.cpp).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_faults import HANG_GUARD_S, shim  # noqa: F401  (the fixture)
from windows_data import check_epoch, open_source, random_entries, write_dataset

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="io_uring and O_DIRECT are Linux")

PATHS = ("io_uring", "fallback")


def _dataset(tmp_path, dtype, fortran=False):
    rng = np.random.default_rng(7)
    # Row counts that leave each file's data ending inside a block; 97 x 8 bytes of float64 make windows of odd size.
    # 40 keys: a batch's keys span several work items and waves of queued reads.
    factors = {f"k{k}": rng.standard_normal((300 + 37 * (k % 5), 97)).astype(dtype) for k in range(40)}
    labels = {key: rng.standard_normal((len(f), 3)).astype(dtype) for key, f in factors.items()}
    entries = random_entries(rng, factors, labels, window=20, per_key=6)
    return write_dataset(tmp_path, factors, labels, entries, window=20, fortran=fortran)


@pytest.fixture(params=PATHS)
def io_path(request, monkeypatch):
    monkeypatch.setenv("NPYFEED_IO_URING", "1" if request.param == "io_uring" else "0")
    return request.param


@pytest.mark.parametrize("out", ["float32", "float64"])
@pytest.mark.parametrize("dtype", ["<f4", ">f8"])
@pytest.mark.parametrize("mode", ["read", "direct"])
def test_batches_equal_numpy_on_both_paths(tmp_path, io_path, mode, dtype, out):
    ds = _dataset(tmp_path, dtype)
    src = open_source(ds, mode, dtype=out)
    for batch_size in (1, 7, 160):
        check_epoch(src, ds, out, batch_size, shuffle=True, seed=batch_size)
    check_epoch(src, ds, out, 16)  # in index order: neighbouring windows merge into runs


@pytest.mark.parametrize("mode", ["read", "direct"])
def test_fortran_order_and_pad_on_both_paths(tmp_path, io_path, mode):
    ds = _dataset(tmp_path / "f", "<f4", fortran=True)
    check_epoch(open_source(ds, mode), ds, "float32", 32, shuffle=True, seed=1)
    ds = _dataset(tmp_path / "p", "<f4")
    ds.entries = list(ds.entries) + [(5, 2, "k0"), (10**6, 2, "k1")]  # before the array, after it
    ds = write_dataset(tmp_path / "p2", ds.factors, ds.labels, ds.entries, ds.window)
    check_epoch(open_source(ds, mode, bounds="pad"), ds, "float32", 32, shuffle=True, seed=2)


# Window gathers with the fallback forced, under the shim: every pread of the factor files fails with EINTR
# once, or returns short; batches still equal numpy's.
CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import npyfeed

    args = json.loads(sys.argv[1])
    src = npyfeed.WindowSource(args["index"], args["factor_dir"], args["label_dir"], args["window"],
                               mode=args["mode"], threads=2)
    x, y = src.get(np.arange(len(src)))
    factors = {}
    ok = True
    for i, line in enumerate(open(args["index"]).read().split()):
        fi, li, key = line.split(",")
        fi, li = int(fi), int(li)
        f = factors.setdefault(key, np.load(f"{args['factor_dir']}/{key}.npy"))
        ok = ok and np.array_equal(x[i], f[fi - args["window"] + 1:fi + 1].astype(np.float32))
    print("RESULT " + json.dumps({"ok": bool(ok)}))
    """
)


@pytest.mark.parametrize("fault", [{"mode": "eintr", "every": 2}, {"mode": "short", "short": 0},
                                   {"mode": "short", "short": 4096 + 7}])
@pytest.mark.parametrize("mode", ["read", "direct"])
def test_fallback_survives_eintr_and_short_reads(shim, tmp_path, mode, fault):  # noqa: F811
    import os

    ds = _dataset(tmp_path, "<f4")
    env = dict(os.environ, LD_PRELOAD=str(shim), NPYFEED_IO_URING="0", NPYFEED_FAULT_PATH="factor",
               NPYFEED_FAULT_COUNT="0", NPYFEED_FAULT_REPORT=str(tmp_path / "report"))
    env.update({"NPYFEED_FAULT_" + k.upper(): str(v) for k, v in fault.items()})
    args = {"index": str(ds.index), "factor_dir": str(ds.factor_dir), "label_dir": str(ds.label_dir),
            "window": ds.window, "mode": mode}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT " + json.dumps({"ok": True}) in proc.stdout, proc.stdout + proc.stderr
    faults = int(dict(item.split("=") for item in (tmp_path / "report").read_text().split())["faults"])
    assert faults > 0
