"""Smoke runs of the benchmarks at tiny size, so that they do not rot. Not a measurement.

bench_windows.py has its own smoke test (test_bench_windows_smoke.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def run_bench(script: str, tmp_path: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH_DIR / script), "--quick", "--dir", str(tmp_path / "data"), *extra],
        capture_output=True, text=True, timeout=timeout)


def _this_install() -> str:
    """The folder this npyfeed is installed in: as a bench's --baseline it imports the same npyfeed."""
    import npyfeed

    return str(Path(npyfeed.__file__).resolve().parents[1])


def test_bench_load_quick(tmp_path):
    out = tmp_path / "load.json"
    proc = run_bench("bench_load.py", tmp_path, "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = [line for line in proc.stdout.splitlines() if line.startswith("contender")]
    assert header and "GB/s" in header[0] and "x np.load loop" in header[0] and "x limit" in header[0], proc.stdout
    assert "targets (issue 2" in proc.stdout
    result = json.loads(out.read_text())
    names = {(r["name"], r["cache"]) for r in result["results"]}
    for mode in ("read", "direct", "mmap open", "mmap populate"):
        assert {(f"npyfeed {mode}", "warm"), (f"npyfeed {mode}", "cold")} <= names
    assert ("np.load loop", "cold") in names
    assert {"memcpy_1", "odirect_seq"} <= set(result["limits_gbps"])
    assert result["max_residency_after_evict"] < 0.5  # eviction worked: the cold rows were cold


def test_bench_node_quick(tmp_path):
    out = tmp_path / "node.json"
    proc = run_bench("bench_node.py", tmp_path, "--single", "--users", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 processes started together" in proc.stdout and "targets" in proc.stdout
    result = json.loads(out.read_text())
    for run in ("npyfeed_single", "npyfeed", "users"):
        for r in result["runs"][run]["results"]:
            assert "error" not in r, r
            assert r["private"] > 0 and r["pss"] > 0 and r["samples_per_s"] > 0
    # the index was read whole: one sample per row from row W-1 on, for every key
    assert len(result["runs"]["npyfeed"]["results"]) == 2
    assert result["runs"]["npyfeed"]["results"][0]["samples"] == 6 * (400 - 99)


def test_bench_npz_quick(tmp_path):
    out = tmp_path / "npz.json"
    proc = run_bench("bench_npz.py", tmp_path, "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MB on disk" in proc.stdout and "x np.load npy" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    seen = {(r["format"], r["loader"], r["cache"]) for r in result["results"]}
    for fmt in ("npy", "npz stored", "npz deflated"):
        for cache in ("warm", "cold"):
            assert {(fmt, "np.load loop", cache), (fmt, "npyfeed read", cache)} <= seen
    disk = {r["format"]: r["disk_bytes"] for r in result["results"]}
    assert disk["npz deflated"] < disk["npy"]  # the generated factors do compress


def test_bench_stream_quick(tmp_path):
    out = tmp_path / "stream.json"
    # Two rounds, with this install as the "baseline" too.
    proc = run_bench("bench_stream.py", tmp_path, "--json", str(out), "--rounds", "2", "--baseline", _this_install(),
                     timeout=300)  # 12 child processes
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cold blocks direct" in proc.stdout and "targets (issue 10" in proc.stdout
    assert "x warm median" in proc.stdout and "load average per round" in proc.stdout
    result = json.loads(out.read_text())
    for name in ("warm global mmap", "cold global mmap", "cold global read", "cold blocks direct",
                 "cold blocks direct (baseline)"):
        r = result["results"][name]
        assert "error" not in r, r
        assert r["samples"] == r["epoch_samples"] > 0  # the whole (tiny) epoch
        assert r["peak_private"] > 0 and r["first_batch_s"] is not None
    assert len(result["rounds"]) == 2 and "cold global mmap" not in result["rounds"][1]["results"]
    assert len(result["ratios"]["cold blocks direct"]) == 2
    assert result["results"]["cold blocks direct"]["stats"]["blocks_read"] > 0


def test_bench_shuffle_quality_quick():
    proc = subprocess.run([sys.executable, str(BENCH_DIR / "bench_shuffle_quality.py"), "--quick"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line.split("  ")[0]: line for line in proc.stdout.splitlines()}
    assert "global shuffle" in lines and any(k.startswith("blocks, 1 keys/block") for k in lines), proc.stdout


def test_bench_handoff_quick(tmp_path):
    pytest.importorskip("tensorflow")
    out = tmp_path / "handoff.json"
    proc = run_bench("bench_handoff.py", tmp_path, "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "x numpy median" in proc.stdout and "x cap" in proc.stdout, proc.stdout
    results = json.loads(out.read_text())
    rows = results["rows"]
    for row in ("numpy", "eager", "tf.function", "fit", "fit steps_per_execution=32", "floor eager", "floor fit",
                "numpy nice", "tf.function nice", "fit nice", "fallback eager", "fallback tf.function"):
        got = rows[f"this build: {row}"]
        assert len(got["rates"]) == 1 and got["rates"][0] > 0, got
    assert rows["this build: numpy"]["ratios"] == [1.0]
    assert 0 < rows["this build: eager"]["cap"] <= 1  # from the floor's CPU per batch and the gather's
    # The "nice" rows ran on workers at --nice (default 5), the others on workers at the caller's niceness.
    measured = results["rounds"]["this build"][0]
    inherited = os.getpriority(os.PRIO_PROCESS, 0)
    assert measured["numpy"]["worker_nice"] == [inherited], measured["numpy"]
    assert measured["fit"]["worker_nice"] == [inherited], measured["fit"]
    assert all(0 <= measured[row]["main_cpu_wait"] <= 1 for row in ("numpy", "fit", "fit nice")), measured
    for row in ("numpy nice", "tf.function nice", "fit nice", "fit steps_per_execution=32 nice"):
        assert measured[row]["worker_nice"] == [5], measured[row]


def test_bench_gpu_quick_on_the_cpu(tmp_path):
    pytest.importorskip("tensorflow")
    out = tmp_path / "gpu.json"
    proc = run_bench("bench_gpu.py", tmp_path, "--device", "/cpu:0", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "overlap npyfeed (feed + compute - both)" in proc.stdout and "overlap ready" in proc.stdout
    result = json.loads(out.read_text())
    assert result["bench"] == "bench_gpu"  # --framework tf, the default
    assert result["device"] == "/cpu:0" and result["matmuls"] >= 1
    seconds = result["seconds_per_step"]
    assert set(seconds) == {"numpy", "h2d", "compute", "feed_npyfeed", "feed_ready", "both_npyfeed", "both_ready",
                            "feed_device", "both_device", "feed_streamed", "both_streamed"}
    assert all(v > 0 for v in seconds.values()), result
    sent = result["host_to_device_bytes_per_step"]
    batch = result["config"]["batch"]
    assert sent["device"] == 4 * 8 * batch < sent["npyfeed"]  # gather="device" sends start rows, not windows
    # Streamed: the start rows and, over an epoch, every block once (the tiny data set: a few batches' worth).
    assert 4 * 8 * batch < sent["streamed"] < sent["npyfeed"]


def test_bench_gpu_through_torch_quick_on_the_cpu(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "gpu_torch.json"
    proc = run_bench("bench_gpu.py", tmp_path, "--framework", "torch", "--device", "cpu", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "batches checked against the host's" in proc.stdout and "overlap pinned" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    assert result["bench"] == "bench_gpu_torch"  # the schema of bench/results/gpu_torch.json
    assert result["device"] == "cpu" and result["matmuls"] >= 1
    assert result["checked_batches"] == 12  # the first 3 batches of every feed but the ready one
    seconds = result["seconds_per_step"]
    feeds = ("pageable", "staged", "pinned", "device", "ready")
    assert set(seconds) == {"numpy", "h2d_pageable", "h2d_pinned", "compute", *(f"feed_{f}" for f in feeds),
                            *(f"both_{f}" for f in feeds)}
    assert all(v > 0 for v in seconds.values()), result
    sent = result["host_to_device_bytes_per_step"]
    assert sent["device"] == 4 * 8 * result["config"]["batch"] < sent["pageable"]


def test_bench_open_quick(tmp_path):
    out = tmp_path / "open.json"
    proc = run_bench("bench_open.py", tmp_path, "--baseline", _this_install(), "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "speed-up per round" in proc.stdout and "limit ms" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    for mode in ("mmap", "read", "direct"):
        for cache in ("warm", "cold"):
            for build in ("this", "baseline"):
                assert len(result["seconds"][f"{mode} {cache} {build}"]) == 1
    assert result["max_residency_after_evict"] < 0.5  # eviction worked: the cold opens were cold


def test_bench_ab_quick(tmp_path):
    # Both sides the same install: every path runs in fresh processes importing it, and the table has a row each.
    out = tmp_path / "ab.json"
    here = _this_install()
    proc = run_bench("bench_ab.py", tmp_path, "--a", here, "--b", here, "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(out.read_text())["summary"]
    paths = {"float32", "float64", "options", "blocks", "take"} | ({"tf"} if _have("tensorflow") else set())
    assert set(summary) == paths, summary
    for path, s in summary.items():
        assert s["a_median"] > 0 and s["b_median"] > 0 and len(s["ratios"]) == 2, (path, s)


def test_bench_ab_streaming_quick(tmp_path):
    """A settings A/B of the installed npyfeed (no --a): each side's children ran with its NPYFEED_STREAMING."""
    out = tmp_path / "streaming.json"
    proc = run_bench("bench_ab.py", tmp_path, "--env-a", "NPYFEED_STREAMING=0", "--env-b", "NPYFEED_STREAMING=1",
                     "--paths", "float32,consumed", "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "copy limit: memcpy by 2 threads" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    assert result["installs"] == {"A": _this_install(), "B": _this_install()}
    assert set(result["summary"]) == {"float32", "consumed"}, result["summary"]
    assert result["copy_limit"]["samples_per_s"] > 0 and len(result["copy_limit"]["rounds"]) == 2
    for path, s in result["summary"].items():
        assert s["a_median"] > 0 and s["b_median"] > 0 and len(s["ratios"]) == 2, (path, s)
        assert s["x_copy_limit"]["B"] == pytest.approx(s["b_median"] / result["copy_limit"]["samples_per_s"])
        for side, value in (("A", "0"), ("B", "1")):
            assert [r["env"].get("NPYFEED_STREAMING") for r in result["runs"][f"{path}/{side}"]] == [value] * 2


def test_bench_ab_first_pass_quick(tmp_path):
    """The populate A/B: whole first and second passes over a fresh mapped source, faults and CPU of each."""
    out = tmp_path / "first_pass.json"
    proc = run_bench("bench_ab.py", tmp_path, "--env-a", "NPYFEED_POPULATE=0", "--env-b", "NPYFEED_POPULATE=1",
                     "--paths", "first_pass", "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "first_pass B (B): first/second" in proc.stdout and "target >= 0.9" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    s = result["summary"]["first_pass"]
    assert s["a_median"] > 0 and s["b_median"] > 0 and len(s["ratios"]) == 2, s
    for side, value in (("A", "0"), ("B", "1")):
        assert s["passes"][side]["first_over_second"] > 0 and len(s["passes"][side]["first_over_second_runs"]) == 2
        for r in result["runs"][f"first_pass/{side}"]:
            assert r["env"]["NPYFEED_POPULATE"] == value, r["env"]
            first, second = r["passes"]
            assert first["samples"] == second["samples"] == 6 * (600 - 99)  # whole passes of the --quick data
            assert first["minor_faults"] > 0 and first["cpu_us_per_sample"] > 0 and second["samples_per_s"] > 0
            assert r["samples_per_s"] == first["samples_per_s"]


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
