"""Smoke run of bench/bench_windows.py at tiny size, so that the benchmark does not rot (not a measurement)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    # Cold rows that read through the page cache are set beside the page cache's own random-read limit too;
    # "direct" (O_DIRECT) and the warm rows are not.
    for r in result["results"]:
        through_cache = r["cache"] == "cold" and "direct" not in r["name"]
        assert (r["page_cache_limit"] is not None) == through_cache, r
        if through_cache:
            assert r["page_cache_limit"].startswith("buffered rand read qd")
            assert r["vs_page_cache_limit"] == pytest.approx(r["best"] / r["page_cache_limit_samples_per_s"])
    assert any(t["target"].startswith("(e) mmap cold vs buffered rand read") for t in result["targets"])
    # Bytes read from storage per sample, one figure a round: a cold row (its files evicted) reads its windows.
    for r in result["results"]:
        assert len(r["read_bytes_per_sample"]) == len(r["samples_per_s"]), r
        if r["cache"] == "cold" and r["residency_before"] <= 0.02:
            assert min(r["read_bytes_per_sample"]) > 0, r


def test_ratios_between_contenders_are_taken_within_each_round(tmp_path):
    """x (e) is the median over the rounds of the ratio within each round, not the best rounds' ratio."""
    out = tmp_path / "result.json"
    tiny = ["--files", "6", "--rows", "200", "--cols", "32", "--batch", "16", "--batches", "3", "--cold-batches", "2",
            "--python-batches", "2", "--users-batches", "1", "--random-reads", "64", "--dtypes", "float32"]
    proc = subprocess.run([sys.executable, str(BENCH), *tiny, "--repeats", "3", "--no-tf", "--no-options",
                           "--dir", str(tmp_path / "data"), "--json", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    plain = {r["cache"]: r["samples_per_s"] for r in results if r["name"] == "(e) npyfeed batches mmap"}
    for r in results:
        assert len(r["samples_per_s"]) == 3
        within = sorted(a / b for a, b in zip(r["samples_per_s"], plain[r["cache"]]))
        assert r["vs_e_mmap"] == pytest.approx(within[1]), r


def test_the_adapters_are_held_to_their_target(tmp_path):
    """An adapter's row (--only ...,torch) is set against (e) mmap in the targets, as docs/frameworks.md states."""
    pytest.importorskip("torch")
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--no-tf", "--no-options", "--dtypes", "float32",
                           "--only", "e-mmap,torch", "--dir", str(tmp_path / "data"), "--json", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    torch_row = next(r for r in result["results"] if r["tag"] == "torch")
    target = next(t for t in result["targets"] if t["target"].startswith("npyfeed.torch.WindowDataset"))
    assert target["needed"] == ">= 0.900x" and target["value"] == pytest.approx(torch_row["vs_e_mmap"])
    assert target["status"] == ("met" if torch_row["vs_e_mmap"] >= 0.9 else "MISSED")
