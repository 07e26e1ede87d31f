"""Smoke run of bench/bench_windows.py's gather option rows (o) at tiny size (not a measurement)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_windows.py"


def test_bench_option_rows_quick(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-tf", "--only", "e-mmap,o", "--dtypes", "float32",
         "--dir", str(tmp_path / "data"), "--json", str(out)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gather options (o)" in proc.stdout
    rows = json.loads(out.read_text())["gather_options"]
    # One row per option, each against plain (e) mmap of the same run.
    assert {r["option"].split("=")[0] for r in rows} >= {"features", "label_columns", "nan", "normalize"}
    assert all(r["x plain"].endswith("x") and r["cpu x plain"].endswith("x") for r in rows)
    assert all(r["status"] in ("met", "MISSED") and r["status (cpu)"] in ("met", "MISSED") for r in rows)
