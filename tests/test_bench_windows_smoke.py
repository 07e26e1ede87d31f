"""Smoke run of bench/bench_windows.py at tiny size, so that the benchmark does not rot (not a measurement)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_windows.py"


def test_bench_windows_quick(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-tf", "--dir", str(tmp_path / "data"), "--json", str(out)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = [line for line in proc.stdout.splitlines() if line.startswith("contender")]
    assert header and "samples/s" in header[0] and "x limit" in header[0], proc.stdout
    assert "targets (issue 3" in proc.stdout
    result = json.loads(out.read_text())
    names = {(r["tag"], r["dtype"], r["cache"]) for r in result["results"]}
    # The numpy iterator ran warm and cold for both source dtypes, beside the numpy baselines.
    for dtype in ("float32", "float64"):
        assert {("e", dtype, "warm"), ("e", dtype, "cold"), ("d", dtype, "warm"), ("m", dtype, "cold")} <= names
